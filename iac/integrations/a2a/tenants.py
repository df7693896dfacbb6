"""What the A2A gateway shares between its tenants, and the bounds that keep one from taking the
others' share: the defaults (:class:`GatewayLimits`), fair shares of the calls toward the agent
per principal (:class:`FairShares`), a repeated ``messageId`` answered from the first result
(:class:`ReplayCache`) and the gateway's metrics (:class:`GatewayCollector`); the HTTP connection
guard is :mod:`iac.integrations.a2a.connections`.

Every call through the gateway reaches the agent as one IAC peer (the gateway's key), and that
peer has a bounded number of requests in flight: so the gateway keeps its own calls in flight
below that bound, at most ``max_calls_per_principal`` of them for one principal, and queues the
others (at most ``max_queued``) for at most ``queue_wait`` seconds, granting a freed slot to the
waiting principal with the fewest calls in flight. A call still waiting then is answered HTTP 429.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from iac.errors import ConfigError

log = logging.getLogger("iac.integrations")

MiB = 1024 * 1024


@dataclass(frozen=True)
class GatewayLimits:
    """The gateway's bounds per tenant and in total (the defaults are the documented ones).

    ``head_timeout``: seconds a request head may take (from the connection, or from its first
    byte on a kept-alive one). ``min_body_rate``: bytes/s a body must average once
    ``head_timeout`` seconds passed after its head. ``keep_alive``: seconds an idle kept-alive
    connection stays open. ``max_connections``/``max_per_address``: connections at once, in total
    and from one client address (the total is lowered to fit the descriptor limit).
    ``max_bodies``/``max_bodies_per_client``: bytes of request bodies held at once, in total and
    for one client address. ``max_calls``/``max_calls_per_principal``: calls and streams toward
    the agent at once. ``max_queued``/``queue_wait``: calls waiting for a slot, and for how long
    before HTTP 429. ``replay_window``/``replay_entries``/``replay_bytes``: how long, how many
    and how many bytes of answers per principal are kept to answer a repeated ``messageId``.
    """

    head_timeout: float = 10.0
    min_body_rate: int = 1024
    keep_alive: float = 75.0
    max_connections: int = 1024
    max_per_address: int = 64
    max_bodies: int = 64 * MiB
    max_bodies_per_client: int = 8 * MiB
    max_calls: int = 48
    max_calls_per_principal: int = 16
    max_queued: int = 256
    queue_wait: float = 5.0
    replay_window: float = 600.0
    replay_entries: int = 256
    replay_bytes: int = 8 * MiB

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not value > 0:
                raise ConfigError(f"gateway limit {f.name} must be more than 0, not {value!r}")
        if self.max_calls_per_principal > self.max_calls:
            raise ConfigError("max_calls_per_principal must not be more than max_calls")


class Throttled(Exception):
    """A call that found no slot within ``queue_wait`` (or no room in the queue)."""

    def __init__(self, principal: str, in_flight: int, share: int, total_full: bool) -> None:
        self.principal, self.in_flight = principal, in_flight
        why = f"its share is {share}"
        if total_full:
            why = "the gateway's calls toward the agent are all in flight"
        super().__init__(
            f"principal {principal!r} has {in_flight} calls in flight toward the agent ({why}); retry later"
        )


class FairShares:
    """Slots for calls toward the agent: at most ``total`` at once, ``per_principal`` for one
    principal; a call that does not fit waits (at most ``max_queued`` wait at once)."""

    def __init__(self, total: int, per_principal: int, max_queued: int) -> None:
        self.total, self.per_principal, self.max_queued = total, per_principal, max_queued
        self.in_flight: Counter[str] = Counter()
        self.running = 0
        self.queued = 0
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        #: Calls answered 429, by principal.
        self.throttled: Counter[str] = Counter()

    def _fits(self, principal: str) -> bool:
        return self.running < self.total and self.in_flight[principal] < self.per_principal

    def _take(self, principal: str) -> None:
        self.in_flight[principal] += 1
        self.running += 1

    def _refuse(self, principal: str) -> Throttled:
        self.throttled[principal] += 1
        n = self.in_flight[principal]
        return Throttled(principal, n, self.per_principal, n < self.per_principal)

    async def acquire(self, principal: str, wait: float) -> None:
        """Take a slot for ``principal``, waiting at most ``wait`` seconds; :class:`Throttled`."""
        if self._fits(principal) and not self._waiting.get(principal):
            self._take(principal)
            return
        if self.queued >= self.max_queued:
            raise self._refuse(principal)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(principal, deque()).append(fut)
        self.queued += 1
        try:
            async with asyncio.timeout(wait):
                await fut
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return  # granted as the wait ended: the slot is taken
            self._unqueue(principal, fut)
            raise self._refuse(principal) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(principal)
            else:
                self._unqueue(principal, fut)
            raise

    def _unqueue(self, principal: str, fut: asyncio.Future[None]) -> None:
        waiting = self._waiting.get(principal)
        if waiting is not None and fut in waiting:
            waiting.remove(fut)
            self.queued -= 1
            if not waiting:
                del self._waiting[principal]

    def release(self, principal: str) -> None:
        if self.in_flight[principal] <= 0:
            return
        self.in_flight[principal] -= 1
        if not self.in_flight[principal]:
            del self.in_flight[principal]
        self.running -= 1
        self._grant()

    def _grant(self) -> None:
        while self.running < self.total:
            ready = [p for p, q in self._waiting.items() if q and self.in_flight[p] < self.per_principal]
            if not ready:
                return
            principal = min(ready, key=lambda p: self.in_flight[p])
            waiting = self._waiting[principal]
            fut = waiting.popleft()
            self.queued -= 1
            if not waiting:
                del self._waiting[principal]
            if fut.done():
                continue
            self._take(principal)
            fut.set_result(None)


#: An answer as sent: (status, headers, body); the body None when it was too large to keep.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes | None]


@dataclass
class _Entry:
    at: float
    done: asyncio.Event = field(default_factory=asyncio.Event)
    answer: Answer | None = None
    size: int = 0


class ReplayCache:
    """The answers to the ``messageId`` values each principal sent in the last ``window``
    seconds (at most ``entries`` and ``max_bytes`` of answers per principal, the oldest dropped
    first). Time is an argument."""

    def __init__(self, window: float, entries: int, max_bytes: int) -> None:
        self.window, self.entries, self.max_bytes = window, entries, max_bytes
        self._by: dict[str, OrderedDict[str, _Entry]] = {}
        self._bytes: Counter[str] = Counter()
        #: Repeats answered from the first answer.
        self.replayed = 0

    def _expire(self, principal: str, now: float) -> OrderedDict[str, _Entry]:
        seen = self._by.setdefault(principal, OrderedDict())
        while seen:
            key, entry = next(iter(seen.items()))
            if now - entry.at < self.window and len(seen) <= self.entries:
                break
            self._drop(principal, key)
        return seen

    def _drop(self, principal: str, key: str) -> None:
        entry = self._by[principal].pop(key)
        self._bytes[principal] -= entry.size
        entry.done.set()

    def begin(self, principal: str, message_id: str, now: float) -> _Entry | None:
        """The entry of an earlier call with this ``messageId`` (wait on ``done``, then read
        ``answer``), or None: this call runs, and :meth:`finish` records its answer."""
        seen = self._expire(principal, now)
        entry = seen.get(message_id)
        if entry is not None:
            self.replayed += 1
            return entry
        seen[message_id] = _Entry(now)
        while len(seen) > self.entries:
            self._drop(principal, next(iter(seen)))
        return None

    def finish(self, principal: str, message_id: str, answer: Answer | None) -> None:
        """Record the answer of the call that ran (None: it did not run; a repeat may run)."""
        seen = self._by.get(principal)
        entry = seen.get(message_id) if seen is not None else None
        if entry is None or entry.done.is_set():
            return
        if answer is None:
            self._drop(principal, message_id)
            return
        entry.answer, entry.size = answer, len(answer[2] or b"")
        self._bytes[principal] += entry.size
        entry.done.set()
        while self._bytes[principal] > self.max_bytes and seen:
            self._drop(principal, next(iter(seen)))


class GatewayCollector:
    """Prometheus metric families of a gateway's ``stats()`` (register it on a registry, e.g.
    ``NodeMetrics.registry``): requests, refusals by reason, HTTP 429s by principal, calls in
    flight by principal, repeats answered, connections and those refused or closed."""

    def __init__(self, stats: Callable[[], dict[str, Any]], prefix: str = "iac_a2a_gateway") -> None:
        self._stats = stats
        self.prefix = prefix

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s, pre = self._stats(), self.prefix
        yield CounterMetricFamily(
            f"{pre}_requests", "JSON-RPC POSTs the gateway received.", value=s["requests"]
        )
        yield CounterMetricFamily(
            f"{pre}_replayed", "Repeated messageIds answered from the first answer.", value=s["replayed"]
        )
        yield GaugeMetricFamily(f"{pre}_connections", "HTTP connections open.", value=s["connections"])
        tables = (
            ("refused", "Requests answered at the gateway, never forwarded, by reason.", "reason", "refused"),
            ("throttled", "Calls answered HTTP 429 (no call slot in time), by principal.", "principal",
             "throttled"),
            ("connections_refused", "HTTP connections refused, by bound.", "bound", "connections_refused"),
            ("connections_closed", "HTTP connections closed for a slow head or body.", "reason",
             "connections_closed"),
        )  # fmt: skip
        for name, doc, label, key in tables:
            family = CounterMetricFamily(f"{pre}_{name}", doc, labels=[label])
            for value, n in sorted(s[key].items()):
                family.add_metric([str(value)], n)
            yield family
        gauge = GaugeMetricFamily(
            f"{pre}_calls_in_flight", "Calls toward the agent in flight, by principal.", labels=["principal"]
        )
        for principal, n in sorted(s["calls_in_flight"].items()):
            gauge.add_metric([principal], n)
        yield gauge


__all__ = [
    "Answer",
    "FairShares",
    "GatewayCollector",
    "GatewayLimits",
    "ReplayCache",
    "Throttled",
]
