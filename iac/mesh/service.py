"""The mesh roles on top of a :class:`~iac.Node`: the registry service and the discovery client.

Both speak REGISTER_KEY messages whose ``payload_json`` is one JSON object with
an ``op`` (docs/PROTOCOL.md, "Registry messages")::

    {"op": "publish", "record": {"record": "<canonical>", "signature": "<hex>"}}
    {"op": "rotate", "rotation": {"rotation": "...", "old_signature": "...", "new_signature": "..."}}
    {"op": "revoke", "revocation": {"revocation": "...", "signature": "..."}}
    {"op": "lookup", "agent_id": "<hex>"} | {"op": "lookup", "alias": "a.b"}
                   | {"op": "lookup", "capability": "c", "limit": 10}
    {"op": "status", "agent_id": "<hex>"}

* :class:`RegistryService` makes a node answer them from a
  :class:`~iac.RegistryState` (memory, SQLite or Redis store). Lookup replies
  carry the stored signed records and rotation proofs, so the client checks
  them itself (:func:`~iac.verify_entry`); the registry is trusted for
  completeness and freshness, never for authenticity.
* :class:`MeshClient` publishes its node's record and refreshes it before it
  expires, resolves aliases and capabilities (filling the node's peer book),
  re-resolves and retries once after a failed dial, delegates by capability with
  a timeout and a fallback, and rotates or revokes its key.
* :class:`KeyBook` is a client's verified cache (records, rotations,
  revocations); :func:`registry_admission` and :meth:`KeyBook.guard` turn a
  registry state or a key book into the node's HELLO admission policy and a
  content guard that refuses ended keys.

A refusal travels as an ERROR whose code is from the node's closed list and
whose message starts with the error's stable name (``"stale_seq: ..."``); the
client raises the same error class again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TypeAlias

from iac.errors import (
    BadRecord,
    ConfigError,
    DeliveryError,
    IacError,
    MessageRejected,
    RemoteError,
    RequestTimeout,
    StoreUnavailable,
    TransportError,
    UnknownAgent,
)
from iac.node.config import ErrorCode, HandlerError, PeerEvent
from iac.node.node import Node
from iac.node.types import Context, Reply, Sent
from iac.protocol.clock import Clock
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRecord,
    SignedRevocation,
    SignedRotation,
    decode_record,
    decode_rotation,
    is_address,
    is_alias,
    is_capability,
    open_revocation,
    open_rotation,
    sign_record,
    sign_revocation,
    sign_rotation,
)
from iac.protocol.registry import (
    KeyStatus,
    MemoryRecordStore,
    RegistryConfig,
    RegistryEntry,
    RegistryState,
    verify_entry,
)
from iac.transport.base import parse_address
from iac.wire._pb.iac_pb2 import Message, MessageType, TaskState
from iac.wire.identity import Identity, check_agent_id, is_agent_id
from iac.wire.message import sender_of

log = logging.getLogger("iac.mesh")

OP_PUBLISH = "publish"
OP_ROTATE = "rotate"
OP_REVOKE = "revoke"
OP_LOOKUP = "lookup"
OP_STATUS = "status"
OPS = frozenset({OP_PUBLISH, OP_ROTATE, OP_REVOKE, OP_LOOKUP, OP_STATUS})

#: ``policy(capability, candidates) -> candidates`` limits and orders who may get a delegated task.
DelegationPolicy: TypeAlias = Callable[[str, list[str]], Sequence[str]]
Sleep: TypeAlias = Callable[[float], Awaitable[Any]]


# --- errors over the wire ----------------------------------------------------------------------


def _error_classes() -> dict[str, type[IacError]]:
    """Refusals a registry may answer, by stable name (only classes built from one message)."""
    out: dict[str, type[IacError]] = {}
    todo: list[type[IacError]] = [MessageRejected, StoreUnavailable]
    while todo:
        cls = todo.pop()
        if cls.__init__ is Exception.__init__:
            out.setdefault(cls.name, cls)
        todo.extend(cls.__subclasses__())
    return out


def _handler_error(exc: IacError) -> HandlerError:
    """A registry refusal as the ERROR the node answers: closed-list code, ``"name: text"``."""
    if isinstance(exc, StoreUnavailable):
        code = ErrorCode.BUSY
    elif isinstance(exc, MessageRejected | ConfigError):
        code = ErrorCode.BAD_REQUEST
    else:
        code = ErrorCode.INTERNAL
    return HandlerError(code, f"{exc.name}: {exc}")


def raise_remote(exc: RemoteError) -> NoReturn:
    """Raise the typed error a registry named in an ERROR (``"stale_seq: ..."``), else ``exc``."""
    name, sep, text = exc.message.partition(": ")
    cls = _error_classes().get(name) if sep else None
    if cls is None:
        raise exc
    raise cls(text) from exc


# --- payloads (sans-IO) ------------------------------------------------------------------------


def publish_request(signed: SignedRecord) -> dict[str, Any]:
    return {"op": OP_PUBLISH, "record": signed.to_json_obj()}


def rotate_request(signed: SignedRotation) -> dict[str, Any]:
    return {"op": OP_ROTATE, "rotation": signed.to_json_obj()}


def revoke_request(signed: SignedRevocation) -> dict[str, Any]:
    return {"op": OP_REVOKE, "revocation": signed.to_json_obj()}


def lookup_request(
    *, agent_id: str | None = None, alias: str | None = None, capability: str | None = None,
    limit: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A lookup by exactly one of ``agent_id``, ``alias``, ``capability`` (with an optional ``limit``)."""
    given = [(k, v) for k, v in (("agent_id", agent_id), ("alias", alias), ("capability", capability)) if v]
    if len(given) != 1:
        raise ConfigError("a lookup names exactly one of agent_id, alias, capability")
    key, value = given[0]
    if key == "agent_id":
        check_agent_id(value)
    elif key == "alias" and not is_alias(value):
        raise ConfigError(f"not an alias (lowercase DNS-like name): {value!r:.80}")
    elif key == "capability" and not is_capability(value):
        raise ConfigError(f"not a capability ([a-z0-9._:/-], 1-64 chars): {value!r:.80}")
    obj: dict[str, Any] = {"op": OP_LOOKUP, key: value}
    if limit is not None:
        if key != "capability" or type(limit) is not int or limit < 1:
            raise ConfigError("limit is a positive integer, for capability lookups only")
        obj["limit"] = limit
    return obj


