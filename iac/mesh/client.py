"""The discovery client of one node: :class:`MeshClient`.

A client publishes its node's record and refreshes it before it expires, resolves aliases and
capabilities (filling the node's peer book), re-resolves and retries once after a failed dial,
delegates by capability with a timeout and a fallback, and rotates or revokes its key. What it
learns is verified and kept in a :class:`~iac.KeyBook`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias

from iac.errors import (
    ConfigError,
    DeliveryError,
    IacError,
    MessageRejected,
    RemoteError,
    RequestTimeout,
    TransportError,
)
from iac.mesh.dispatch import RegisterKeyDispatcher
from iac.mesh.keybook import KeyBook
from iac.mesh.registries import RegistryAddr, ask_registries
from iac.mesh.statements import announce, note_statement
from iac.mesh.wire import (
    OP_STATUS,
    entry_from_json,
    lookup_request,
    publish_request,
    revoke_request,
    rotate_request,
)
from iac.node.config import PeerEvent
from iac.node.node import Node
from iac.node.types import Reply, Sent
from iac.protocol.clock import Clock
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRecord,
    decode_rotation,
    is_address,
    is_alias,
    is_private_address,
    sign_record,
    sign_revocation,
    sign_rotation,
)
from iac.wire.enums import MessageType
from iac.wire.identity import Identity, check_agent_id, is_agent_id
from iac.wire.private import write_private
from iac.wire.task import TaskState

log = logging.getLogger("iac.mesh")

#: ``policy(capability, candidates) -> candidates`` limits and orders who may get a delegated task.
DelegationPolicy: TypeAlias = Callable[[str, list[str]], Sequence[str]]
Sleep: TypeAlias = Callable[[float], Awaitable[Any]]


def _nothing() -> None:
    pass


def _no_retry(exc: BaseException) -> bool:
    return not isinstance(exc, TransportError) or isinstance(exc, RequestTimeout | DeliveryError)


class MeshClient:
    """Discovery for one node: publish, refresh, resolve, retry, delegate by capability, rotate.

    ``registry_id``/``registry_addrs`` (or ``registries``) name the registries, tried in order.
    ``bootstrap`` maps AgentIds to addresses known without a registry. With ``publish`` the
    node's record (``aliases``, ``capabilities``, ``addresses`` — default the node's — a
    lifetime of ``ttl`` seconds and the optional ``next_key_digest``) is published at
    :meth:`start` and again when ``refresh`` (a fraction of ``ttl``) has passed.

    ``seq`` is the clock in µs (at least one above the last), or, with ``seq_file``, one above
    the counter persisted there, whichever is higher. ``clock`` decides expiry and refresh
    times (default the node's); ``sleep`` is how the refresh task waits (tests inject one).
    """

    def __init__(
        self,
        node: Node,
        registry_id: str | None = None,
        registry_addrs: Sequence[str] = (),
        *,
        registries: Sequence[RegistryAddr] = (),
        bootstrap: Mapping[str, Sequence[str]] | None = None,
        aliases: Sequence[str] = (),
        capabilities: Sequence[str] = (),
        addresses: Sequence[str] | None = None,
        ttl: float = 600.0,
        refresh: float = 0.5,
        retry_interval: float = 5.0,
        next_key_digest: str | None = None,
        publish: bool = True,
        timeout: float = 5.0,
        seq_file: str | os.PathLike[str] | None = None,
        book: KeyBook | None = None,
        clock: Clock | None = None,
        sleep: Sleep = asyncio.sleep,
        delegation_policy: DelegationPolicy | None = None,
    ) -> None:
        regs = list(registries)
        if registry_id is not None:
            regs.insert(0, RegistryAddr(registry_id, tuple(registry_addrs)))
        if ttl <= 0 or not 0 < refresh < 1 or retry_interval <= 0 or timeout <= 0:
            raise ConfigError("need ttl > 0, 0 < refresh < 1, retry_interval > 0 and timeout > 0")
        self.node = node
        self.registries = regs
        self.bootstrap = {check_agent_id(k): list(v) for k, v in (bootstrap or {}).items()}
        self.aliases = tuple(aliases)
        self.capabilities = tuple(capabilities)
        self._addresses = None if addresses is None else tuple(addresses)
        self.ttl = ttl
        self.refresh = refresh
        self.retry_interval = retry_interval
        self.next_key_digest = next_key_digest
        self.publishing = publish
        self.timeout = timeout
        self.seq_file = Path(seq_file) if seq_file is not None else None
        self.book = book if book is not None else KeyBook()
        self.clock: Clock = clock if clock is not None else node.clock
        self._sleep = sleep
        self.delegation_policy = delegation_policy
        self.record: AgentRecord | None = None
        self.published = 0
        self._last_seq = 0
        self._task: asyncio.Task[None] | None = None
        self._published_event = asyncio.Event()
        self._live: set[str] = set()  # peers connected since this client was attached
        #: Registries whose connection dropped: published to again once it is back.
        self._lost: set[str] = set()
        self._republish: set[asyncio.Task[None]] = set()
        self._remove_peer_callback: Callable[[], None] = _nothing
        AgentRecord(node.agent_id, 0, 0, self.aliases, (), self.capabilities, next_key_digest)  # validate
        self._attach(node)

    # --- lifecycle ---------------------------------------------------------------------------

    def _attach(self, node: Node) -> None:
        dispatcher = RegisterKeyDispatcher.of(node)  # first: it refuses a node whose REGISTER_KEY is taken
        for reg in self.registries:
            node.add_peer(reg.agent_id, *reg.addresses)
        for aid, urls in self.bootstrap.items():
            if urls:
                node.add_peer(aid, *urls)
        self._dispatcher = dispatcher
        dispatcher.attach_client(self)
        self._remove_peer_callback = node.on_peer(self._on_peer)

    def _detach(self) -> None:
        """Stop listening to the node: its peer events and the statements its peers announce."""
        self._remove_peer_callback()
        self._remove_peer_callback = _nothing
        self._dispatcher.detach_client(self)

    def _on_peer(self, ev: PeerEvent) -> None:
        (self._live.add if ev.up else self._live.discard)(ev.agent_id)
        registry = any(r.agent_id == ev.agent_id for r in self.registries)
        if not registry or not self.publishing or self._task is None:
            return
        if not ev.up:
            self._lost.add(ev.agent_id)
        elif ev.agent_id in self._lost:  # a registry back (maybe restarted, its store empty): publish
            self._lost.discard(ev.agent_id)
            task = asyncio.get_running_loop().create_task(self._publish_again(ev.agent_id))
            self._republish.add(task)
            task.add_done_callback(self._republish.discard)

    async def _publish_again(self, registry: str) -> None:
        try:
            await self.publish()
            log.info("registry %s… is back: record published again", registry[:16])
        except IacError as exc:
            log.warning("publishing again to registry %s… failed: %s", registry[:16], exc)

    async def start(self) -> None:
        """Publish (when a registry is known and ``publish``) and start the refresh task."""
        if self.publishing and self.registries:
            await self.publish()
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop())
            for reg in self.registries:  # kept connected: a registry restart is noticed at once
                self.node.keep_connected(reg.agent_id)

    async def close(self) -> None:
        for task in list(self._republish):
            task.cancel()
        if self._task is not None and self.publishing:
            for reg in self.registries:
                self.node.stop_keeping(reg.agent_id)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._detach()

    async def __aenter__(self) -> MeshClient:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # --- publishing --------------------------------------------------------------------------

    def next_seq(self) -> int:
        """A ``seq`` above every one this client used (time-based µs, or the persisted counter)."""
        seq = max(self.clock.now_us(), self._last_seq + 1)
        if self.seq_file is not None:
            try:
                stored = int(self.seq_file.read_text().strip() or 0)
            except FileNotFoundError:
                stored = 0
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{self.seq_file}: not a seq counter ({exc})") from None
            seq = max(seq, stored + 1)
            try:
                write_private(self.seq_file, f"{seq}\n".encode())
            except OSError as exc:
                raise ConfigError(f"{self.seq_file}: cannot write the seq counter ({exc})") from None
        self._last_seq = seq
        return seq

    def make_record(self, *, seq: int | None = None) -> AgentRecord:
        """This node's record as it would be published now."""
        addrs = self._addresses if self._addresses is not None else tuple(self.node.addresses)
        private_ok = self.node.config.publish_private_addresses
        usable = tuple(
            dict.fromkeys(a for a in addrs if is_address(a) and (private_ok or not is_private_address(a)))
        )
        traversal = self._dispatcher.traversal
        candidates = tuple(traversal.candidates()) if traversal is not None else ()
        return AgentRecord(
            agent_id=self.node.agent_id,
            seq=self.next_seq() if seq is None else seq,
            expires_us=self.clock.now_us() + int(self.ttl * 1e6),
            aliases=self.aliases,
            addresses=usable[:16],
            capabilities=self.capabilities,
            next_key_digest=self.next_key_digest,
            candidates=candidates,
        )

    async def publish(self, record: AgentRecord | None = None) -> AgentRecord:
        """Sign and publish this node's record (to every registry; at least one must accept).

        With NAT traversal (:class:`~iac.mesh.Traversal`), a record made here whose candidates
        the registry's reply made stale (it saw this node at an address the record does not
        list: the first publish, or a NAT that mapped the node anew) is published again at once
        with the candidates as they are now; the address the registry saw before is dropped."""
        made = record is None
        record = record if record is not None else self.make_record()
        await self.publish_signed(sign_record(self.node.identity, record))
        self.record = record
        self.published += 1
        self._published_event.set()
        traversal = self._dispatcher.traversal
        if made and traversal is not None and tuple(traversal.candidates()) != record.candidates:
            record = self.make_record()
            await self.publish_signed(sign_record(self.node.identity, record))
            self.record = record
            self.published += 1
            self._published_event.set()
        return record

    async def publish_signed(self, signed: SignedRecord) -> dict[str, Any]:
        """Send an already signed record (tests send forged ones); raise the registry's refusal.
        An address the registry saw this node at (``observed``, in its signed reply) goes to the
        node's NAT traversal role, if any, as a candidate for the next record."""
        result: dict[str, Any] = await self._to_registries(publish_request(signed), every=True)
        traversal = self._dispatcher.traversal
        seen = result.get("observed") if isinstance(result, dict) else None
        if traversal is not None and isinstance(seen, str) and self.registries:
            traversal.note_observed(self.registries[0].agent_id, seen)
        return result

    async def wait_published(self, count: int) -> None:
        """Wait until :meth:`publish` succeeded ``count`` times in all."""
        while self.published < count:
            self._published_event.clear()
            await self._published_event.wait()

    async def _refresh_loop(self) -> None:
        while True:
            rec = self.record
            if rec is None:
                delay = self.retry_interval
            else:
                lifetime = self.ttl * 1e6
                at = rec.expires_us - lifetime + lifetime * self.refresh
                delay = max(0.0, (at - self.clock.now_us()) / 1e6)
            await self._sleep(delay)
            try:
                await self.publish()
            except IacError as exc:
                log.warning("refreshing the record failed: %s; retrying in %g s", exc, self.retry_interval)
                await self._sleep(self.retry_interval)

    # --- talking to registries ---------------------------------------------------------------

    async def _to_registries(self, payload: dict[str, Any], *, every: bool = False) -> Any:
        return await ask_registries(self.node, self.registries, payload, timeout=self.timeout, every=every)

    async def lookup(
        self, *, agent_id: str | None = None, alias: str | None = None, capability: str | None = None,
        limit: int | None = None,
    ) -> list[AgentRecord]:  # fmt: skip
        """Look up by id, alias or capability; verify each entry; fill the key book and peer book."""
        payload = lookup_request(agent_id=agent_id, alias=alias, capability=capability, limit=limit)
        answer = await self._to_registries(payload)
        entries = answer.get("entries")
        if not isinstance(entries, list):
            raise MessageRejected("a lookup reply carries entries", reason="bad_record")
        now = self.clock.now_us()
        out: list[AgentRecord] = []
        for obj in entries[: limit or len(entries)]:
            try:
                record = self.book.add(entry_from_json(obj), now)
            except IacError as exc:
                log.warning("registry served an entry that does not verify: %s", exc)
                continue
            if (
                (agent_id and record.agent_id != agent_id)
                or (alias and alias not in record.aliases)
                or (capability and capability not in record.capabilities)
            ):
                log.warning("registry served an entry that does not match the lookup")
                continue
            if record.addresses and record.agent_id != self.node.agent_id:
                self.node.add_peer(record.agent_id, *record.addresses)
            out.append(record)
        return out

    async def status(self, agent_id: str) -> dict[str, Any]:
        """The registry's view of a key: ``{"status", "seq", "successor"}``."""
        result: dict[str, Any] = await self._to_registries({"op": OP_STATUS, "agent_id": agent_id})
        return result

    async def resolve(self, name: str, *, fresh: bool = False) -> str:
        """An AgentId for ``name`` (an AgentId or an alias) with addresses in the peer book.

        Uses the key book unless ``fresh``; asks the registry otherwise, or when nothing is known.
        Follows rotations the client knows of. ``unknown_agent`` when nobody has the alias.
        """
        now = self.clock.now_us()
        if is_agent_id(name):
            aid = self.book.successor(name) or name
            known = aid in self.node.peer_book or self.node.connected(aid)
            if self.registries and (fresh or not known):
                try:
                    found = await self.lookup(agent_id=aid)
                except TransportError:
                    if not known:
                        raise
                    found = []
                if not found and not known:
                    raise MessageRejected(
                        f"the registry has no live record of {aid[:16]}…", reason="unknown_agent"
                    )
            return aid
        if not is_alias(name):
            raise ConfigError(f"{name!r:.80} is neither an AgentId nor an alias")
        cached = None if fresh else self.book.alias(name, now)
        if cached is not None and (cached in self.node.peer_book or self.node.connected(cached)):
            return cached
        if not self.registries:
            raise MessageRejected(f"no registry to resolve the alias {name!r}", reason="unknown_agent")
        found = await self.lookup(alias=name)
        if not found:
            raise MessageRejected(f"no agent has the alias {name!r}", reason="unknown_agent")
        return found[0].agent_id

    async def find(self, capability: str, *, limit: int | None = None) -> list[str]:
        """AgentIds offering ``capability`` (the registry's, else the key book's), this node excluded."""
        if self.registries:
            ids = [r.agent_id for r in await self.lookup(capability=capability, limit=limit)]
        else:
            ids = self.book.with_capability(capability, self.clock.now_us())
        return [a for a in ids if a != self.node.agent_id]

    # --- sending with resolution and one retry -----------------------------------------------

    async def _with_retry(self, to: str, op: Callable[[str], Awaitable[Any]]) -> Any:
        peer = await self.resolve(to)
        try:
            return await op(peer)
        except IacError as exc:
            if _no_retry(exc):
                raise
            log.info("sending to %s failed (%s); re-resolving and retrying once", to[:40], exc)
            try:
                peer = await self.resolve(to, fresh=True)
            except (TransportError, MessageRejected):
                raise exc from None
            return await op(peer)

    async def send(self, to: str, msg_type: int, payload: Any = None, **kwargs: Any) -> Sent:
        """:meth:`Node.send` to an AgentId or alias (re-resolved and retried once after a failed dial)."""
        return await self._with_retry(to, lambda p: self.node.send(p, msg_type, payload, **kwargs))  # type: ignore[no-any-return]

    async def request(self, to: str, msg_type: int, payload: Any = None, **kwargs: Any) -> Reply:
        """:meth:`Node.request` to an AgentId or alias (re-resolved and retried once after a failed dial)."""
        return await self._with_retry(to, lambda p: self.node.request(p, msg_type, payload, **kwargs))  # type: ignore[no-any-return]

    async def call(self, to: str, name: str, /, *args: Any, **kwargs: Any) -> Any:
        return await self.invoke(to, name, args, kwargs)

    async def invoke(
        self, to: str, name: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None,
        *, timeout: float | None = None, via: str | None = None,
    ) -> Any:  # fmt: skip
        return await self._with_retry(
            to, lambda p: self.node.invoke(p, name, args, kwargs, timeout=timeout, via=via)
        )

    async def delegate_capability(
        self,
        capability: str,
        task: TaskState,
        payload: Any = None,
        *,
        timeout: float | None = None,
        fallback: str | Sequence[str] | None = None,
        policy: DelegationPolicy | None = None,
        limit: int | None = None,
        sealed: bool = False,
    ) -> Reply:
        """Hand ``task`` to an agent offering ``capability``: candidates from the registry, limited
        and ordered by ``policy`` (or the client's ``delegation_policy``), each tried with
        ``timeout``; then the ``fallback`` agent(s) (AgentIds or aliases). Moves on when a
        candidate cannot be reached, times out or answers ERROR; raises the last failure."""
        try:
            candidates = await self.find(capability, limit=limit)
        except TransportError as exc:
            log.info("capability lookup failed (%s); using the fallback", exc)
            candidates = []
        chosen = policy or self.delegation_policy
        if chosen is not None:
            allowed = set(candidates)
            candidates = [c for c in chosen(capability, list(candidates)) if c in allowed]
        fallbacks = [fallback] if isinstance(fallback, str) else list(fallback or ())
        targets = [*candidates, *fallbacks]
        if not targets:
            raise MessageRejected(
                f"no agent offers the capability {capability!r} and no fallback is given",
                reason="unknown_agent",
            )
        last: IacError | None = None
        tried: set[str] = set()
        for target in targets:
            try:
                peer = await self.resolve(target)
                if peer in tried:
                    continue
                tried.add(peer)
                return await self.node.request(
                    peer, MessageType.DELEGATE_TASK, payload, timeout=timeout, task=task, sealed=sealed
                )
            except (TransportError, RemoteError, MessageRejected) as exc:
                log.info("delegating %r to %s failed: %s", capability, target[:40], exc)
                last = exc
        assert last is not None
        raise last

    # --- key rotation and revocation ---------------------------------------------------------

    async def rotate(
        self,
        new_identity: Identity,
        *,
        new_node: Node | None = None,
        next_key_digest: str | None = None,
        notify_peers: bool = True,
    ) -> RotationStatement:
        """Rotate this node's key to ``new_identity``: the statement (old key signs, new key
        countersigns) goes to the registries (which move the record and aliases) and, with
        ``notify_peers``, to every connected peer (one-way REGISTER_KEY). With ``new_node`` (a
        started node holding ``new_identity``) the client moves to it and publishes a fresh
        record from it, committing to ``next_key_digest``."""
        if new_node is not None and new_node.agent_id != new_identity.agent_id:
            raise ConfigError("new_node must hold new_identity")
        now = self.clock.now_us()
        signed = sign_rotation(self.node.identity, new_identity, seq=self.next_seq(), issued_us=now)
        payload = rotate_request(signed)
        if self.registries:
            await self._to_registries(payload, every=True)
        statement = self.note_statement(payload)
        assert isinstance(statement, dict)
        if notify_peers:
            await self._announce(payload)
        st = decode_rotation(signed.data)
        if new_node is not None:
            self._detach()
            self.node = new_node
            self._live = set()
            self.next_key_digest = next_key_digest
            self._attach(new_node)
            if self.publishing and self.registries:
                await self.publish()
        return st

    async def revoke(self, reason: str = "") -> Revocation:
        """End this node's key at once (registries and connected peers are told)."""
        signed = sign_revocation(self.node.identity, seq=self.next_seq(), issued_us=self.clock.now_us(),
                                 reason=reason)  # fmt: skip
        payload = revoke_request(signed)
        if self.registries:
            await self._to_registries(payload, every=True)
        await self._announce(payload)
        if self._task is not None:
            self._task.cancel()
            self._task = None
        return self.book.note_revocation(signed, self.clock.now_us())

    async def _announce(self, payload: dict[str, Any]) -> None:
        """Tell every connected peer but the registries (see :func:`announce`)."""
        regs = {r.agent_id for r in self.registries}
        others = [p for p in sorted({*self.node.peer_book, *self._live}) if p not in regs]
        await announce(self.node, payload, others, timeout=self.timeout)

    def note_statement(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A rotation or revocation a peer (or this client) announced: verify, remember, move the
        peer-book entry. Raises :class:`HandlerError` when it does not verify."""
        return note_statement(self.book, self.node, payload, self.clock.now_us())


__all__ = ["DelegationPolicy", "MeshClient"]
