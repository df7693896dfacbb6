"""Through NATs: observed addresses, candidates, QUIC hole punching, relay fallback and upgrade.

:class:`Traversal` is a mesh role composed with a node (as :class:`~iac.MeshClient` is), on
the node's REGISTER_KEY handler (:class:`~iac.mesh.dispatch.RegisterKeyDispatcher`). Every
step travels in signed IAC messages (docs/PROTOCOL.md, "Through NATs"):

* ``observe``: a peer answers with the address it sees the asker at (the node's NAT mapping,
  since the node dials from its one listener socket). A registry puts the same in its reply to
  ``publish``. An observed address is only ever published by the node it describes, never
  dialed on the word of whoever observed it.
* ``punch`` (A to B, over the relay path they share): A's candidates; B answers with its own
  and sends a few punch datagrams toward A's candidates from its listener socket, opening its
  NAT toward A. A measures the round trip.
* ``punch_sync`` (A to B, one way): B punches again at once; A waits half the measured round
  trip, so that both act at about the same moment (as libp2p's DCUtR), punches, then dials B's
  candidates from the same socket. The first connection whose HELLO verifies wins (the
  connection table's tie-break, as for simultaneous dials); nothing but the HELLO proves who
  is at an address.

Messages keep going through the relay while this runs and whenever it fails; once the direct
connection is up, new messages take it (a node sends on the direct connection to a peer
before any route), and what is unacknowledged is sent again on it (the receiver's replay
window drops what arrives twice). :meth:`Traversal.watch` keeps trying to upgrade a relayed
peer, with backoff.

Bounds against reflection: candidates per message or record (:data:`MAX_CANDIDATES`), punch
datagrams per destination (a token bucket: :attr:`Traversal.punch_burst` at once,
:attr:`Traversal.punch_rate` per second; :attr:`Traversal.punch_total_rate` for all of them
together), destinations remembered (:data:`MAX_DESTINATIONS`),
and punches only for a peer that asked in a signed message (``allow`` may narrow who).
Address candidates are IP literals only (:func:`check_candidates`): a host name is refused and
counted (``host_names``), never looked up, so no punch waits on a resolver.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from iac.errors import ConfigError, ErrorCode, HandlerError, IacError
from iac.mesh.dispatch import NAT_OPS, RegisterKeyDispatcher
from iac.node.node import Node
from iac.protocol.records import (
    CANDIDATE_KINDS,
    MAX_CANDIDATES,
    is_address,
    is_ip_address,
    is_private_address,
)
from iac.transport.base import parse_address
from iac.transport.dialer import Backoff
from iac.wire.enums import MessageType
from iac.wire.identity import check_agent_id, is_agent_id

log = logging.getLogger("iac.mesh")

OP_OBSERVE = "observe"
OP_PUNCH = "punch"
OP_PUNCH_SYNC = "punch_sync"
assert {OP_OBSERVE, OP_PUNCH, OP_PUNCH_SYNC} == NAT_OPS
#: Punch destinations remembered for rate limiting (the oldest is forgotten first).
MAX_DESTINATIONS = 4096
#: What a punch datagram carries: one byte that no QUIC packet parser takes for a packet.
PUNCH_DATAGRAM = b"\x00"

Candidate = tuple[str, str]


#: What the refusal of a host-name candidate says (punching toward it would wait on a resolver).
_HOST_NAME = "names a host, not an IP address"


def check_candidates(raw: Any) -> list[Candidate]:
    """Candidates from a signed message: ``[[kind, value], ...]``, at most :data:`MAX_CANDIDATES`
    (more are refused, not cut), each well-formed, every address one with a literal IP host
    (``quic://203.0.113.7:4433``, ``quic://[2001:db8::1]:4433``). Raises :class:`HandlerError`
    ``bad_request`` (for a host name too: no lookup is ever made)."""
    if not isinstance(raw, list) or len(raw) > MAX_CANDIDATES:
        raise HandlerError(ErrorCode.BAD_REQUEST, f"candidates: an array of at most {MAX_CANDIDATES}")
    out: list[Candidate] = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 2 and item[0] in CANDIDATE_KINDS):
            raise HandlerError(ErrorCode.BAD_REQUEST, "a candidate is [kind, value]")
        kind, value = item
        ok = is_agent_id(value) if kind == "relay" else is_address(value) and str(value).startswith("quic://")
        if not ok:
            raise HandlerError(ErrorCode.BAD_REQUEST, f"bad {kind} candidate {str(value)[:80]!r}")
        if kind != "relay" and not is_ip_address(value):
            raise HandlerError(ErrorCode.BAD_REQUEST, f"{kind} candidate {str(value)[:80]!r} {_HOST_NAME}")
        out.append((kind, value))
    return out


@dataclass
class NatStats:
    """What a :class:`Traversal` did (also under ``stats()["nat"]`` of :meth:`Traversal.stats`)."""

    punch_attempts: int = 0  # punches this node started (as A)
    punch_successes: int = 0  # ... that ended with a direct connection
    punch_failures: int = 0  # ... that did not, within the bound
    punches_answered: int = 0  # punch requests answered (as B)
    punch_datagrams: int = 0  # punch datagrams sent
    punch_rate_limited: int = 0  # punch datagrams not sent: over the destination's budget
    refused: int = 0  # punch requests refused (not allowed, no QUIC listener)
    host_names: int = 0  # punch requests and replies refused for naming a host, not an IP
    observed: int = 0  # observed addresses learned
    last_direct_s: float | None = None  # time the last successful punch took


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class Traversal:
    """NAT traversal for one node (see the module docstring).

    ``relays``: AgentIds of relays the node is reachable through (published as ``relay``
    candidates). ``allow(peer)``: whether to punch for a peer that asked (default: any peer
    whose request verified). ``direct_timeout``: how long a punch may take before it counts as
    failed (messages go through the relay meanwhile and afterwards).
    ``publish_private``: None follows ``NodeConfig.publish_private_addresses``.
    """

    node: Node
    relays: Sequence[str] = ()
    allow: Callable[[str], bool] = lambda peer: True
    direct_timeout: float = 5.0
    punch_burst: int = 4
    punch_rate: float = 2.0
    punch_spacing: float = 0.02
    #: All destinations together: at most this many punch datagrams per second (and twice as
    #: many at once), so that cycling through destinations gains nothing.
    punch_total_rate: float = 32.0
    publish_private: bool | None = None
    stats_: NatStats = field(default_factory=NatStats)
    observed: dict[str, str] = field(default_factory=dict)  # observer AgentId -> address
    _buckets: OrderedDict[tuple[str, int], _Bucket] = field(default_factory=OrderedDict)
    _peer_candidates: dict[str, list[Candidate]] = field(default_factory=dict)
    _watches: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        for r in self.relays:
            check_agent_id(r)
        if (
            self.direct_timeout <= 0
            or self.punch_burst < 1
            or self.punch_rate <= 0
            or self.punch_total_rate <= 0
        ):
            raise ConfigError(
                "need direct_timeout > 0, punch_burst >= 1, punch_rate > 0 and punch_total_rate > 0"
            )
        self._total = _Bucket(2 * self.punch_total_rate, time.monotonic())
        self._dispatcher = RegisterKeyDispatcher.of(self.node)
        self._dispatcher.attach_traversal(self)
        self.node.nat_stats = self.stats

    # --- lifecycle -----------------------------------------------------------------------------

    async def close(self) -> None:
        self._dispatcher.detach_traversal(self)
        if self.node.nat_stats == self.stats:
            self.node.nat_stats = None
        tasks = [*self._watches.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watches.clear()

    async def __aenter__(self) -> Traversal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- candidates ----------------------------------------------------------------------------

    @property
    def _private_ok(self) -> bool:
        if self.publish_private is not None:
            return self.publish_private
        return bool(getattr(self.node.config, "publish_private_addresses", True))

    def candidates(self) -> list[Candidate]:
        """This node's candidates, in preference order: observed addresses, local QUIC
        addresses (unless private ones are kept out), relays; at most :data:`MAX_CANDIDATES`."""
        out: list[Candidate] = []
        for url in dict.fromkeys(self.observed.values()):
            out.append(("observed", url))
        for url in self.node.addresses:
            if not url.startswith("quic://") or not is_address(url):
                continue
            host = parse_address(url).host.strip("[]")
            if host in ("0.0.0.0", "::"):
                continue  # an unspecified listen address names no place to dial
            if is_private_address(url) and not self._private_ok:
                continue
            if ("observed", url) not in out:
                out.append(("local", url))
        out.extend(("relay", r) for r in self.relays)
        return out[:MAX_CANDIDATES]

    def note_observed(self, observer: str, url: str) -> bool:
        """``observer`` (whose signed reply said so) sees this node at ``url``. Kept as a
        candidate to publish (one per observer, bounded), never dialed."""
        if not isinstance(url, str) or not is_address(url) or not url.startswith("quic://"):
            return False
        if self.observed.get(observer) != url:
            self.observed.pop(observer, None)
            self.observed[observer] = url
            while len(self.observed) > MAX_CANDIDATES:
                self.observed.pop(next(iter(self.observed)))
            self.stats_.observed += 1
            log.info("observed at %s by %s…", url, observer[:16], extra={"peer": observer[:16]})
        return True

    async def observe(self, via: str, *, timeout: float = 5.0) -> str:
        """Ask ``via`` (a peer this node reaches directly: a relay, a registry) at which address
        it sees this node; note it as an observed candidate and return it."""
        reply = await self.node.request(via, MessageType.REGISTER_KEY, {"op": OP_OBSERVE}, timeout=timeout)
        payload = reply.payload
        url = payload.get("observed") if isinstance(payload, dict) else None
        if not isinstance(url, str) or not self.note_observed(via, url):
            raise HandlerError(ErrorCode.BAD_REQUEST, f"{via[:16]}… sent no observed address")
        return url

    # --- the role on the REGISTER_KEY handler --------------------------------------------------

    async def handle(self, sender: str, payload: dict[str, Any]) -> Any:
        op = payload.get("op")
        if op not in (OP_PUNCH, OP_PUNCH_SYNC):  # pragma: no cover - the dispatcher routes NAT_OPS
            raise HandlerError(ErrorCode.BAD_REQUEST, f"unknown op {op!r}")
        theirs = self._check(payload.get("candidates", []))
        if not self.allow(sender):
            self.stats_.refused += 1
            raise HandlerError(ErrorCode.POLICY_DENIED, "no punching for this peer")
        listener = self._listener()
        if listener is None:
            self.stats_.refused += 1
            raise HandlerError(ErrorCode.NO_HANDLER, "no QUIC listener to punch from")
        if theirs:  # kept to punch toward, never put in the peer book: this side does not dial them
            self._keep(sender, theirs)
        targets = self._peer_candidates.get(sender, [])
        self._spawn(self._punch(listener, targets))
        if op == OP_PUNCH:
            self.stats_.punches_answered += 1
            return {"op": op, "candidates": [list(c) for c in self.candidates()]}
        return None

    def _check(self, raw: Any) -> list[Candidate]:
        """:func:`check_candidates`, counting the host names refused."""
        try:
            return check_candidates(raw)
        except HandlerError as exc:
            self.stats_.host_names += exc.message.endswith(_HOST_NAME)
            raise

    # --- punching ------------------------------------------------------------------------------

    def _listener(self) -> Any:
        return self.node.paths.quic_listener()

    def _allow_datagram(self, dest: tuple[str, int], now: float) -> bool:
        total = self._total
        total.tokens = min(2 * self.punch_total_rate, total.tokens + (now - total.at) * self.punch_total_rate)
        total.at = now
        if total.tokens < 1:
            self.stats_.punch_rate_limited += 1
            return False
        b = self._buckets.get(dest)
        if b is None:
            b = self._buckets[dest] = _Bucket(float(self.punch_burst), now)
            while len(self._buckets) > MAX_DESTINATIONS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(dest)
            b.tokens = min(float(self.punch_burst), b.tokens + (now - b.at) * self.punch_rate)
            b.at = now
        if b.tokens < 1:
            self.stats_.punch_rate_limited += 1
            return False
        b.tokens -= 1
        total.tokens -= 1
        return True

    async def _punch(self, listener: Any, targets: Sequence[Candidate]) -> None:
        """Punch datagrams from the listener socket toward each address candidate (a burst,
        spaced a little, within each destination's budget)."""
        dests: list[tuple[str, int]] = []
        for kind, value in targets[:MAX_CANDIDATES]:
            if kind == "relay":
                continue
            addr = parse_address(value)
            dests.append((addr.host.strip("[]"), addr.port))
        for i in range(self.punch_burst):
            now = time.monotonic()
            for dest in dests:
                if self._allow_datagram(dest, now) and listener.punch(dest):
                    self.stats_.punch_datagrams += 1
            if i + 1 < self.punch_burst:
                await asyncio.sleep(self.punch_spacing)  # spacing between punch packets, not a sync

    def _no_early_data(self, theirs: Sequence[Candidate]) -> None:
        """Forget the session tickets held for these candidates: a 0-RTT dial would count as
        connected before any packet crossed the path, so a punch dial does the full handshake
        (only the peer's HELLO proves the path, and who is at its end)."""
        for kind, value in theirs:
            if kind != "relay":
                self.node.paths.forget_ticket(value)

    def _keep(self, peer: str, theirs: list[Candidate]) -> None:
        """Keep a peer's candidates (from its signed message), the newest peers at most
        :data:`MAX_DESTINATIONS`."""
        self._peer_candidates.pop(peer, None)
        self._peer_candidates[peer] = theirs
        while len(self._peer_candidates) > MAX_DESTINATIONS:
            self._peer_candidates.pop(next(iter(self._peer_candidates)))

    def _remember(self, peer: str, theirs: list[Candidate]) -> None:
        """The initiator: keep the answering peer's candidates and put its addresses in the
        peer book, to dial them."""
        self._keep(peer, theirs)
        urls = [v for k, v in theirs if k != "relay"]
        if urls:
            self.node.add_peer(peer, *urls)

    async def connect_direct(self, peer: str) -> bool:
        """Punch toward ``peer`` through the path messages take to it now (a relay, a registry
        that relays): True once a direct connection to it is up, False when none formed within
        ``direct_timeout`` (messages keep going through the relay)."""
        check_agent_id(peer)
        if self._direct(peer):
            return True
        listener = self._listener()
        if listener is None:
            raise ConfigError("hole punching needs a quic:// listener (and NodeConfig.one_socket)")
        st = self.stats_
        st.punch_attempts += 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        ours = [list(c) for c in self.candidates()]
        try:
            async with asyncio.timeout(self.direct_timeout):
                t0 = loop.time()
                reply = await self.node.request(
                    peer, MessageType.REGISTER_KEY, {"op": OP_PUNCH, "candidates": ours}
                )
                rtt = loop.time() - t0
                payload = reply.payload
                theirs = self._check(payload.get("candidates") if isinstance(payload, dict) else None)
                self._remember(peer, theirs)
                await self.node.send(peer, MessageType.REGISTER_KEY, {"op": OP_PUNCH_SYNC})
                await asyncio.sleep(rtt / 2)  # the peer gets SYNC half a round trip after it left
                # the burst goes on beside the dial; its first datagrams leave before the dial's
                self._spawn(self._punch(listener, theirs))
                self._no_early_data(theirs)
                await self._connect_or_accepted(peer)
        except (TimeoutError, IacError) as exc:
            if self._direct(peer):
                return self._succeeded(peer, started)
            st.punch_failures += 1
            log.info("no direct path to %s…: %s; staying on the relay", peer[:16], exc or "timed out",
                     extra={"peer": peer[:16]})  # fmt: skip
            return False
        return self._succeeded(peer, started)

    def _succeeded(self, peer: str, started: float) -> bool:
        took = asyncio.get_running_loop().time() - started
        self.stats_.punch_successes += 1
        self.stats_.last_direct_s = took
        conn = self.node.connection(peer)
        log.info("direct path to %s… after %.3f s (%s)", peer[:16], took, conn.peer.address if conn else "?",
                 extra={"peer": peer[:16]})  # fmt: skip
        return True

    async def _connect_or_accepted(self, peer: str) -> None:
        """Dial the peer's candidates, or see its own dial arrive: whichever comes first."""
        up = asyncio.Event()

        def on_peer(ev: Any) -> None:
            if ev.agent_id == peer and ev.up:
                up.set()

        remove = self.node.on_peer(on_peer)
        dial = asyncio.ensure_future(self.node.connect(peer))
        waiter = asyncio.ensure_future(up.wait())
        try:
            done, _ = await asyncio.wait({dial, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if dial in done and dial.exception() is not None and not self._direct(peer):
                raise dial.exception()  # type: ignore[misc]
        finally:
            remove()
            waiter.cancel()
            if not dial.done():
                dial.cancel()
            with contextlib.suppress(BaseException):
                await dial

    def _direct(self, peer: str) -> bool:
        return self.node.connection(peer) is not None

    def path(self, peer: str) -> str:
        """``direct`` (a connection of its own), ``relayed`` (through a relay) or ``none``."""
        if self._direct(peer):
            return "direct"
        if self.node.paths.relayed(peer):
            return "relayed"
        return "none"

    def watch(self, peer: str, *, backoff: Backoff | None = None) -> None:
        """Keep trying to upgrade ``peer`` to a direct path while it has none (with backoff; a
        direct path that dies is punched for again)."""
        if peer in self._watches:
            return
        self._watches[peer] = asyncio.get_running_loop().create_task(
            self._watch(peer, backoff or Backoff(initial=1.0, maximum=60.0))
        )

    async def _watch(self, peer: str, backoff: Backoff) -> None:
        while True:
            if self._direct(peer):
                backoff.reset()
                await self._wait_down(peer)
                continue
            try:
                ok = await self.connect_direct(peer)
            except IacError as exc:
                log.info("upgrade of %s… failed: %s", peer[:16], exc)
                ok = False
            if not ok:
                await asyncio.sleep(backoff.next_delay())  # backoff between punch rounds

    async def _wait_down(self, peer: str) -> None:
        down = asyncio.Event()

        def on_peer(ev: Any) -> None:
            if ev.agent_id == peer and not ev.up:
                down.set()

        remove = self.node.on_peer(on_peer)
        try:
            if self._direct(peer):
                await down.wait()
        finally:
            remove()

    def stats(self) -> dict[str, Any]:
        """Counters and which path each watched or punched peer uses."""
        st = self.stats_
        peers = {*self._watches, *self._peer_candidates}
        paths = {p: self.path(p) for p in sorted(peers)}
        return {
            "punch_attempts": st.punch_attempts,
            "punch_successes": st.punch_successes,
            "punch_failures": st.punch_failures,
            "punches_answered": st.punches_answered,
            "punch_datagrams": st.punch_datagrams,
            "punch_rate_limited": st.punch_rate_limited,
            "refused": st.refused,
            "host_names": st.host_names,
            "observed": st.observed,
            "last_direct_s": st.last_direct_s,
            "direct": sum(1 for v in paths.values() if v == "direct"),
            "relayed": sum(1 for v in paths.values() if v == "relayed"),
            "paths": paths,
            "candidates": [list(c) for c in self.candidates()],
        }

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


__all__ = [
    "MAX_DESTINATIONS",
    "NAT_OPS",
    "OP_OBSERVE",
    "OP_PUNCH",
    "OP_PUNCH_SYNC",
    "PUNCH_DATAGRAM",
    "NatStats",
    "Traversal",
    "check_candidates",
]