def entry_to_json(entry: RegistryEntry) -> dict[str, Any]:
    """A lookup result on the wire: the signed record, the rotations from it, the aliases held."""
    return {
        "aliases": list(entry.record.aliases),
        "record": entry.signed.to_json_obj(),
        "rotations": [r.to_json_obj() for r in entry.rotations],
    }


def entry_from_json(obj: object) -> RegistryEntry:
    """Rebuild a :class:`RegistryEntry` (not yet verified: call :func:`verify_entry`)."""
    if not isinstance(obj, dict) or set(obj) != {"aliases", "record", "rotations"}:
        raise BadRecord("an entry is {aliases, record, rotations}")
    aliases, rotations_obj = obj["aliases"], obj["rotations"]
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise BadRecord("entry aliases must be an array of strings")
    if not isinstance(rotations_obj, list) or len(rotations_obj) > 64:
        raise BadRecord("entry rotations must be an array (at most 64)")
    signed = SignedRecord.from_json_obj(obj["record"])
    rotations = tuple(SignedRotation.from_json_obj(r) for r in rotations_obj)
    base = decode_record(signed.data)
    try:
        if rotations:
            last = decode_rotation(rotations[-1].data)
            record = replace(
                base, agent_id=last.new_agent_id, seq=last.seq, next_key_digest=None, aliases=tuple(aliases)
            )
        else:
            record = replace(base, aliases=tuple(aliases))
    except ConfigError as exc:
        raise BadRecord(str(exc)) from None
    return RegistryEntry(record, signed, rotations)


