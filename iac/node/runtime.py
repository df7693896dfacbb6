"""The runtime a :class:`~iac.Node` holds: identity, configuration and the collaborators, each with
one job, built with what they need in their constructors (the shared ones in one
:class:`~iac.node.parts.Parts`); start (replay store, listeners) and close (drain, GOAWAY); state
and counters.

* :class:`~iac.node.peers.Peers` — the peer book, routes, one connection per peer, peer events;
* :class:`~iac.node.outbox.Outbox` — build, sign, frame and send (directly or inside FORWARD);
* :class:`~iac.node.pending.Pending` — requests and ACK_REQUESTED messages until answered;
* :class:`~iac.node.pipeline.ReceivePipeline` — the checks, one call per batch, each decision
  naming its route;
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
from collections.abc import Mapping, Sequence
from typing import Any

from iac.errors import CloseCode, ConfigError, ConnectionClosed, IacError, LocalError
from iac.node.answers import Answers
from iac.node.config import NodeConfig, NodeStats, PeerEvent
from iac.node.crypto import CryptoWorker
from iac.node.dispatch import ContextFactory, Dispatcher
from iac.node.files import Files
from iac.node.inbound import Inbound
from iac.node.observe import Observers
from iac.node.ordered import OrderedDelivery
from iac.node.outbox import Outbox
from iac.node.parts import Parts
from iac.node.peers import KEPT_PROBE_INTERVAL, LinkWatch, Peers
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
from iac.wire.enums import MessageType
from iac.wire.identity import Identity

_PING = int(MessageType.PING)
log = logging.getLogger("iac.node")
#: The per-peer state of peers that went away is swept once a second up to this many connections,
#: beyond that once every ``connections // EXPIRE_SWEEP`` seconds (4 s at 1,000, 40 s at 10,000):
#: the sweep walks every peer's entries, so its cost per second stays that of this many peers.
EXPIRE_SWEEP = 250

#: The HELLO capability of streamed replies (docs/PROTOCOL.md, section 11, "Streaming replies").
_STREAM_CAPABILITY = "stream/1"


class NodeRuntime:
    """What runs under a :class:`~iac.Node`: its identity, configuration and collaborators, start
    and close, and its state. A :class:`~iac.Node` holds one and adds what agent code calls;
    ``context`` makes what a handler is called with (the Node's :class:`~iac.Context`)."""

    def __init__(
        self,
        identity: Identity | None,
        *,
        listen: str | Sequence[str],
        config: NodeConfig | None,
        replay_store: ReplayStore | None,
        clock: Clock | None,
        peers: dict[str, Sequence[str]] | None,
        context: ContextFactory,
    ) -> None:
        config = config if config is not None else NodeConfig()
        if clock is not None:
            config = dataclasses.replace(config, transport=dataclasses.replace(config.transport, clock=clock))
        if _STREAM_CAPABILITY not in config.transport.capabilities:
            # every node answers STREAM requests: its HELLOs say so (docs/PROTOCOL.md, "Capabilities")
            caps = (*config.transport.capabilities, _STREAM_CAPABILITY)
            config = dataclasses.replace(
                config, transport=dataclasses.replace(config.transport, capabilities=caps)
            )
        self.identity = identity if identity is not None else Identity.generate()
        self.config = config
        self.clock: Clock = config.transport.clock
        self.addresses: list[str] = []
        self._listen_urls = [listen] if isinstance(listen, str) else list(listen)
        self._replay_store_arg = replay_store
        self.listeners: list[Listener] = []
        self.started = self._closing = self.closed = False
        self._housekeeping: asyncio.Task[None] | None = None
        self.counters = c = Counters()
        self.tasks = TaskSet()
        self._conn_tasks = TaskSet()
        self.sessions = Sessions()
        self.router = Router(
            self.identity.agent_id,
            config.relay_policy,
            max_skew_us=config.transport.max_skew_us,
            max_seen=config.max_seen,
            max_routes=config.max_routes,
            broadcast_hop_limit=config.broadcast_hop_limit,
            unicast_hop_limit=config.unicast_hop_limit,
        )
        self.observers = Observers()
        #: What the receive side judges freshness, replay windows and expiry by: the node's clock,
        #: except where it jumps (docs/PROTOCOL.md, "Replay and freshness").
        self.rx_clock = SteadyClock(self.clock)
        self._clock_off = False
        #: The replay store's calls; the store itself is opened by :meth:`start`.
        self.store = StoreRunner()
        parts = self.parts = Parts(
            self.identity,
            config,
            self.sessions,
            self.router,
            c,
            self.tasks,
            self.observers,
            self.rx_clock,
            self.store,
        )
        self.peers = Peers(
            parts,
            listeners=self.listeners,
            start_reader=self._start_reader,
            on_connection=self._on_registered,
        )
        #: The connections told that something here waits on their peer (:meth:`_watch_links`).
        self._watch = LinkWatch()
        #: One worker thread for Ed25519 batches: received frames verified, outgoing ones signed.
        self.crypto = CryptoWorker()
        signer = Signer(self.identity, self.crypto if config.sign_in_worker else None)
        self.outbox = Outbox(parts, self.peers, signer)
        self.pending = Pending(parts, self.outbox, self.peers)
        self.streams = Streams(self.outbox, self.pending, self.observers)
        self.pipeline = ReceivePipeline(self.identity, config, self.store)
        self.answers = Answers(config, self.outbox, c)
        self.dispatch = Dispatcher(parts, self.answers, context)
        self.ordered = OrderedDelivery(parts, self.dispatch, self.answers)
        self.files = Files(parts, self.outbox, self.peers, self.answers)
        self.verifier = Verifier(self.crypto)
        self.inbound = Inbound(
            parts,
            pipeline=self.pipeline,
            verifier=self.verifier,
            peers=self.peers,
            outbox=self.outbox,
            answers=self.answers,
            pending=self.pending,
            streams=self.streams,
            dispatcher=self.dispatch,
            ordered=self.ordered,
            files=self.files,
        )
        self.peers.on_peer(self._on_peer_event)
        for aid, urls in (peers or {}).items():
            self.peers.add(aid, *urls)

    def _on_peer_event(self, event: PeerEvent) -> None:
        if not event.up:  # its parts cannot come any more, nor can ours go
            self.streams.fail_all(ConnectionClosed(f"the connection to {event.agent_id[:16]}… closed"),
                                   event.agent_id)  # fmt: skip
            self.dispatch.link_lost(event.agent_id)

    def _start_reader(self, conn: Connection) -> None:
        self._conn_tasks.spawn(self.inbound.read_loop(conn))

    def _on_registered(self, conn: Connection, new: bool) -> None:
        self._count_resumption(conn)
        if new:  # a (re)connection: resend what is unacknowledged at once
            self.pending.resend(conn.peer.agent_id)

    def _count_resumption(self, conn: Connection) -> None:
        """Count a QUIC connection's resumption and what became of its 0-RTT early data."""
        c, peer = self.counters, conn.peer
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

    async def start(self) -> None:
        """Open the replay store and the listeners."""
        if self.started:
            return
        self.started = True
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
        self.store.open(ReplayGuard(store))
        self.files.start()
        try:
            for url in self._listen_urls:
                lst = await transport_listen(url, self.identity, self._on_connection, config=c.transport)
                self.listeners.append(lst)
                self.addresses.extend(lst.addresses)
        except BaseException:
            await self.close()
            raise
        transport = c.transport
        if self.addresses and not transport.listen_addrs:
            transport = dataclasses.replace(transport, listen_addrs=tuple(self.addresses))
        self.peers.start(transport)
        self._housekeeping = self.tasks.spawn(self._housekeep())
        if c.fair_share:
            self.tasks.spawn(self.inbound.share_loop())
        # The leases of the ids this node holds, renewed every third of the store's lease.
        self.tasks.spawn(self.store.renew_forever(self.rx_clock))

    async def close(self) -> None:
        """Drain and close: stop accepting, let in-flight handlers and unacknowledged messages
        finish (up to ``drain_timeout``), then GOAWAY every connection."""
        if self._closing:
            return
        self._closing = True
        self.peers.closing = True
        self.dispatch.draining = self.ordered.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_timeout
        while loop.time() < deadline and (self.dispatch.busy or self.ordered.queued):
            await asyncio.sleep(0.01)
        while loop.time() < deadline and self.pending.waiting_for_acks():
            await asyncio.sleep(0.01)
        self.closed = self.peers.closed = True
        tasks = self.tasks.cancel_all()
        self.pending.fail_all(ConnectionClosed("node closed"))
        self.streams.fail_all(ConnectionClosed("node closed"))
        self.ordered.close()
        await self.peers.close_all()
        await asyncio.gather(*(lst.close() for lst in self.listeners), return_exceptions=True)
        conn_tasks = self._conn_tasks.cancel_all()
        await asyncio.gather(*tasks, *conn_tasks, return_exceptions=True)
        self.dispatch.threads.close()
        await self.files.close()
        self.crypto.close()
        if self.store.started:
            self.store.close()
        self.peers.end_events()

    def check_open(self) -> None:
        """Raise unless the node is started and not closed."""
        if not self.started:
            raise LocalError("the node is not started (use `async with node:` or `await node.start()`)")
        if self.closed:
            raise ConnectionClosed("the node is closed")

    async def _on_connection(self, conn: Connection) -> None:
        if self._closing:
            await conn.close(CloseCode.GOING_AWAY, "node is draining")
            return
        self.peers.register(conn)
        await self.inbound.read_loop(conn)

    async def _housekeep(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(1.0)
            now = self.rx_clock.now_us()
            off = abs(self.rx_clock.offset_us) > self.rx_clock.slack_us
            if off != self._clock_off:
                self._clock_off = off
                if off:
                    log.warning("the clock jumped %+.1f s: freshness and replay windows keep the steady time",
                                -self.rx_clock.offset_us / 1e6)  # fmt: skip
                else:
                    log.info("the clock agrees with the steady time again")
            self.store.expire(now)
            ticks += 1
            if ticks >= len(self.peers.table) // EXPIRE_SWEEP:  # a pass over the peers' state,
                ticks = 0  # EXPIRE_SWEEP peers' worth per second on average
                self._expire_peer_state(now)
            self.router.expire(now)
            self.files.expire()
            self.ordered.expire(now)
            self._watch_links()
            self._send_keepalives()

    def _send_keepalives(self) -> None:
        """A keep-alive message (a one-way PING, which counts as a frame at both ends, unlike a
        QUIC PING) on each outbound connection to a kept peer (registries, relays) every
        ``keepalive_messages`` s, so that neither side closes it idle and a NAT keeps its
        mapping; on QUIC the peer is probed too, so a dead one is redialed."""
        loop = asyncio.get_running_loop()
        bound = self.config.transport.probe_timeout
        for conn in self.peers.due_keepalives(loop.time(), self.config.keepalive_messages):
            self.tasks.spawn(self._keepalive(conn, bound))
        for conn in self.peers.due_probes(loop.time(), KEPT_PROBE_INTERVAL):
            self.tasks.spawn(self._probe(conn, bound))

    async def _probe(self, conn: Connection, bound: float) -> None:
        await conn.alive(bound)

    async def _keepalive(self, conn: Connection, bound: float) -> None:
        msg = self.outbox.build(conn.peer.agent_id, _PING, None)
        with contextlib.suppress(IacError):
            await self.outbox.send_on(conn, msg)
        await conn.alive(bound)

    def _watch_links(self) -> None:
        """Tell each connection whether something here waits on its peer (requests and
        unacknowledged messages, streams either way, file transfers): a QUIC peer is then
        probed while it is quiet, so a dead one is found within seconds (docs/IMPLEMENTATION.md,
        "Dead peers"), not after the idle timeout. Only the connections whose answer changed are
        told (:class:`LinkWatch`)."""
        waiting = {key[0] for key in self.streams.open} | self.dispatch.stream_links()
        waiting |= {peer for peer, _ in self.files.outgoing_keys()}
        waiting.update(self.pending.waited_on())
        self._watch.update(waiting, self.peers.table.by_peer())

    # --- state ------------------------------------------------------------------------------------

    def _expire_peer_state(self, now: int) -> None:
        """Forget what the node keeps per peer for peers that went away: sessions idle for
        2 × max_skew (a peer's replay window for them expired too), full verify budgets,
        in-flight permits and dial locks with nothing behind them."""
        connected = self.peers.connected_ids()

        def keep(peer: str) -> bool:
            return peer in connected or self.pending.waits_for(peer)

        self.sessions.expire(now, 2 * self.config.transport.max_skew_us, keep)
        self.inbound.expire(connected)
        self.pending.expire(connected)
        self.peers.expire()

    def peer_state(self) -> dict[str, int]:
        """How many entries the node keeps per peer, by table (all bounded or expired)."""
        return {
            "sessions": len(self.sessions),
            "verify_budgets": self.inbound.budgets,
            "in_flight": self.pending.tracked_peers,
            "dial_locks": self.peers.dial_locks,
            "ordered_streams": self.ordered.streams,
            "routes": self.router.route_count,
            "answer_cache": len(self.answers.cache),
            "session_tickets": len(self.peers.tickets) if self.peers.tickets is not None else 0,
        }

    def peer_links(self) -> dict[str, dict[str, Any]]:
        """Per peer that is connected or was asked something: ``connected``, ``transport``,
        ``address``, ``path`` (``direct``, ``relayed`` through a route, ``none``), ``rtt_ms``
        (smoothed request round trip, None before a reply), ``in_flight``."""
        out: dict[str, dict[str, Any]] = {}
        conns = self.peers.by_id()
        now = self.clock.now_us()
        for peer in {*conns, *self.pending.rtt}:
            conn = conns.get(peer)
            rtt = self.pending.rtt.get(peer)
            out[peer] = {
                "connected": conn is not None,
                "transport": conn.peer.transport if conn else "",
                "address": conn.peer.address if conn else "",
                "path": "direct" if conn else "relayed" if self.peers.route_hop(peer, now) else "none",
                "rtt_ms": round(rtt * 1000, 3) if rtt is not None else None,
                "in_flight": self.pending.in_flight(peer),
            }
        return out

    def stats(self, nat: Mapping[str, Any]) -> NodeStats:
        """The node's counters and state (``nat``: a NAT traversal role's counters)."""
        rs = self.router.stats
        pending, unacked = self.pending.counts()
        files, file_refused = self.files.stats()
        routing = {"delivered": rs.delivered, "forwarded": rs.forwarded, "originated": rs.originated}
        routing |= {
            "relayed": self.counters.relayed,
            "duplicates": rs.duplicates,
            "flood_ends": rs.flood_ends,
        }
        routing |= {"unsent": self.counters.broadcasts_unsent, "short": self.counters.broadcasts_short}
        return self.counters.snapshot(
            running=self.dispatch.running,
            backlog=self.dispatch.waiting,
            ordered_queued=self.ordered.queued,
            reorder_held=self.ordered.held,
            pending_requests=pending,
            unacked=unacked,
            answer_cache=len(self.answers.cache),
            connections=len(self.peers.table.connections()),
            routing=routing,
            route_refused={
                str(k): v for k, v in rs.refused.items() if v and k != RouteRefusal.DUPLICATE.value
            },
            files=files,
            file_refused=file_refused,
            peer_state=self.peer_state(),
            peer_links=self.peer_links(),
            nat=dict(nat),
        )


__all__ = ["NodeRuntime"]
