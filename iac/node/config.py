"""The node's configuration, its topology policy, and the values it reports (peer events, stats).

Everything a :class:`~iac.Node` bounds is a field of :class:`NodeConfig`, with
its default written next to it. The transport's own bounds stay in the embedded
:class:`~iac.transport.base.TransportConfig` (``NodeConfig.transport``), which
also carries the clock.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from iac.errors import ConfigError
from iac.node.fair import DEFAULT_THREADS
from iac.protocol.files import DEFAULT_MAX_SIZE, DEFAULT_MAX_TRANSFERS, DEFAULT_WINDOW, MAX_WINDOW
from iac.protocol.guards import ContentGuard
from iac.protocol.replay import MIN_WINDOW_SIZE
from iac.protocol.routing import (
    DEFAULT_BROADCAST_HOP_LIMIT,
    DEFAULT_HOP_LIMIT,
    DEFAULT_MAX_ROUTES,
    DEFAULT_MAX_SEEN,
    RelayPolicy,
)
from iac.transport.base import TransportConfig
from iac.wire.dicts import DictionarySet, default_dictionary
from iac.wire.identity import check_agent_id

# --- policy ---------------------------------------------------------------------------------------


class Topology:
    """A directed sender → receiver allow-list (the topology step of the receive pipeline).

    Once a node is given one, a pair that is not listed is refused with
    ``policy_denied``; a node without one is open (any authenticated peer).
    ``"*"`` on either side of a pair matches any AgentId.
    """

    __slots__ = ("_pairs",)

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._pairs: set[tuple[str, str]] = set()
        for src, dst in pairs:
            self.allow(src, dst)

    def allow(self, sender: str, receiver: str) -> None:
        for aid in (sender, receiver):
            if aid != "*":
                check_agent_id(aid)
        self._pairs.add((sender, receiver))

    def allows(self, sender: str, receiver: str) -> bool:
        p = self._pairs
        return (sender, receiver) in p or (sender, "*") in p or ("*", receiver) in p or ("*", "*") in p

    def __len__(self) -> int:
        return len(self._pairs)

    def __repr__(self) -> str:
        return f"Topology({len(self._pairs)} pairs)"


def _default_transport() -> TransportConfig:
    return TransportConfig(dictionaries=DictionarySet([default_dictionary()]))


@dataclass(frozen=True)
class NodeConfig:
    """Settings of a :class:`~iac.Node`. Every bound is here; times are seconds.

    The transport settings (frame size, queues, timeouts, dictionaries,
    ``max_skew_us`` and the clock) are in ``transport``.
    """

    #: Transport bounds and the clock; by default the shipped dictionary is announced.
    transport: TransportConfig = field(default_factory=_default_transport)
    #: Replay window per session (``N``, at least 1024); a sender keeps fewer than N unacknowledged.
    replay_window: int = 1024
    #: Most sender sessions tracked by the in-memory replay store.
    max_sessions: int = 100_000
    #: One tenant's share of them: per sender, and per neighbour that delivered them (its
    #: FORWARDs included). None: 1 % of ``max_sessions`` (``ReplayConfig.tenant_sessions``).
    sessions_per_tenant: int | None = None
    #: ``request``/``call``/``delegate`` timeout when none is given.
    request_timeout: float = 30.0
    #: Per peer: requests plus ACK_REQUESTED messages waiting for their answer; ``send``/``request``
    #: wait while this many are out. Must be below ``replay_window``.
    max_in_flight: int = 64
    #: Handlers running at once (the whole node).
    max_handlers: int = 64
    #: Accepted messages waiting for a handler slot; beyond it a message is refused with ``busy``.
    max_backlog: int = 1024
    #: Per-peer quota: one peer's messages running or waiting; beyond it ``busy``.
    max_per_peer: int = 512
    #: First retransmission of an unacknowledged message; doubles up to ``retransmit_max``.
    retransmit_initial: float = 0.25
    retransmit_max: float = 2.0
    #: An ACK_REQUESTED message not acknowledged by then fails with DeliveryError (<= max_skew).
    delivery_timeout: float = 30.0
    #: Answers (REPLY/ERROR) kept to re-answer a retransmitted request instead of handling it twice.
    answer_cache: int = 4096
    #: Signature checks per second per peer (token bucket) and the burst; a bad signature costs
    #: ``bad_signature_cost`` tokens. When a peer's bucket is empty the node stops reading from it.
    verify_rate: float = 50_000.0
    verify_burst: float = 10_000.0
    bad_signature_cost: float = 100.0
    #: Sign outgoing messages in batches on the crypto worker thread (the one that verifies received
    #: batches) while two or more tasks send in one turn of the loop; one sender at a time signs on
    #: the loop (``iac.node.sign``). False: always on the loop.
    sign_in_worker: bool = False
    #: Directed sender → receiver allow-list; None = open (the default policy).
    topology: Topology | None = None
    #: Who may send DELEGATE_TASK; None = any sender the topology allows.
    delegators: frozenset[str] | None = None
    #: Content guards run in order after the schema check (none by default).
    guards: tuple[ContentGuard, ...] = ()
    #: Message types accepted (None = every known type but UNKNOWN).
    allowed_types: frozenset[int] | None = None
    #: Run sync handlers and exposed functions in a worker thread (else inline on the loop).
    sync_in_thread: bool = True
    #: With ``sync_in_thread``: a plain function that returned within 0.5 ms on 64 calls in a row
    #: runs on the loop from then on (a thread hop costs more than it); a call there that takes
    #: over 5 ms sends it back to the threads, with a WARNING from ``iac.node`` naming it (after
    #: three, for good). False: always on a thread.
    adaptive_sync: bool = True
    #: While the event loop is saturated, hold the peer that sends the most frames to a share of
    #: it (its verify budget is cut until the loop has time again), so that one peer's flood of
    #: valid messages does not slow every other peer down (``iac.node.fair.LoopShare``). Turn it
    #: off for nodes that share one event loop with many others (a test mesh in one process):
    #: there the loop's lag is not the node's own.
    fair_share: bool = True
    #: Worker threads for them; when all are busy, the next call is taken from the waiting peers
    #: in turn, so one peer's flood of calls does not queue ahead of everyone else's.
    handler_threads: int = DEFAULT_THREADS
    #: Cancel a handler whose request's deadline passes (ERROR ``timeout``).
    enforce_deadline: bool = True
    #: Longest a stream's handler runs (seconds), whatever deadline the consumer asked: then it
    #: ends with ERROR ``timeout``, so no consumer pins a handler slot for longer. A stream also
    #: ends, with no answer, once this node has no connection to the peer it came from.
    max_stream_time: float = 600.0
    #: Keep-alive messages (a one-way PING) on the outbound connections to the peers this node
    #: keeps connected (its registries, the relays of its static routes), every this many
    #: seconds: below the idle timeout and a NAT's UDP mapping timeout (30 s on Linux).
    keepalive_messages: float = 20.0
    #: On close: how long in-flight handlers and unacknowledged messages get to finish.
    drain_timeout: float = 5.0
    #: Reorder buffer: most entries held per ordered session.
    reorder_max_buffered: int = 1024
    #: Resume QUIC sessions: a reconnect to a peer whose session ticket this node holds sends its
    #: HELLO and first messages as 0-RTT early data (docs/PROTOCOL.md, "0-RTT").
    zero_rtt: bool = True
    #: Where session tickets are kept: None, in memory (a reconnect resumes); a file (mode 0600,
    #: like a key file) lets a restarted agent resume too.
    tickets_file: str | os.PathLike[str] | None = None
    #: Peer events kept for ``peer_events()`` readers that fall behind (oldest dropped, counted).
    event_queue: int = 1024
    #: QUIC dials leave from the node's QUIC listener socket (one UDP socket per node), so the
    #: address a peer or a registry observes is the one peers can reach (docs/PROTOCOL.md,
    #: "Through NATs"). Needs aioquic 1.7: on another QUIC library ``start()`` refuses; False
    #: dials from a socket per connection.
    one_socket: bool = True
    #: Whether private, loopback and link-local addresses go into what this node publishes (its
    #: registry record, the candidates it sends when hole punching). False keeps LAN addresses
    #: to the LAN (docs/PROTOCOL.md, "Through NATs").
    publish_private_addresses: bool = True

    # --- relays and broadcast (docs/PROTOCOL.md, "Relays and broadcast") ---
    #: What this node relays for others. Default: re-flood broadcasts, relay no unicast.
    relay_policy: RelayPolicy = field(default_factory=RelayPolicy)
    #: Hop limit this node puts on its own broadcasts / relayed unicast messages.
    broadcast_hop_limit: int = DEFAULT_BROADCAST_HOP_LIMIT
    unicast_hop_limit: int = DEFAULT_HOP_LIMIT
    #: Seen-cache of broadcasts and relayed messages (kept 2 × max_skew); full = new ones refused.
    max_seen: int = DEFAULT_MAX_SEEN
    #: Learned reverse routes and relayed requests kept.
    max_routes: int = DEFAULT_MAX_ROUTES

    # --- file transfer (docs/PROTOCOL.md, "File transfer") ---
    #: Where received files land. None: this node takes no files (a chunk is refused with ERROR
    #: ``no_handler``, which ends the sender's transfer).
    inbox_dir: str | os.PathLike[str] | None = None
    #: Largest file accepted, and transfers received at once.
    max_file_size: int = DEFAULT_MAX_SIZE
    max_transfers: int = DEFAULT_MAX_TRANSFERS
    #: Replace a file of the same name in the inbox (else the transfer fails with ``file_exists``).
    overwrite_files: bool = False
    #: fsync a received file before it is renamed into the inbox.
    durable_files: bool = True
    #: A partial incoming transfer idle this long closes its file (it can still resume later).
    file_idle_timeout: float = 300.0
    #: A partial incoming transfer idle this long (no chunk, in this process or an earlier one) is
    #: deleted with its state file; a sender that comes back later starts it over.
    file_partial_ttl: float = 24 * 3600.0
    #: Sender: chunks in flight, chunk size (None: 256 KiB), and when an unacknowledged chunk is resent.
    file_window: int = DEFAULT_WINDOW
    file_chunk_size: int | None = None
    file_retransmit_timeout: float = 5.0

    def __post_init__(self) -> None:
        if self.replay_window < MIN_WINDOW_SIZE:
            raise ConfigError(f"replay_window must be at least {MIN_WINDOW_SIZE}")
        if not 1 <= self.max_in_flight < self.replay_window:
            raise ConfigError(
                "max_in_flight must be in 1 .. replay_window - 1 (fewer unacknowledged than the window)"
            )
        for name in (
            "max_handlers",
            "max_backlog",
            "max_per_peer",
            "answer_cache",
            "max_sessions",
            "handler_threads",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.sessions_per_tenant is not None and not 1 <= self.sessions_per_tenant <= self.max_sessions:
            raise ConfigError("sessions_per_tenant must be in 1 .. max_sessions")
        if self.delivery_timeout * 1_000_000 > self.transport.max_skew_us:
            raise ConfigError(
                "delivery_timeout must not exceed max_skew (a retransmission must still be fresh)"
            )
        if not 0 < self.retransmit_initial <= self.retransmit_max:
            raise ConfigError("need 0 < retransmit_initial <= retransmit_max")
        if self.verify_rate <= 0 or self.verify_burst < 1:
            raise ConfigError("verify_rate and verify_burst must be positive")
        if not 0 < self.keepalive_messages < float("inf"):
            raise ConfigError("keepalive_messages must be a positive, finite number of seconds")
        if not 0 < self.max_stream_time < float("inf"):
            raise ConfigError("max_stream_time must be a positive, finite number of seconds")
        if self.request_timeout <= 0 or self.drain_timeout < 0:
            raise ConfigError("request_timeout must be positive and drain_timeout not negative")
        for name in ("broadcast_hop_limit", "unicast_hop_limit", "max_seen", "max_routes", "max_transfers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1")
        if self.max_file_size < 0:
            raise ConfigError("max_file_size must not be negative")
        if not 1 <= self.file_window <= MAX_WINDOW:
            raise ConfigError(f"file_window must be in [1, {MAX_WINDOW}]")
        for name in ("file_retransmit_timeout", "file_idle_timeout", "file_partial_ttl"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive")


# --- values handed to users -------------------------------------------------------------------


@dataclass(frozen=True)
class PeerEvent:
    """A peer came up (its first connection verified) or went down (its last one closed)."""

    agent_id: str
    up: bool
    transport: str
    address: str


@dataclass(frozen=True)
class NodeStats:
    """A snapshot of a node's counters and queue depths (``node.stats()``)."""

    sent: int
    received: int
    bytes_sent: int
    bytes_received: int
    handled: int
    replies_sent: int
    acks_sent: int
    acks_received: int
    retransmits: int
    delivery_failures: int
    throttled: int
    gaps: int
    late: int
    cancelled: int
    peer_events_dropped: int
    #: Refusals by :class:`Refusal` value.
    refused: Mapping[str, int]
    #: ERRORs this node sent / received, by code.
    errors_sent: Mapping[str, int]
    errors_received: Mapping[str, int]
    #: Queue depths now, and the highest seen.
    running: int
    backlog: int
    backlog_peak: int
    running_peak: int
    ordered_queued: int
    reorder_held: int
    pending_requests: int
    unacked: int
    answer_cache: int
    connections: int
    #: Answers this node could not send because they exceed the caller's largest frame (a REPLY
    #: is replaced by ERROR ``internal``).
    answers_too_large: int = 0
    #: Connections this node closed with INTERNAL_ERROR because reading them failed on its side
    #: (a worker thread that failed): the peer reconnects; logged as a WARNING from ``iac.node``.
    closed_internal: int = 0
    #: Routing (FORWARD): ``delivered``, ``forwarded`` (Forwards sent, own and relayed),
    #: ``originated``, ``relayed`` (sent on for others), ``duplicates`` (copies dropped), ``flood_ends``,
    #: ``unsent`` (own broadcasts that reached no peer), ``short`` (broadcasts relayed by a registry
    #: that reached fewer of the agents with a live record in it than it knows).
    routing: Mapping[str, int] = field(default_factory=dict)
    #: FORWARD refusals by :class:`~iac.protocol.routing.RouteRefusal` value (``duplicate`` not included).
    route_refused: Mapping[str, int] = field(default_factory=dict)
    #: Files: ``sent``, ``received``, ``chunks_received``, ``chunk_duplicates``, ``resumed``, ``failed``.
    files: Mapping[str, int] = field(default_factory=dict)
    #: Per peer connected or recently asked: connection state, transport, smoothed RTT, in flight.
    peer_links: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: Entries kept per peer, by table (sessions, verify budgets, in-flight permits, dial locks,
    #: ordered streams, routes, cached answers): each is bounded or expires once a peer is gone.
    peer_state: Mapping[str, int] = field(default_factory=dict)
    #: Refused FILE_TRANSFER chunks and queries, by error name (``chunk_hash_mismatch``, …).
    file_refused: Mapping[str, int] = field(default_factory=dict)
    #: QUIC session resumption: ``resumed`` (connections whose TLS session resumed, dialed or
    #: accepted), ``early_dials`` (dials that sent their HELLO and first messages as 0-RTT early
    #: data), ``early_accepted`` / ``early_rejected`` (what the server did with that early data),
    #: ``early_received`` (accepted connections whose early data this node took).
    zero_rtt: Mapping[str, int] = field(default_factory=dict)
    #: NAT traversal (:class:`~iac.mesh.Traversal`, when one is composed with the node): punch
    #: attempts, successes and failures, punches answered, datagrams sent and rate-limited,
    #: ``direct`` / ``relayed`` peers and each peer's ``paths``, this node's ``candidates``.
    nat: Mapping[str, Any] = field(default_factory=dict)


__all__ = ["NodeConfig", "NodeStats", "PeerEvent", "Topology"]