def _obj(payload: Any, key: str) -> Any:
    if key not in payload:
        raise BadRecord(f"{payload.get('op')} needs {key!r}")
    return payload[key]


# --- the registry role -------------------------------------------------------------------------


class _Dispatch:
    """The REGISTER_KEY handler of one node: the registry role (if any), then the clients."""

    def __init__(self) -> None:
        self.registry: RegistryService | None = None
        self.clients: list[MeshClient] = []

    async def __call__(self, ctx: Context) -> Any:
        payload = ctx.payload
        if not isinstance(payload, dict) or payload.get("op") not in OPS:
            raise HandlerError(
                ErrorCode.BAD_REQUEST, f"bad_record: a registry message is {{op: {sorted(OPS)}}}"
            )
        op = payload["op"]
        result: Any = None
        if self.registry is not None:
            result = await self.registry.handle(ctx.sender, payload)
        elif op not in (OP_ROTATE, OP_REVOKE) or not self.clients:
            raise HandlerError(ErrorCode.NO_HANDLER, "this node is not a registry")
        if op in (OP_ROTATE, OP_REVOKE):
            for client in list(self.clients):
                if self.registry is not None:  # the registry decided; a client's view is secondary
                    with contextlib.suppress(HandlerError):
                        client._note_statement(payload)
                    continue
                noted = client._note_statement(payload)
                if result is None:
                    result = noted
        return result


_DISPATCH: weakref.WeakKeyDictionary[Node, _Dispatch] = weakref.WeakKeyDictionary()


def _dispatch(node: Node) -> _Dispatch:
    d = _DISPATCH.get(node)
    if d is None:
        d = _DISPATCH[node] = _Dispatch()

        async def register_key(ctx: Context) -> Any:  # a coroutine function: runs on the loop
            return await d(ctx)

        node.on(MessageType.REGISTER_KEY)(register_key)
    return d


