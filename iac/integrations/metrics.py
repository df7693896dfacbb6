"""Prometheus metrics for one node (``pip install 'iac-mesh[metrics]'``).

::

    metrics = NodeMetrics(listen="127.0.0.1:9464")
    async with Node(listen=[...], metrics=metrics) as node:
        ...  # GET http://127.0.0.1:9464/metrics

Every :class:`NodeMetrics` has a registry of its own (several nodes share a process without
mixing their figures). Counters and queue depths are read from ``node.stats()`` when Prometheus
scrapes, so a node pays nothing for them between scrapes; request latency (``_request_duration``,
the requests a node sends), handling time (``_handle_duration``, the handler runs of the messages
it receives) and per-peer activity come from an :class:`~iac.node.Observer` (a dictionary
update per message).

Byte counts are wire bytes: frames as they cross the transport, after compression.

Per-peer series are bounded: the ``top_peers`` most active peers (messages built for them, handled
from them and relayed to or from them since the metrics attached) get a series each; the others
are summed into ``peer="other"``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

try:
    from prometheus_client import CollectorRegistry, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "iac.integrations.metrics needs prometheus-client: pip install 'iac-mesh[metrics]'"
    ) from exc

from iac.errors import ERROR_CODES, ConfigError, HandlerError
from iac.integrations.scrape import ScrapeServer, parse_listen
from iac.node.config import NodeStats
from iac.node.node import Node
from iac.node.observe import Observer
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType

#: Request latency buckets, in seconds (a LAN round trip to a slow model call).
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Outcomes of a request besides an ERROR code (:meth:`iac.node.Observer.answered`).
OUTCOMES = frozenset({"reply", "timeout", "transport", "cancelled"})
#: The label value for what has no series of its own: peers past ``top_peers``, ERROR codes
#: outside the closed list (a peer chooses the code it sends).
OTHER = "other"

#: Plain counters of NodeStats: (attribute, metric name, help).
_COUNTERS = (
    ("received", "messages_received", "Messages received (MESSAGE frames and delivered Forwards)."),
    ("sent", "messages_sent", "Messages this node sent (its own, not relayed ones)."),
    ("bytes_received", "bytes_received", "Wire bytes received: frames as read, compressed."),
    ("bytes_sent", "bytes_sent", "Wire bytes sent: frames as written, compressed."),
    ("handled", "handled", "Messages handed to a handler."),
    ("replies_sent", "replies_sent", "REPLY messages sent."),
    ("acks_sent", "acks_sent", "ACK messages sent."),
    ("acks_received", "acks_received", "ACK messages received."),
    ("retransmits", "retransmits", "Requests and ACK_REQUESTED messages sent again."),
    ("delivery_failures", "delivery_failures", "ACK_REQUESTED messages given up on."),
    ("throttled", "throttled", "Reads paused by a peer's verify budget."),
    ("gaps", "ordered_gaps", "Ordered sessions that skipped a gap."),
    ("late", "ordered_late", "Ordered messages that came after their gap was skipped."),
    ("cancelled", "cancelled", "Handlers a CANCEL ended."),
    ("peer_events_dropped", "peer_events_dropped", "Peer events dropped from a full queue."),
    ("answers_too_large", "answers_too_large", "Answers larger than the caller's largest frame."),
    ("closed_internal", "closed_internal", "Connections closed because reading them failed on this side."),
)
#: Queue depths of NodeStats: (attribute, queue label).
_QUEUES = (
    ("backlog", "backlog"),
    ("running", "running"),
    ("ordered_queued", "ordered"),
    ("reorder_held", "reorder_held"),
    ("pending_requests", "pending"),
    ("unacked", "unacked"),
    ("answer_cache", "answer_cache"),
)


def type_name(msg_type: int) -> str:
    """The label value of a message type: its name (``RUN``), or its number if it has none."""
    try:
        return MessageType(msg_type).name
    except ValueError:
        return str(msg_type)


def _bounded(code: str) -> str:
    return code if code in ERROR_CODES else OTHER


#: Outcomes of a handler run on the receiving side besides the ERROR code it answered with
#: (``internal`` for an exception other than HandlerError): it returned (or its stream ended),
#: its deadline passed, or the caller cancelled it.
HANDLED_OUTCOMES = frozenset({"ok", "timeout", "cancelled"})


def handled_outcome(exc: BaseException | None) -> str:
    """The outcome label of a handler run that ended with ``exc`` (None: it returned)."""
    if exc is None:
        return "ok"
    if isinstance(exc, HandlerError):
        return _bounded(exc.code)
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    return "internal"


class _HandlerTimer:
    """Times one handler run into the receiving side's histogram."""

    __slots__ = ("histogram", "msg_type", "t0")

    def __init__(self, histogram: Histogram, msg_type: int) -> None:
        self.histogram, self.msg_type, self.t0 = histogram, msg_type, 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        seconds = time.perf_counter() - self.t0
        self.histogram.labels(type_name(self.msg_type), handled_outcome(exc)).observe(seconds)


