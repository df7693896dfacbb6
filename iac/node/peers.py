"""Who this node talks to: the peer book, static routes, one connection per peer, dialing, and
peer up/down events."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

from iac.errors import CloseCode, ConfigError, ConnectionClosed, IacError, LocalError, TransportError
from iac.node.config import PeerEvent
from iac.node.parts import Parts
from iac.protocol.clock import Clock
from iac.protocol.handshake import instance_of
from iac.transport import dial as transport_dial
from iac.transport.base import (
    Address,
    Connection,
    ConnectionTable,
    Listener,
    TransportConfig,
    Verdict,
    parse_address,
)
from iac.transport.dialer import Dialer
from iac.wire.identity import Identity, check_agent_id

log = logging.getLogger("iac.node")

#: A kept peer whose connection dropped is dialed again after this, then at doubling intervals
#: up to ``REDIAL_MAX`` seconds.
REDIAL_FIRST = 0.25
REDIAL_MAX = 1.0
#: A kept peer's outbound connection is probed this often (a QUIC PING; the kernel tells TLS/TCP):
#: a registry or relay that restarted answers it with a stateless reset, and is dialed again.
KEPT_PROBE_INTERVAL = 2.0


class LinkWatch:
    """Which connections are told that something on this side waits on their peer
    (:meth:`Connection.watch`). :meth:`update` tells only the connections whose answer changed
    (a connection starts unwatched), so it costs what is waited on, not a pass over every
    connection: a node holding 10,000 quiet peers pays nothing for them each second."""

    def __init__(self) -> None:
        self._watched: dict[str, Connection] = {}

    def update(self, waiting: Iterable[str], conns: Mapping[str, Connection]) -> None:
        """``waiting``: the peers waited on now; ``conns``: the open connections by peer."""
        waiting = set(waiting)
        watched = self._watched
        for peer in [p for p in watched if p not in waiting]:
            watched.pop(peer).watch(False)
        for peer in waiting:
            conn = conns.get(peer)
            if conn is None:
                watched.pop(peer, None)  # not connected: nothing to tell, nothing to hold
            elif watched.get(peer) is not conn:
                conn.watch(True)
                watched[peer] = conn

    def __len__(self) -> int:
        return len(self._watched)


class Peers:
    """The peer book (addresses per AgentId), static routes, the connection table and the dialer.

    ``on_connection(conn, new)`` is called for every registered connection that this node keeps
    (``new``: it replaced no live connection to that peer, so what is unacknowledged toward the
    peer should be sent again at once)."""

    def __init__(
        self,
        parts: Parts,
        *,
        listeners: Sequence[Listener],
        start_reader: Callable[[Connection], None],
        on_connection: Callable[[Connection, bool], None],
    ) -> None:
        self.identity = identity = parts.identity
        self.config = parts.config
        self._sessions = parts.sessions
        self._router = parts.router
        self._c = parts.counters
        self._tasks = parts.tasks
        self.book: dict[str, list[str]] = {}
        self.static_routes: dict[str, str] = {}
        self.table = ConnectionTable(identity.agent_id)
        self._dial_locks: dict[str, asyncio.Lock] = {}
        self._dialer: Dialer | None = None
        self._transport: TransportConfig | None = None
        self._live: set[str] = set()
        #: (peer, instance) pairs already logged as a second live process with one key: one line
        #: each (bounded: cleared when full).
        self._twins: set[tuple[str, str]] = set()
        #: Peers this node keeps connected (its registries; its relays, the ``via`` of its static
        #: routes): their outbound connection gets a keep-alive message every
        #: ``NodeConfig.keepalive_messages`` s and is redialed when it drops.
        self.kept: set[str] = set()
        self._kept_sent: dict[str, float] = {}
        self._kept_probed: dict[str, float] = {}  # when each kept peer was last probed
        self._redials: set[str] = set()
        self.closing = False
        self._callbacks: list[Callable[[PeerEvent], Any]] = []
        self._queues: list[asyncio.Queue[PeerEvent | None]] = []
        #: Start reading a connection this side dialed.
        self._start_reader = start_reader
        self._on_connection = on_connection
        self.closed = False
        self.tickets: Any = None
        #: The node's listeners (the runtime's list, filled as it starts); QUIC dials leave from a
        #: QUIC one's socket.
        self._listeners = listeners

    def start(self, transport: TransportConfig) -> None:
        if self.config.one_socket:
            for lst in self._quic_listeners():
                lst.check_dial()  # ConfigError on a QUIC library other than aioquic 1.7
        self._dialer = Dialer(self.identity, transport, dial_fn=self._dial_one)
        self._transport = transport
        self._prepare(url for urls in self.book.values() for url in urls)

    def _prepare(self, urls: Iterable[str]) -> None:
        """Build what the first dial of a TLS address would (its SSL context), so that the first
        request of a process costs what a later dial does."""
        if self._transport is not None and any(u.startswith("tls://") for u in urls):
            from iac.transport.tls import prepare_dial

            prepare_dial(self.identity, self._transport)

    def _quic_listeners(self) -> list[Any]:
        return [lst for lst in self._listeners if hasattr(lst, "can_dial")]

    def quic_listener(self, host: str = "") -> Any:
        """The QUIC listener a dial to ``host`` leaves from: one of the host's address family
        (an IPv6 literal: IPv6), else any (the dial uses a socket of its own when the family
        turns out not to fit), else None."""
        if not self.config.one_socket:
            return None
        usable = [lst for lst in self._quic_listeners() if lst.can_dial]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        for lst in usable:
            if lst.family == family:
                return lst
        return usable[0] if usable else None

    # --- the peer book and routes -----------------------------------------------------------------

    def add(self, agent_id: str, *urls: str) -> None:
        check_agent_id(agent_id)
        for url in urls:
            parse_address(url)
        known = self.book.setdefault(agent_id, [])
        known.extend(u for u in urls if u not in known)
        self._prepare(urls)

    def add_route(self, dest: str, via: str) -> None:
        check_agent_id(dest)
        check_agent_id(via)
        if dest == via or dest == self.identity.agent_id:
            raise ConfigError("a route leads to another node through a third one")
        self.static_routes[dest] = via
        self._router.add_route(dest, via)

    def remove_route(self, dest: str) -> None:
        self.static_routes.pop(dest, None)
        self._router.remove_route(dest)

    def connected_ids(self) -> set[str]:
        return {c.peer.agent_id for c in self.table.connections()}

    def by_id(self) -> Mapping[str, Connection]:
        """The open connections by peer, live (:meth:`ConnectionTable.by_peer`): what a FORWARD
        frame or a route lookup asks costs the same at 10,000 connections as at one."""
        return self.table.by_peer()

    def route_hop(self, dest: str, now_us: int) -> str | None:
        """The relay toward ``dest`` when it is not connected: a connected next hop from the route
        table (static or learned), else the static route's relay (to be dialed)."""
        hop = self._router.next_hop(dest, self.table.by_peer(), now_us)
        if hop is not None and hop != dest:
            return hop
        return self.static_routes.get(dest)

    async def first_hop(self, peer: str, via: str | None, now_us: int) -> Connection:
        """The connection a message to ``peer`` leaves on (dialing the peer or the relay if needed)."""
        if via is not None and via != peer:
            return await self.connect(via)
        conn = self.table.get(peer)
        if conn is not None:
            return conn
        hop = self.route_hop(peer, now_us)
        if hop is not None:
            return await self.connect(hop)
        return await self.connect(peer)

    # --- connections ------------------------------------------------------------------------------

    async def connect(self, peer: str) -> Connection:
        conn = self.table.get(peer)
        if conn is not None:
            return conn
        lock = self._dial_locks.setdefault(peer, asyncio.Lock())
        async with lock:
            conn = self.table.get(peer)
            if conn is not None:
                return conn
            if self.closed:
                raise ConnectionClosed("the node is closed")
            urls = self.book.get(peer)
            if not urls:
                raise TransportError(f"no connection to {peer[:16]}… and no address for it in the peer book")
            if self._dialer is None:
                raise LocalError("the node is not started")
            conn = await self._dialer.dial(urls, expect=peer)
            self._start_reader(conn)
            return self.register(conn)

    async def _dial_one(
        self, addr: Address, identity: Identity, expect: str | None, config: TransportConfig
    ) -> Connection:
        sid = self._sessions.session(expect).session_id if expect else 0
        tickets = self._ticket_store() if addr.scheme == "quic" and self.config.zero_rtt else None
        listener = self.quic_listener(addr.host) if addr.scheme == "quic" else None
        if listener is not None:
            conn: Connection = await listener.dial(
                addr, expect=expect, tickets=tickets, session_id=sid, config=config
            )
            return conn
        return await transport_dial(
            addr, identity, expect=expect, config=config, session_id=sid, tickets=tickets
        )

    def _ticket_store(self) -> Any:
        """The client session tickets (made on the first QUIC dial: it imports the QUIC adapter)."""
        if self.tickets is None:
            from iac.transport.quic import ClientTicketStore

            self.tickets = ClientTicketStore(self.config.tickets_file)
        return self.tickets

    def register(self, conn: Connection) -> Connection:
        """Enter ``conn`` in the table; return the connection kept for its peer. A second
        connection of a key that needs a probe of the old one first (a new process, or one
        that names none: docs/PROTOCOL.md, "Duplicate connections") is settled in a task;
        until then the old one is kept."""
        peer = conn.peer.agent_id
        old = self.table.get(peer)
        if old is not None and old is not conn and self.table.verdict(old, conn) is Verdict.PROBE:
            self._tasks.spawn(self._settle(old, conn))
            return old
        kept, to_close = self.table.add(conn)
        if to_close is not None:
            self._tasks.spawn(to_close.close(CloseCode.GOING_AWAY, "duplicate connection"))
        if peer not in self._live:
            self._live.add(peer)
            self._emit(PeerEvent(peer, True, kept.peer.transport, kept.peer.address))
        self._on_connection(conn, kept is conn)
        return kept

    async def _settle(self, old: Connection, new: Connection) -> None:
        """Probe ``old``: dead, ``new`` replaces it; alive, ``new`` is refused."""
        alive = await old.alive(self.config.transport.probe_timeout)
        if new.closed:
            return
        peer = new.peer.agent_id
        was, now = instance_of(old.peer.hello), instance_of(new.peer.hello)
        if alive and not old.closed:
            if was and now and was != now:
                self._twin(peer, now, f"refused its connection from {new.peer.address}: another process "
                           f"with this key (instance {was}) is connected and alive")  # fmt: skip
                await new.close(CloseCode.DUPLICATE_IDENTITY, "another live process holds this key")
            else:
                await new.close(CloseCode.GOING_AWAY, "duplicate connection")
            return
        if self.table.get(peer) is None or not self.table.replace(old, new):
            self.register(new)  # the old one went meanwhile
            return
        who = "a new process" if was != now else "the same process"
        log.info("peer %s… reconnected (%s): its old connection was dead", peer[:16], who)
        self._tasks.spawn(old.close(CloseCode.GOING_AWAY, "replaced by a new connection of this key"))
        self._on_connection(new, True)

    def _twin(self, peer: str, instance: str, text: str) -> None:
        """Log, once per (peer, instance), that two live processes hold ``peer``'s key."""
        if (peer, instance) in self._twins:
            return
        if len(self._twins) >= 1024:
            self._twins.clear()
        self._twins.add((peer, instance))
        log.warning("two live processes hold the key of %s…: %s", peer[:16], text)

    # --- connections kept alive -------------------------------------------------------------------

    def is_kept(self, peer: str) -> bool:
        return peer in self.kept or peer in self.static_routes.values()

    def keep(self, peer: str) -> None:
        """Keep a connection to ``peer`` (a registry, a relay): dial it now and again whenever it
        drops; send it keep-alives. Only outbound connections are kept alive (a peer cannot
        hold an inbound connection of this node open by being kept)."""
        check_agent_id(peer)
        self.kept.add(peer)
        if self.table.get(peer) is None:
            self._tasks.spawn(self._redial(peer, first=0.0))

    def unkeep(self, peer: str) -> None:
        self.kept.discard(peer)
        self._kept_sent.pop(peer, None)
        self._kept_probed.pop(peer, None)

    def due_keepalives(self, now: float, interval: float) -> list[Connection]:
        """The outbound connections to kept peers whose keep-alive is due at ``now``."""
        due = []
        for peer in [p for p in self._kept_sent if not self.is_kept(p)]:
            del self._kept_sent[peer]
        for peer in self.kept | set(self.static_routes.values()):
            conn = self.table.get(peer)
            if conn is None or not conn.peer.dialed:
                continue
            if now - self._kept_sent.get(peer, -interval) >= interval:
                self._kept_sent[peer] = now
                due.append(conn)
        return due

    def due_probes(self, now: float, interval: float) -> list[Connection]:
        """The outbound connections to kept peers whose liveness probe is due at ``now`` (one
        every ``interval`` s: a kept peer that died is found within ``interval`` plus the probe's
        bound, one that restarted on QUIC within ``interval``, by its stateless reset)."""
        for peer in [p for p in self._kept_probed if not self.is_kept(p)]:
            del self._kept_probed[peer]
        due = []
        for peer in self.kept | set(self.static_routes.values()):
            conn = self.table.get(peer)
            if conn is None or not conn.peer.dialed:
                continue
            if now - self._kept_probed.get(peer, -interval) >= interval:
                self._kept_probed[peer] = now
                due.append(conn)
        return due

    async def _redial(self, peer: str, first: float = REDIAL_FIRST) -> None:
        """Dial a kept peer until it answers (every ``REDIAL_MAX`` s at most, so a restarted
        registry is found again within about a second of accepting connections)."""
        if peer in self._redials:
            return
        self._redials.add(peer)
        delay = first
        try:
            while not self.closing and self.is_kept(peer) and self.table.get(peer) is None:
                await asyncio.sleep(delay)
                delay = min(max(delay * 2, REDIAL_FIRST), REDIAL_MAX)
                if peer not in self.book or self._dialer is None:
                    continue
                try:
                    await self.connect(peer)
                except IacError as exc:
                    log.debug("redialing kept peer %s…: %s", peer[:16], exc)
        finally:
            self._redials.discard(peer)

    def unregister(self, conn: Connection) -> None:
        """``conn`` ended (its read loop stopped)."""
        peer = conn.peer.agent_id
        err = conn.close_error
        if getattr(err, "code", None) == CloseCode.DUPLICATE_IDENTITY and conn.peer.dialed:
            self._twin(peer, instance_of(conn.local_hello), "it refused this process's connection: "
                       "another process with this node's key is connected to it")  # fmt: skip
        if getattr(err, "reason", None) == "stateless_reset" and conn.peer.dialed:
            # The server restarted: a ticket of the old process would bind the next HELLO (sent as
            # early data) to the old certificate, and the new process would refuse it.
            self.forget_ticket(conn.peer.address)
        self.table.remove(conn)
        if self.table.get(peer) is None and peer in self._live:
            self._live.discard(peer)
            self._emit(PeerEvent(peer, False, conn.peer.transport, conn.peer.address))
        if self.table.get(peer) is None and self.is_kept(peer) and not self.closing:
            self._tasks.spawn(self._redial(peer))

    def forget_ticket(self, address: str) -> None:
        """Drop the session ticket held for ``address`` (its next dial does a full handshake)."""
        if self.tickets is not None:
            self.tickets.pop(address)

    @property
    def dial_locks(self) -> int:
        return len(self._dial_locks)

    def expire(self) -> None:
        """Forget the dial locks of peers that are not being dialed."""
        for peer in [p for p, lock in self._dial_locks.items() if not lock.locked()]:
            del self._dial_locks[peer]

    async def close_all(self) -> None:
        self.closing = True
        await asyncio.gather(
            *(conn.close(CloseCode.GOING_AWAY, "node shutting down") for conn in self.table.connections()),
            return_exceptions=True,
        )

    # --- peer events ------------------------------------------------------------------------------

    def on_peer(self, callback: Callable[[PeerEvent], Any]) -> Callable[[], None]:
        self._callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(callback)

        return remove

    async def events(self) -> AsyncIterator[PeerEvent]:
        q: asyncio.Queue[PeerEvent | None] = asyncio.Queue(self.config.event_queue)
        self._queues.append(q)
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    return
                yield ev
        finally:
            self._queues.remove(q)

    def end_events(self) -> None:
        for q in self._queues:
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)

    def _emit(self, event: PeerEvent) -> None:
        state = "up" if event.up else "down"
        log.info("peer %s… %s (%s %s)", event.agent_id[:16], state, event.transport, event.address,
                 extra={"peer": event.agent_id[:16], "transport": event.transport})  # fmt: skip
        for cb in list(self._callbacks):
            try:
                res = cb(event)
                if inspect.isawaitable(res):
                    self._tasks.spawn_logged(res, "peer event callback")
            except Exception:
                log.exception("peer event callback failed")
        for q in self._queues:
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                self._c.peer_events_dropped += 1
            q.put_nowait(event)


class Paths:
    """What a NAT traversal role (:class:`~iac.mesh.Traversal`) uses of a node's connections:
    the QUIC listener it punches from, the session tickets it forgets, and whether a peer is
    reached through a relay (:attr:`iac.Node.paths`)."""

    def __init__(self, peers: Peers, clock: Clock) -> None:
        self._peers = peers
        self._clock = clock

    def quic_listener(self) -> Any:
        """The QUIC listener this node's dials leave from (``NodeConfig.one_socket``), or None."""
        return self._peers.quic_listener()

    def forget_ticket(self, address: str) -> None:
        """Drop the session ticket held for ``address`` (its next dial does a full handshake)."""
        self._peers.forget_ticket(address)

    def relayed(self, peer: str) -> bool:
        """True when ``peer`` has no connection of its own but a relay toward it (a connected
        next hop of the route table, or a static route's relay)."""
        return self._peers.route_hop(peer, self._clock.now_us()) is not None


__all__ = ["Paths", "Peers"]