class RegistryService:
    """Makes ``node`` answer registry requests from ``state`` (REGISTER_KEY, see the module doc).

    ``clock`` decides expiry, grace periods and statement skew (default: the node's clock).
    A publish must come from the key it describes. Store calls of a SQLite or Redis store run
    in a worker thread, so the node's event loop never waits on them.
    """

    def __init__(self, node: Node, state: RegistryState, *, clock: Clock | None = None) -> None:
        self.node = node
        self.state = state
        self.clock: Clock = clock if clock is not None else node.clock
        self._offload = not isinstance(state.store, MemoryRecordStore)
        self.counts: dict[str, int] = dict.fromkeys(sorted(OPS), 0)
        d = _dispatch(node)
        if d.registry is not None:
            raise ConfigError("this node already serves a registry")
        d.registry = self

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(fn) if self._offload else fn()

    async def handle(self, sender: str, payload: dict[str, Any]) -> Any:
        """Answer one registry request from ``sender`` (raises :class:`HandlerError`)."""
        op = payload["op"]
        try:
            result = await self._handle(sender, op, payload)
        except IacError as exc:
            log.info("registry: %s from %s… refused: %s", op, sender[:16], exc)
            raise _handler_error(exc) from None
        self.counts[op] += 1
        return result

    async def _handle(self, sender: str, op: str, payload: dict[str, Any]) -> Any:
        now = self.clock.now_us()
        state = self.state
        if op == OP_PUBLISH:
            signed = SignedRecord.from_json_obj(_obj(payload, "record"))
            claimed = decode_record(signed.data, max_size=state.config.max_record_size)
            if claimed.agent_id != sender:
                raise BadRecord("a record must be published by the key it describes (from != agent_id)")
            record: AgentRecord = await self._run(lambda: state.publish(signed, now))
            return {"op": op, "agent_id": record.agent_id, "seq": record.seq, "expires_us": record.expires_us}
        if op == OP_ROTATE:
            rot = SignedRotation.from_json_obj(_obj(payload, "rotation"))
            st: RotationStatement = await self._run(lambda: state.apply_rotation(rot, now))
            return {"op": op, "old_agent_id": st.old_agent_id, "new_agent_id": st.new_agent_id, "seq": st.seq}
        if op == OP_REVOKE:
            rev = SignedRevocation.from_json_obj(_obj(payload, "revocation"))
            r: Revocation = await self._run(lambda: state.apply_revocation(rev, now))
            return {"op": op, "agent_id": r.agent_id, "seq": r.seq}
        if op == OP_STATUS:
            aid = _obj(payload, "agent_id")
            if not isinstance(aid, str) or not is_agent_id(aid):
                raise BadRecord("status needs an AgentId")
            info = await self._run(lambda: state.key_status(aid, now))
            return {"op": op, "agent_id": aid, "status": info.status.value, "seq": info.seq,
                    "successor": info.successor}  # fmt: skip
        # lookup
        keys = {"agent_id", "alias", "capability"} & set(payload)
        if len(keys) != 1 or set(payload) - {"op", "agent_id", "alias", "capability", "limit"}:
            raise BadRecord("a lookup names exactly one of agent_id, alias, capability (and limit)")
        key = keys.pop()
        value = payload[key]
        if not isinstance(value, str):
            raise BadRecord(f"lookup {key} must be a string")
        try:
            if key == "agent_id":
                check_agent_id(value)
                one = await self._run(lambda: state.lookup_id(value, now))
                entries = [one] if one is not None else []
            elif key == "alias":
                one = await self._run(lambda: state.lookup_alias(value, now))
                entries = [one] if one is not None else []
            else:
                limit = payload.get("limit")
                if limit is not None and (type(limit) is not int or limit < 1):
                    raise BadRecord("limit must be a positive integer")
                entries = await self._run(lambda: state.lookup_capability(value, now, limit))
        except ConfigError as exc:
            raise BadRecord(str(exc)) from None
        return {"op": op, "entries": [entry_to_json(e) for e in entries]}

    def close(self) -> None:
        d = _DISPATCH.get(self.node)
        if d is not None and d.registry is self:
            d.registry = None


def serve_registry(
    node: Node,
    store: RegistryState | str = "memory",
    *,
    config: RegistryConfig | None = None,
    clock: Clock | None = None,
) -> RegistryService:
    """Put ``node`` in the registry role over a state, or a store spec (``memory``,
    ``sqlite:PATH``, ``redis://HOST:PORT``)."""
    if isinstance(store, str):
        from iac.protocol.registry import open_record_store

        store = RegistryState(open_record_store(store), config)
    return RegistryService(node, store, clock=clock)


# --- the client's verified cache ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Ended:
    successor: str  # "" for a revocation
    ended_us: int