class _Activity(Observer):
    """Counts messages per peer (to rank peers) and times requests."""

    def __init__(self, histogram: Histogram, max_peers: int, handled: Histogram | None = None) -> None:
        self.histogram = histogram
        #: Handler runs on this node, by type and outcome (:data:`HANDLED_OUTCOMES`, ERROR codes).
        self.handled = handled
        self.max_peers = max_peers
        self.counts: Counter[str] = Counter()

    def _count(self, peer: str) -> None:
        counts = self.counts
        counts[peer] += 1
        if len(counts) > self.max_peers:  # keep the busier half: the table stays bounded
            keep = counts.most_common(self.max_peers // 2)
            counts.clear()
            counts.update(dict(keep))

    def outgoing(self, msg: Message) -> None:
        if msg.to:
            self._count(msg.to)

    def handling(self, peer: str, msg: Message) -> AbstractContextManager[Any]:
        self._count(peer)
        if self.handled is None:
            return nullcontext()
        return _HandlerTimer(self.handled, int(msg.msg_type))

    def answered(self, peer: str, msg_type: int, seconds: float, outcome: str) -> None:
        label = outcome if outcome in OUTCOMES else _bounded(outcome)
        self.histogram.labels(type_name(msg_type), label).observe(seconds)

    def relayed(self, origin: str, msg: Message, from_peer: str, to: list[str]) -> None:
        self._count(from_peer)
        for peer in to:
            self._count(peer)


def _counter(name: str, doc: str, label: str, values: Mapping[str, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


def _gauge(name: str, doc: str, labels: Sequence[str], rows: Iterable[tuple[Sequence[str], float]]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels))
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


class _StatsCollector:
    """Turns ``node.stats()`` into metric families when the registry is collected."""

    def __init__(self, owner: NodeMetrics, node: Node) -> None:
        self._owner = owner
        self._node = node
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def _stats(self) -> NodeStats:
        if threading.get_ident() == self._thread:
            return self._node.stats()
        # Collected from another thread (a server of prometheus_client's own): read on the loop.

        async def snapshot() -> NodeStats:
            return self._node.stats()

        return asyncio.run_coroutine_threadsafe(snapshot(), self._loop).result(timeout=10)

    def describe(self) -> list[Metric]:
        return []  # names are not checked against other collectors: the registry is ours alone

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        p = self._owner.prefix
        info = GaugeMetricFamily(f"{p}_node_info", "The node these figures are of.", labels=["agent_id"])
        info.add_metric([self._node.agent_id], 1)
        yield info
        for attr, name, doc in _COUNTERS:
            yield CounterMetricFamily(f"{p}_{name}", doc, value=getattr(s, attr))
        yield _counter(f"{p}_refused", "Messages refused on receipt, by reason.", "reason", s.refused)
        for way, values in (("sent", s.errors_sent), ("received", s.errors_received)):
            codes: Counter[str] = Counter()
            for code, n in values.items():
                codes[_bounded(code)] += n
            yield _counter(f"{p}_errors_{way}", f"ERROR messages {way}, by code.", "code", codes)
        yield _counter(f"{p}_routing", "FORWARD routing events, by event.", "event", s.routing)
        yield _counter(f"{p}_route_refused", "FORWARD frames refused, by reason.", "reason", s.route_refused)
        yield _counter(f"{p}_files", "File transfer events, by event.", "event", s.files)
        yield _counter(f"{p}_file_refused", "File messages refused, by reason.", "reason", s.file_refused)
        zero_rtt = s.zero_rtt
        yield _counter(f"{p}_zero_rtt", "QUIC resumption and 0-RTT early data, by event.", "event", zero_rtt)
        depths = (([q], getattr(s, attr)) for attr, q in _QUEUES)
        yield _gauge(f"{p}_queue_depth", "Queue depths now.", ["queue"], depths)
        peaks = ((["backlog"], s.backlog_peak), (["running"], s.running_peak))
        yield _gauge(f"{p}_queue_depth_peak", "The highest queue depth seen.", ["queue"], peaks)
        yield GaugeMetricFamily(f"{p}_connections", "Connections open now.", value=s.connections)
        transports: Counter[str] = Counter(
            str(link["transport"]) for link in s.peer_links.values() if link.get("connected")
        )
        by_transport = (([t], n) for t, n in sorted(transports.items()))
        yield _gauge(
            f"{p}_connections_by_transport", "Connected peers, by transport.", ["transport"], by_transport
        )
        tables = (([t], n) for t, n in sorted(s.peer_state.items()))
        yield _gauge(f"{p}_peer_state_entries", "Entries kept per peer, by table.", ["table"], tables)
        yield from self._peers(s.peer_links)

    def _peers(self, links: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
        p = self._owner.prefix
        counts = self._owner.activity.counts

        def rank(peer: str) -> tuple[int, int, bool, str]:
            link = links[peer]
            return counts.get(peer, 0), int(link.get("in_flight") or 0), bool(link.get("connected")), peer

        ordered = sorted(links, key=rank, reverse=True)
        top, rest = ordered[: self._owner.top_peers], ordered[self._owner.top_peers :]
        rtt_doc = f"Smoothed request round trip per peer ({OTHER}: their mean)."
        rtt = GaugeMetricFamily(f"{p}_peer_rtt_seconds", rtt_doc, labels=["peer"])
        in_flight_doc = f"Requests and unacknowledged messages in flight per peer ({OTHER}: their sum)."
        in_flight = GaugeMetricFamily(f"{p}_peer_in_flight", in_flight_doc, labels=["peer"])
        connected_doc = f"1 if connected, per peer ({OTHER}: how many are)."
        connected = GaugeMetricFamily(f"{p}_peer_connected", connected_doc, labels=["peer"])
        for peer in top:
            link = links[peer]
            if link.get("rtt_ms") is not None:
                rtt.add_metric([peer], float(link["rtt_ms"]) / 1000)
            in_flight.add_metric([peer], int(link.get("in_flight") or 0))
            connected.add_metric([peer], 1 if link.get("connected") else 0)
        if rest:
            rtts = [float(links[q]["rtt_ms"]) / 1000 for q in rest if links[q].get("rtt_ms") is not None]
            if rtts:
                rtt.add_metric([OTHER], sum(rtts) / len(rtts))
            in_flight.add_metric([OTHER], sum(int(links[q].get("in_flight") or 0) for q in rest))
            connected.add_metric([OTHER], sum(1 for q in rest if links[q].get("connected")))
        yield rtt
        yield in_flight
        yield connected
        yield GaugeMetricFamily(f"{p}_peers_aggregated", f"Peers counted as peer={OTHER}.", value=len(rest))


class NodeMetrics:
    """Prometheus metrics of one :class:`~iac.Node`: pass it as ``Node(metrics=...)``.

    ``listen``: ``"HOST:PORT"`` to serve ``/metrics`` over HTTP on the node's event loop while the
    node runs (port 0 picks a free one: see :attr:`address`); None to serve nothing (render
    :attr:`registry` yourself, e.g. with :meth:`render`). ``top_peers``: how many peers get
    series of their own. ``buckets``: latency buckets in seconds (of requests sent and handlers run).
    """

    def __init__(
        self,
        listen: str | None = None,
        *,
        top_peers: int = 20,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        prefix: str = "iac",
    ) -> None:
        if top_peers < 0:
            raise ConfigError(f"top_peers must be 0 or more, not {top_peers}")
        self._listen = parse_listen(listen) if listen is not None else None
        self.top_peers = top_peers
        self.prefix = prefix
        #: The registry of this node's metrics (and only of them).
        self.registry = CollectorRegistry(auto_describe=False)
        histogram = Histogram(
            f"{prefix}_request_duration_seconds",
            "Requests this node sent, from sending to their answer, by type and outcome (reply, an "
            "ERROR code, timeout, transport, cancelled).",
            ["msg_type", "outcome"],
            buckets=tuple(buckets),
            registry=self.registry,
        )
        handled = Histogram(
            f"{prefix}_handle_duration_seconds",
            "Handler runs on this node (the receiving side), from the handler's start to its "
            "return, by type and outcome (ok, the ERROR code it answered with, timeout, cancelled).",
            ["msg_type", "outcome"],
            buckets=tuple(buckets),
            registry=self.registry,
        )
        self.activity = _Activity(histogram, max_peers=max(1024, 16 * top_peers), handled=handled)
        self._server: ScrapeServer | None = None
        self._node: Node | None = None

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the HTTP endpoint while it serves, else None."""
        return self._server.address if self._server is not None else None

    @property
    def url(self) -> str:
        """The scrape URL of the endpoint, which serves while the node runs (:class:`ConfigError`
        when it does not: made without ``listen``, or its node is not started)."""
        if self._server is None:
            why = "it has no listen address" if self._listen is None else "its node is not running"
            raise ConfigError(f"this NodeMetrics serves no /metrics endpoint: {why}")
        host, port = self._server.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The page and its content type for a request's ``Accept`` header (OpenMetrics when asked
        for, else the Prometheus text format). Call it on the node's event loop thread."""
        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type

    def attach(self, node: Node) -> Callable[[], None]:
        """Called by the node when it starts; the returned function detaches (at close)."""
        if self._node is not None:
            raise ConfigError("a NodeMetrics belongs to one node: make one per node")
        collector = _StatsCollector(self, node)
        server = None
        if self._listen is not None:
            server = ScrapeServer(*self._listen, self.render)
            server.start()
        self.registry.register(collector)
        remove = node.observe(self.activity)
        self._node, self._server = node, server

        def detach() -> None:
            remove()
            self.registry.unregister(collector)
            if server is not None:
                server.close()
            self._node = self._server = None

        return detach

    def add_source(
        self, name: str, stats: Callable[[], Mapping[str, Any]], labels: Mapping[str, str] | None = None
    ) -> Callable[[], None]:
        """Export what an integration's ``stats()`` returns (MCP over IAC's, say) under
        ``{prefix}_{name}_{key}``: a mapping of counts becomes a counter labelled
        ``labels.get(key, "key")`` (at most :data:`MAX_SOURCE_LABELS` values, the rest summed into
        ``other``); a number becomes a gauge. Read when Prometheus scrapes, on the loop's thread.
        Returns what removes it."""
        collector = _SourceCollector(self.prefix, name, stats, dict(labels or {}))
        self.registry.register(collector)
        return lambda: self.registry.unregister(collector)


#: Label values one counter of an added source gets (the rest are summed into ``other``).
MAX_SOURCE_LABELS = 64


class _SourceCollector:
    """Turns an integration's ``stats()`` into metric families when the registry is collected."""

    def __init__(
        self, prefix: str, name: str, stats: Callable[[], Mapping[str, Any]], labels: dict[str, str]
    ) -> None:
        self._prefix, self._name, self._read, self._labels = prefix, name, stats, labels
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def describe(self) -> list[Metric]:
        return []

    def _stats(self) -> Mapping[str, Any]:
        if threading.get_ident() == self._thread:
            return self._read()

        async def snapshot() -> Mapping[str, Any]:
            return self._read()

        return asyncio.run_coroutine_threadsafe(snapshot(), self._loop).result(timeout=10)

    def collect(self) -> Iterator[Metric]:
        base = f"{self._prefix}_{self._name}"
        for key, value in sorted(self._stats().items()):
            if isinstance(value, Mapping):
                ranked = sorted(value.items(), key=lambda kv: (-int(kv[1]), str(kv[0])))
                values: Counter[str] = Counter()
                for i, (label, n) in enumerate(ranked):
                    values[str(label) if i < MAX_SOURCE_LABELS else OTHER] += int(n)
                doc = f"{self._name} {key}, by {self._labels.get(key, 'key')}."
                yield _counter(f"{base}_{key}", doc, self._labels.get(key, "key"), values)
            elif isinstance(value, int | float) and not isinstance(value, bool):
                yield GaugeMetricFamily(f"{base}_{key}", f"{self._name} {key} now.", value=value)


__all__ = [
    "DEFAULT_BUCKETS",
    "HANDLED_OUTCOMES",
    "MAX_SOURCE_LABELS",
    "OTHER",
    "OUTCOMES",
    "NodeMetrics",
    "handled_outcome",
    "type_name",
]
