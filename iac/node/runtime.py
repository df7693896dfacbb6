"""The runtime under a :class:`~iac.Node`: identity, configuration and the collaborators, each with
one job, wired together; start (replay store, listeners) and close (drain, GOAWAY); state and
counters.

* :class:`~iac.node.peers.Peers` — the peer book, routes, one connection per peer, peer events;
* :class:`~iac.node.outbox.Outbox` — build, sign, frame and send (directly or inside FORWARD);
* :class:`~iac.node.pending.Pending` — requests and ACK_REQUESTED messages until answered;
* :class:`~iac.node.pipeline.ReceivePipeline` — the checks, sans-IO: refuse, duplicate or deliver;
* :class:`~iac.node.inbound.Inbound` — read loops, the verify budget, FORWARD frames;
* :class:`~iac.node.dispatch.Dispatcher` — handlers, slots and quotas, CANCEL and deadlines;
* :class:`~iac.node.ordered.OrderedDelivery` — reorder buffers for ORDERED sessions;
* :class:`~iac.node.files.Files` — file transfer, both ways;
* :class:`~iac.node.answers.Answers` — REPLY, ERROR and ACK, and the cache that re-answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

from iac.errors import CloseCode, ConfigError, ConnectionClosed, IacError, LocalError
from iac.node.answers import Answers
from iac.node.config import NodeConfig, NodeStats, PeerEvent
from iac.node.crypto import CryptoWorker
from iac.node.dispatch import Dispatcher
from iac.node.files import Files
from iac.node.inbound import Inbound
from iac.node.observe import Attachable, Observer, Observers
from iac.node.ordered import OrderedDelivery
from iac.node.outbox import Outbox
from iac.node.peers import Peers
from iac.node.pending import Pending
from iac.node.pipeline import ReceivePipeline
from iac.node.sign import Signer
from iac.node.stats import Counters
from iac.node.store import StoreRunner
from iac.node.streams import Streams
from iac.node.tasks import TaskSet
from iac.node.types import Sessions
from iac.node.verify import Verifier
from iac.protocol.clock import Clock, SteadyClock
from iac.protocol.replay import ReplayConfig, ReplayGuard, ReplayStore
from iac.protocol.routing import Router, RouteRefusal
from iac.protocol.tickets import check_cluster_stores
from iac.stores.memory import MemoryReplayStore
from iac.transport import listen as transport_listen
from iac.transport.base import Connection, Listener
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.identity import Identity

_PING = int(MessageType.PING)
log = logging.getLogger("iac.node")


class NodeRuntime:
    """What runs under a :class:`~iac.Node`: its identity, configuration and collaborators, start
    and close, and its state. :class:`~iac.Node` adds what agent code calls."""

    def __init__(
        self,
        identity: Identity | None = None,
        *,
        listen: str | Sequence[str] = (),
        config: NodeConfig | None = None,
        replay_store: ReplayStore | None = None,
        clock: Clock | None = None,
        peers: dict[str, Sequence[str]] | None = None,
        metrics: Attachable | None = None,
    ) -> None:
        config = config if config is not None else NodeConfig()
        if clock is not None:
            config = dataclasses.replace(config, transport=dataclasses.replace(config.transport, clock=clock))
        self.identity = identity if identity is not None else Identity.generate()
        self.config = config
        self.clock: Clock = config.transport.clock
        self.addresses: list[str] = []
        self._listen_urls = [listen] if isinstance(listen, str) else list(listen)
        self._replay_store_arg = replay_store
        self._listeners: list[Listener] = []
        self._started = self._closing = self._closed = self._started_store = False
        self._housekeeping: asyncio.Task[None] | None = None
        self._metrics = metrics
        self._detach: list[Callable[[], None]] = []
        c = self._c = Counters()
        tasks = self._tasks = TaskSet()
        self._conn_tasks = TaskSet()
        self._sessions = Sessions()
        self._router = Router(
            self.identity.agent_id,
            config.relay_policy,
            max_skew_us=config.transport.max_skew_us,
            max_seen=config.max_seen,
            max_routes=config.max_routes,
            broadcast_hop_limit=config.broadcast_hop_limit,
            unicast_hop_limit=config.unicast_hop_limit,
        )
        self._peers = Peers(self.identity, config, self._sessions, self._router, c, tasks)
        self._peers.listeners = self._listeners  # QUIC dials leave from a QUIC listener's socket
        #: Set by a NAT traversal role: its counters, under ``stats().nat``.
        self.nat_stats: Callable[[], Mapping[str, Any]] | None = None
        obs = self._observers = Observers()
        #: What the receive side judges freshness, replay windows and expiry by: the node's clock,
        #: except where it jumps (docs/PROTOCOL.md, "Replay and freshness").
        rx_clock = self._rx_clock = SteadyClock(self.clock)
        self._clock_off = False
        #: One worker thread for Ed25519 batches: received frames verified, outgoing ones signed.
        self._crypto = CryptoWorker()
        signer = Signer(self.identity, self._crypto if config.sign_in_worker else None)
        self._outbox = Outbox(
            self.identity, config, self._sessions, self._peers, self._router, c, obs, signer
        )
        self._pending = Pending(config, self._outbox, self._peers, c, tasks, obs)
        self._streams = Streams(self._outbox, self._pending, obs)
        self._pipeline = ReceivePipeline(self.identity, config)
        self._answers = Answers(config, self._outbox, c)
        self._dispatch = Dispatcher(
            config, self._pipeline, self._answers, c, tasks, rx_clock, self._context, obs
        )
        self._ordered = OrderedDelivery(config, self._dispatch, self._answers, c, tasks, rx_clock)
        self._files = Files(config, self._outbox, self._peers, self._pipeline, self._answers, c, tasks)
        self._verifier = Verifier(self._crypto)
        self._inbound = Inbound(
            config,
            self._pipeline,
            self._router,
            self._peers,
            self._outbox,
            self._answers,
            self._pending,
            self._dispatch,
            self._ordered,
            self._files,
            self._verifier,
            c,
            tasks,
            obs,
            self._streams,
            rx_clock,
        )
        self._peers.on_peer(self._on_peer_event)
        self._peers.start_reader = self._start_reader
        self._peers.on_connection = self._on_registered
        for aid, urls in (peers or {}).items():
            self._peers.add(aid, *urls)

    def _on_peer_event(self, event: PeerEvent) -> None:
        if not event.up:  # its parts cannot come any more, nor can ours go
            self._streams.fail_all(ConnectionClosed(f"the connection to {event.agent_id[:16]}… closed"),
                                   event.agent_id)  # fmt: skip
            self._dispatch.link_lost(event.agent_id)

    def _start_reader(self, conn: Connection) -> None:
        self._conn_tasks.spawn(self._inbound.read_loop(conn))

    def _on_registered(self, conn: Connection, new: bool) -> None:
        self._count_resumption(conn)
        if new:  # a (re)connection: resend what is unacknowledged at once
            self._pending.resend(conn.peer.agent_id)

    def _count_resumption(self, conn: Connection) -> None:
        """Count a QUIC connection's resumption and what became of its 0-RTT early data."""
        c, peer = self._c, conn.peer
        if not peer.dialed or not conn.early_data:
            c.resumed += peer.resumed
            if not peer.dialed and conn.early_data_accepted:
                c.early_received += 1
            return
        c.early_dials += 1

        def outcome(accepted: bool) -> None:  # once the server's HELLO verified
            c.resumed += conn.peer.resumed
            if accepted:
                c.early_accepted += 1
            else:
                c.early_rejected += 1
                what = "0-RTT early data rejected by %s…; sent again after the handshake"
                log.info(what, peer.agent_id[:16], extra={"peer": peer.agent_id, "transport": "quic"})

        if conn.early_data_accepted is None:
            conn.on_early_outcome = outcome
        else:
            outcome(conn.early_data_accepted)

    # --- lifecycle --------------------------------------------------------------------------------

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    async def start(self) -> None:
        """Open the replay store and the listeners."""
        if self._started:
            return
        self._started = True
        c = self.config
        store = self._replay_store_arg
        if store is None:
            skew = c.transport.max_skew_us
            replay = ReplayConfig(c.replay_window, skew, c.max_sessions, c.sessions_per_tenant)
            store = MemoryReplayStore(self.clock.now_us(), replay)
        if store.max_skew_us != c.transport.max_skew_us:
            raise ConfigError("the replay store's max_skew_us differs from the node's transport.max_skew_us")
        # Servers that share session tickets must share what stops a replayed 0-RTT flight.
        check_cluster_stores(c.transport.ticket_store, store, c.transport.nonce_cache)
        self._pipeline.start(StoreRunner(ReplayGuard(store)))
        self._started_store = True
        self._files.start()
        try:
            for url in self._listen_urls:
                lst = await transport_listen(url, self.identity, self._on_connection, config=c.transport)
                self._listeners.append(lst)
                self.addresses.extend(lst.addresses)
        except BaseException:
            await self.close()
            raise
        transport = c.transport
        if self.addresses and not transport.listen_addrs:
            transport = dataclasses.replace(transport, listen_addrs=tuple(self.addresses))
        self._peers.start(transport)
        self._housekeeping = self._tasks.spawn(self._housekeep())
        if c.fair_share:
            self._tasks.spawn(self._inbound.share_loop())
        # The leases of the ids this node holds, renewed every third of the store's lease.
        self._tasks.spawn(self._pipeline.store.renew_forever(self._rx_clock))
        if self._metrics is not None:
            self._detach.append(self._metrics.attach(self))

    async def close(self) -> None:
        """Drain and close: stop accepting, let in-flight handlers and unacknowledged messages
        finish (up to ``drain_timeout``), then GOAWAY every connection."""
        if self._closing:
            return
        self._closing = True
        self._peers.closing = True
        self._dispatch.draining = self._ordered.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_timeout
        while loop.time() < deadline and (self._dispatch.busy or self._ordered.queued):
            await asyncio.sleep(0.01)
        while loop.time() < deadline and self._pending.waiting_for_acks():
            await asyncio.sleep(0.01)
        self._closed = self._peers.closed = True
        tasks = self._tasks.cancel_all()
        self._pending.fail_all(ConnectionClosed("node closed"))
        self._streams.fail_all(ConnectionClosed("node closed"))
        self._ordered.close()
        await self._peers.close_all()
        await asyncio.gather(*(lst.close() for lst in self._listeners), return_exceptions=True)
        conn_tasks = self._conn_tasks.cancel_all()
        await asyncio.gather(*tasks, *conn_tasks, return_exceptions=True)
        self._dispatch.threads.close()
        await self._files.close()
        self._crypto.close()
        if self._started_store:
            self._pipeline.store.close()
        self._peers.end_events()
        for detach in self._detach:
            detach()

    def _context(self, msg: Message, payload: Any, expects_reply: bool, via: str = "") -> Any:
        """What a handler is called with (:class:`~iac.Context`, made by the Node)."""
        return (msg, payload, expects_reply)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<Node {self.agent_id[:16]}… {self.addresses}>"

    def _check_open(self) -> None:
        if not self._started:
            raise LocalError("the node is not started (use `async with node:` or `await node.start()`)")
        if self._closed:
            raise ConnectionClosed("the node is closed")

    async def _on_connection(self, conn: Connection) -> None:
        if self._closing:
            await conn.close(CloseCode.GOING_AWAY, "node is draining")
            return
        self._peers.register(conn)
        await self._inbound.read_loop(conn)

    async def _housekeep(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = self._rx_clock.now_us()
            off = abs(self._rx_clock.offset_us) > self._rx_clock.slack_us
            if off != self._clock_off:
                self._clock_off = off
                if off:
                    log.warning("the clock jumped %+.1f s: freshness and replay windows keep the steady time",
                                -self._rx_clock.offset_us / 1e6)  # fmt: skip
                else:
                    log.info("the clock agrees with the steady time again")
            self._pipeline.store.expire(now)
            self._expire_peer_state(now)
            self._router.expire(now)
            self._files.expire()
            self._ordered.expire(now)
            self._watch_links()
            self._send_keepalives()

    def _send_keepalives(self) -> None:
        """A keep-alive message (a one-way PING, which counts as a frame at both ends, unlike a
        QUIC PING) on each outbound connection to a kept peer (registries, relays) every
        ``keepalive_messages`` s, so that neither side closes it idle and a NAT keeps its
        mapping; on QUIC the peer is probed too, so a dead one is redialed."""
        loop = asyncio.get_running_loop()
        bound = self.config.transport.probe_timeout
        for conn in self._peers.due_keepalives(loop.time(), self.config.keepalive_messages):
            self._tasks.spawn(self._keepalive(conn, bound))

    async def _keepalive(self, conn: Connection, bound: float) -> None:
        msg = self._outbox.build(conn.peer.agent_id, _PING, None)
        with contextlib.suppress(IacError):
            await self._outbox.send_on(conn, msg)
        await conn.alive(bound)

    def _watch_links(self) -> None:
        """Tell each connection whether something here waits on its peer (requests and
        unacknowledged messages, streams either way, file transfers): a QUIC peer is then
        probed while it is quiet, so a dead one is found within seconds (docs/PROTOCOL.md,
        "Dead peers"), not after the idle timeout."""
        waiting = {key[0] for key in self._streams.open} | self._dispatch.stream_links()
        waiting |= {peer for peer, _ in self._files.outgoing_keys()}
        for conn in self._peers.table.connections():
            peer = conn.peer.agent_id
            conn.watch(peer in waiting or self._pending.in_flight(peer) > 0)

    # --- state ------------------------------------------------------------------------------------

    def _expire_peer_state(self, now: int) -> None:
        """Forget what the node keeps per peer for peers that went away: sessions idle for
        2 × max_skew (a peer's replay window for them expired too), full verify budgets,
        in-flight permits and dial locks with nothing behind them."""
        connected = self._peers.connected_ids()

        def keep(peer: str) -> bool:
            return peer in connected or self._pending.waits_for(peer)

        self._sessions.expire(now, 2 * self.config.transport.max_skew_us, keep)
        self._inbound.expire(connected)
        self._pending.expire(connected)
        self._peers.expire()

    def peer_state(self) -> dict[str, int]:
        """How many entries the node keeps per peer, by table (all bounded or expired)."""
        return {
            "sessions": len(self._sessions),
            "verify_budgets": self._inbound.budgets,
            "in_flight": self._pending.tracked_peers,
            "dial_locks": self._peers.dial_locks,
            "ordered_streams": self._ordered.streams,
            "routes": self._router.route_count,
            "answer_cache": len(self._answers.cache),
            "session_tickets": len(self._peers.tickets) if self._peers.tickets is not None else 0,
        }

    @property
    def peer_book(self) -> dict[str, list[str]]:
        """The peer book: the addresses this node may dial, by AgentId (a copy). What is connected
        now is :meth:`connected` / :meth:`connection`, and ``stats().peer_links``."""
        return {k: list(v) for k, v in self._peers.book.items()}

    @property
    def peers(self) -> dict[str, list[str]]:
        """Deprecated name of :attr:`peer_book` (it holds addresses, not connections)."""
        warnings.warn("Node.peers is now Node.peer_book", DeprecationWarning, stacklevel=2)
        return self.peer_book

    def peer_links(self) -> dict[str, dict[str, Any]]:
        """Per peer that is connected or was asked something: ``connected``, ``transport``,
        ``address``, ``path`` (``direct``, ``relayed`` through a route, ``none``), ``rtt_ms``
        (smoothed request round trip, None before a reply), ``in_flight``."""
        out: dict[str, dict[str, Any]] = {}
        conns = self._peers.by_id()
        now = self.clock.now_us()
        for peer in {*conns, *self._pending.rtt}:
            conn = conns.get(peer)
            rtt = self._pending.rtt.get(peer)
            out[peer] = {
                "connected": conn is not None,
                "transport": conn.peer.transport if conn else "",
                "address": conn.peer.address if conn else "",
                "path": "direct" if conn else "relayed" if self._peers.route_hop(peer, now) else "none",
                "rtt_ms": round(rtt * 1000, 3) if rtt is not None else None,
                "in_flight": self._pending.in_flight(peer),
            }
        return out

    def count_short_broadcast(self) -> None:
        """A role of this node (the registry) saw a broadcast miss agents it knows: counted in
        ``stats().routing["short"]``."""
        self._c.broadcasts_short += 1

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer``'s hooks as messages move (:class:`~iac.node.observe.Observer`);
        returns a function that removes it again."""
        return self._observers.add(observer)

    @property
    def exposed(self) -> list[str]:
        return sorted(self._dispatch.exposed)

    def connected(self, peer: str) -> bool:
        return self._peers.table.get(peer) is not None

    def connection(self, peer: str) -> Connection | None:
        """The live connection to ``peer``, or None."""
        return self._peers.table.get(peer)

    def stats(self) -> NodeStats:
        rs = self._router.stats
        pending, unacked = self._pending.counts()
        files, file_refused = self._files.stats()
        routing = {"delivered": rs.delivered, "forwarded": rs.forwarded, "originated": rs.originated}
        routing |= {"relayed": self._c.relayed, "duplicates": rs.duplicates, "flood_ends": rs.flood_ends}
        routing |= {"unsent": self._c.broadcasts_unsent, "short": self._c.broadcasts_short}
        return self._c.snapshot(
            running=self._dispatch.running,
            backlog=self._dispatch.waiting,
            ordered_queued=self._ordered.queued,
            reorder_held=self._ordered.held,
            pending_requests=pending,
            unacked=unacked,
            answer_cache=len(self._answers.cache),
            connections=len(self._peers.table.connections()),
            routing=routing,
            route_refused={
                str(k): v for k, v in rs.refused.items() if v and k != RouteRefusal.DUPLICATE.value
            },
            files=files,
            file_refused=file_refused,
            peer_state=self.peer_state(),
            peer_links=self.peer_links(),
            nat=dict(self.nat_stats()) if self.nat_stats is not None else {},
        )


__all__ = ["NodeRuntime"]