class KeyBook:
    """What a client verified: records (from registry lookups), rotations and revocations.

    Bounded (``max_records``; the soonest to expire goes first). ``rotation_grace_us`` is how
    long a rotated key is still accepted (the registry's default).
    """

    def __init__(self, *, rotation_grace_us: int | None = None, max_records: int = 10_000) -> None:
        if max_records < 1:
            raise ConfigError("max_records must be at least 1")
        self.rotation_grace_us = (
            RegistryConfig().rotation_grace_us if rotation_grace_us is None else rotation_grace_us
        )
        self.max_records = max_records
        self._records: dict[str, AgentRecord] = {}
        self._ended: dict[str, _Ended] = {}
        self._max_ended = 4 * max_records

    def add(self, entry: RegistryEntry, now_us: int) -> AgentRecord:
        """Verify a lookup result (:func:`verify_entry`) and keep it."""
        record = verify_entry(entry, now_us)
        if record.agent_id in self._ended and self._ended[record.agent_id].successor == "":
            raise BadRecord(f"{record.agent_id[:16]}… is revoked")
        for rot in entry.rotations:  # the proof says these keys handed over
            st = decode_rotation(rot.data)
            self._end(st.old_agent_id, _Ended(st.new_agent_id, min(st.issued_us, now_us)))
        self._put(record, now_us)
        return record

    def _put(self, record: AgentRecord, now_us: int) -> None:
        old = self._records.get(record.agent_id)
        if old is not None and old.seq > record.seq:
            return
        self._records[record.agent_id] = record
        if len(self._records) > self.max_records:
            for aid in sorted(self._records, key=lambda a: self._records[a].expires_us)[
                : len(self._records) - self.max_records
            ]:
                del self._records[aid]

    def _end(self, agent_id: str, ended: _Ended) -> None:
        prev = self._ended.get(agent_id)
        if prev is not None and (prev.successor == "" or prev.ended_us <= ended.ended_us):
            return
        self._ended[agent_id] = ended
        if len(self._ended) > self._max_ended:
            self._ended.pop(next(iter(self._ended)))

    def get(self, agent_id: str, now_us: int) -> AgentRecord | None:
        """The unexpired record of a key that has not ended, or None."""
        rec = self._records.get(agent_id)
        if rec is None or rec.expires_us <= now_us or self.status(agent_id, now_us) is not KeyStatus.ACTIVE:
            return None
        return rec

    def alias(self, alias: str, now_us: int) -> str | None:
        for aid, rec in self._records.items():
            if alias in rec.aliases and self.get(aid, now_us) is not None:
                return aid
        return None

    def with_capability(self, capability: str, now_us: int) -> list[str]:
        return sorted(
            aid for aid, r in self._records.items() if capability in r.capabilities and self.get(aid, now_us)
        )

    def successor(self, agent_id: str) -> str:
        """The key ``agent_id`` rotated to (following the chain), or ``""``."""
        seen: set[str] = set()
        current = agent_id
        while current in self._ended and self._ended[current].successor and current not in seen:
            seen.add(current)
            current = self._ended[current].successor
        return "" if current == agent_id else current

    def note_rotation(self, signed: SignedRotation, now_us: int) -> RotationStatement:
        """Verify a rotation statement (against the old key's committed successor when its record
        is known) and remember it: the old key's record moves to the successor."""
        st = decode_rotation(signed.data)
        old = self._records.get(st.old_agent_id)
        st = open_rotation(signed, now_us, next_key_digest=old.next_key_digest if old else None)
        prev = self._ended.get(st.old_agent_id)
        if prev is not None and prev.successor != st.new_agent_id and prev.successor:
            raise BadRecord(f"{st.old_agent_id[:16]}… already rotated to another key")
        if old is not None and st.seq <= old.seq:
            raise BadRecord(f"rotation seq {st.seq} is not above the record's {old.seq}")
        self._end(st.old_agent_id, _Ended(st.new_agent_id, min(st.issued_us, now_us)))
        if old is not None and st.new_agent_id not in self._records:
            self._records[st.new_agent_id] = replace(
                old, agent_id=st.new_agent_id, seq=st.seq, next_key_digest=None
            )
        return st

    def note_revocation(self, signed: SignedRevocation, now_us: int) -> Revocation:
        """Verify a revocation and remember it: the key is refused at once."""
        rev = open_revocation(signed, now_us)
        self._ended[rev.agent_id] = _Ended("", min(rev.issued_us, now_us))
        self._records.pop(rev.agent_id, None)
        return rev

    def status(self, agent_id: str, now_us: int) -> KeyStatus:
        ended = self._ended.get(agent_id)
        if ended is not None:
            if not ended.successor:
                return KeyStatus.REVOKED
            in_grace = now_us < ended.ended_us + self.rotation_grace_us
            return KeyStatus.ROTATING if in_grace else KeyStatus.ROTATED
        rec = self._records.get(agent_id)
        if rec is None:
            return KeyStatus.UNKNOWN
        return KeyStatus.ACTIVE if rec.expires_us > now_us else KeyStatus.EXPIRED

    def is_ended(self, agent_id: str, now_us: int) -> bool:
        return self.status(agent_id, now_us) in (KeyStatus.ROTATED, KeyStatus.REVOKED)

    def guard(self, clock: Clock | None = None) -> Callable[[Message, Any], str | None]:
        """A content guard (``NodeConfig.guards``) refusing messages from rotated (after the grace
        period) and revoked keys."""
        from iac.protocol.clock import SYSTEM_CLOCK

        clk = clock if clock is not None else SYSTEM_CLOCK

        def ended_key_guard(msg: Message, payload: Any) -> str | None:
            sender = sender_of(msg)
            status = self.status(sender, clk.now_us())
            if status in (KeyStatus.ROTATED, KeyStatus.REVOKED):
                return f"the sender's key is {status.value}"
            return None

        return ended_key_guard


def registry_admission(
    source: RegistryState | KeyBook,
    clock: Clock | None = None,
    *,
    require_registered: bool = True,
    allow: Iterable[str] = (),
) -> Callable[[str], bool]:
    """An admission policy (``TransportConfig.admission``) for a node co-located with a registry
    state (same SQLite file or Redis server) or holding a client :class:`KeyBook`.

    With ``require_registered`` a dialing peer is admitted only while its key is registered
    with a live record (or is a rotated key inside its grace period); without it, only
    rotated (past the grace period) and revoked keys are refused. ``allow`` lists AgentIds
    admitted regardless (the registry, operators). A store that fails refuses (fail closed).
    The check runs in the HELLO exchange, on the event loop: a Redis round trip per dial.
    """
    from iac.protocol.clock import SYSTEM_CLOCK

    clk = clock if clock is not None else SYSTEM_CLOCK
    allowed = frozenset(check_agent_id(a) for a in allow)
    good = {KeyStatus.ACTIVE, KeyStatus.ROTATING}
    if not require_registered:
        good |= {KeyStatus.UNKNOWN, KeyStatus.EXPIRED}

    def admit(agent_id: str) -> bool:
        if agent_id in allowed:
            return True
        try:
            if isinstance(source, KeyBook):
                status = source.status(agent_id, clk.now_us())
            else:
                status = source.key_status(agent_id, clk.now_us()).status
        except IacError as exc:
            log.warning("admission: cannot check %s…: %s", agent_id[:16], exc)
            return False
        return status in good

    return admit


def move_peer(node: Node, old: str, new: str) -> None:
    """Give the successor ``new`` the peer-book addresses of ``old`` (after a verified rotation).

    What remains for the node (no public API for it yet): dropping ``old`` from the peer book
    and closing its connections once the grace period ends. Until then, refuse the old key with
    :meth:`KeyBook.guard` (messages) and :func:`registry_admission` (new connections).
    """
    urls = node.peers.get(old, [])
    if urls:
        node.add_peer(new, *urls)


# --- the discovery client ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegistryAddr:
    """A registry to talk to: its AgentId and addresses."""

    agent_id: str
    addresses: tuple[str, ...]

    def __post_init__(self) -> None:
        check_agent_id(self.agent_id)
        if not self.addresses:
            raise ConfigError("a registry needs at least one address")
        for url in self.addresses:
            parse_address(url)


def parse_registry(specs: Iterable[str]) -> list[RegistryAddr]:
    """Registries from ``AGENT_ID@URL`` strings (one id may repeat with more addresses)."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        aid, sep, url = spec.partition("@")
        if not sep or not is_agent_id(aid):
            raise ConfigError(
                f"{spec!r:.100}: a registry is AGENT_ID@URL (64 hex characters, '@', an address)"
            )
        parse_address(url)
        out.setdefault(aid, []).append(url)
    return [RegistryAddr(aid, tuple(urls)) for aid, urls in out.items()]


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
        AgentRecord(node.agent_id, 0, 0, self.aliases, (), self.capabilities, next_key_digest)  # validate
        self._attach(node)

    # --- lifecycle ---------------------------------------------------------------------------

    def _attach(self, node: Node) -> None:
        for reg in self.registries:
            node.add_peer(reg.agent_id, *reg.addresses)
        for aid, urls in self.bootstrap.items():
            if urls:
                node.add_peer(aid, *urls)
        d = _dispatch(node)
        if self not in d.clients:
            d.clients.append(self)

        def on_peer(ev: PeerEvent) -> None:
            if self.node is node:
                (self._live.add if ev.up else self._live.discard)(ev.agent_id)

        node.on_peer(on_peer)

    def _detach(self, node: Node) -> None:
        d = _DISPATCH.get(node)
        if d is not None and self in d.clients:
            d.clients.remove(self)

    async def start(self) -> None:
        """Publish (when a registry is known and ``publish``) and start the refresh task."""
        if self.publishing and self.registries:
            await self.publish()
            self._task = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._detach(self.node)

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
            tmp = self.seq_file.with_name(self.seq_file.name + ".tmp")
            tmp.write_text(f"{seq}\n")
            os.replace(tmp, self.seq_file)
        self._last_seq = seq
        return seq

    def make_record(self, *, seq: int | None = None) -> AgentRecord:
        """This node's record as it would be published now."""
        addrs = self._addresses if self._addresses is not None else tuple(self.node.addresses)
        usable = tuple(dict.fromkeys(a for a in addrs if is_address(a)))[:16]
        return AgentRecord(
            agent_id=self.node.agent_id,
            seq=self.next_seq() if seq is None else seq,
            expires_us=self.clock.now_us() + int(self.ttl * 1e6),
            aliases=self.aliases,
            addresses=usable,
            capabilities=self.capabilities,
            next_key_digest=self.next_key_digest,
        )

    async def publish(self, record: AgentRecord | None = None) -> AgentRecord:
        """Sign and publish this node's record (to every registry; at least one must accept)."""
        record = record if record is not None else self.make_record()
        await self.publish_signed(sign_record(self.node.identity, record))
        self.record = record
        self.published += 1
        self._published_event.set()
        return record

    async def publish_signed(self, signed: SignedRecord) -> dict[str, Any]:
        """Send an already signed record (tests send forged ones); raise the registry's refusal."""
        result: dict[str, Any] = await self._to_registries(publish_request(signed), every=True)
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

    async def _ask(self, reg: RegistryAddr, payload: dict[str, Any]) -> Any:
        try:
            reply = await self.node.request(
                reg.agent_id, MessageType.REGISTER_KEY, payload, timeout=self.timeout
            )
        except RemoteError as exc:
            raise_remote(exc)
        if not isinstance(reply.payload, dict) or reply.payload.get("op") != payload["op"]:
            raise BadRecord("the registry's reply does not answer the request")
        return reply.payload

    async def _to_registries(self, payload: dict[str, Any], *, every: bool = False) -> Any:
        """Ask the registries in order: the first answer (``every``: ask all, need one success).

        A refusal (a :class:`MessageRejected`) is final; an unreachable registry moves on.
        """
        if not self.registries:
            raise ConfigError("no registry configured")
        last: IacError | None = None
        first: Any = None
        ok = False
        for reg in self.registries:
            try:
                result = await self._ask(reg, payload)
            except (TransportError, RemoteError) as exc:
                log.info("registry %s… unavailable: %s", reg.agent_id[:16], exc)
                last = exc
                continue
            if not ok:
                first, ok = result, True
            if not every:
                return result
        if not ok:
            assert last is not None
            raise last
        return first

    async def lookup(
        self, *, agent_id: str | None = None, alias: str | None = None, capability: str | None = None,
        limit: int | None = None,
    ) -> list[AgentRecord]:  # fmt: skip
        """Look up by id, alias or capability; verify each entry; fill the key book and peer book."""
        payload = lookup_request(agent_id=agent_id, alias=alias, capability=capability, limit=limit)
        answer = await self._to_registries(payload)
        entries = answer.get("entries")
        if not isinstance(entries, list):
            raise BadRecord("a lookup reply carries entries")
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
        Follows rotations the client knows of. :class:`UnknownAgent` when nobody has the alias.
        """
        now = self.clock.now_us()
        if is_agent_id(name):
            aid = self.book.successor(name) or name
            known = aid in self.node.peers or self.node.connected(aid)
            if self.registries and (fresh or not known):
                try:
                    found = await self.lookup(agent_id=aid)
                except TransportError:
                    if not known:
                        raise
                    found = []
                if not found and not known:
                    raise UnknownAgent(f"the registry has no live record of {aid[:16]}…")
            return aid
        if not is_alias(name):
            raise ConfigError(f"{name!r:.80} is neither an AgentId nor an alias")
        cached = None if fresh else self.book.alias(name, now)
        if cached is not None and (cached in self.node.peers or self.node.connected(cached)):
            return cached
        if not self.registries:
            raise UnknownAgent(f"no registry to resolve the alias {name!r}")
        found = await self.lookup(alias=name)
        if not found:
            raise UnknownAgent(f"no agent has the alias {name!r}")
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
        *, timeout: float | None = None,
    ) -> Any:  # fmt: skip
        return await self._with_retry(to, lambda p: self.node.invoke(p, name, args, kwargs, timeout=timeout))

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
            raise UnknownAgent(f"no agent offers the capability {capability!r} and no fallback is given")
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
        statement = self._note_statement(payload)
        assert isinstance(statement, dict)
        if notify_peers:
            await self._announce(payload)
        st = decode_rotation(signed.data)
        if new_node is not None:
            self._detach(self.node)
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
        """Send a statement to every connected peer but the registries (ACK_REQUESTED) and wait,
        up to ``timeout``, until they acknowledged it (a peer that fails is skipped)."""
        regs = {r.agent_id for r in self.registries}
        known = {*self.node.peers, *self._live}
        peers = [p for p in sorted(known) if p not in regs and self.node.connected(p)]

        async def one(peer: str) -> None:
            with contextlib.suppress(IacError, TimeoutError):
                sent = await self.node.send(peer, MessageType.REGISTER_KEY, payload, ack=True)
                await asyncio.wait_for(sent.wait(), self.timeout)

        await asyncio.gather(*(one(p) for p in peers))

    def _note_statement(self, payload: dict[str, Any]) -> dict[str, Any]:
        """A rotation or revocation a peer (or this client) announced: verify, remember, move the
        peer-book entry. Raises :class:`HandlerError` when it does not verify."""
        now = self.clock.now_us()
        try:
            if payload["op"] == OP_ROTATE:
                st = self.book.note_rotation(SignedRotation.from_json_obj(_obj(payload, "rotation")), now)
                move_peer(self.node, st.old_agent_id, st.new_agent_id)
                return {"op": OP_ROTATE, "old_agent_id": st.old_agent_id, "new_agent_id": st.new_agent_id,
                        "seq": st.seq}  # fmt: skip
            rev = self.book.note_revocation(SignedRevocation.from_json_obj(_obj(payload, "revocation")), now)
            return {"op": OP_REVOKE, "agent_id": rev.agent_id, "seq": rev.seq}
        except IacError as exc:
            raise _handler_error(exc) from None


__all__ = [
    "OPS",
    "DelegationPolicy",
    "KeyBook",
    "MeshClient",
    "RegistryAddr",
    "RegistryService",
    "entry_from_json",
    "entry_to_json",
    "lookup_request",
    "move_peer",
    "parse_registry",
    "publish_request",
    "raise_remote",
    "registry_admission",
    "revoke_request",
    "rotate_request",
    "serve_registry",
]
