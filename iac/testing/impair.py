"""The link emulator's impairment decision, pure (no I/O; the clock is an argument): delay, jitter,
loss and reordering per packet (:class:`Impairer`), a rate limit with a drop-tail queue
(:class:`Shaper`, sized by :class:`Bottleneck`).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass

from iac.testing.relay import Impairment

#: The smallest queue a bottleneck gets (a few packets), whatever the BDP.
MIN_QUEUE_BYTES = 8 * 1500


@dataclass
class ImpairStats:
    packets: int = 0
    bytes: int = 0
    dropped: int = 0
    duplicated: int = 0
    reordered: int = 0
    delivered: int = 0
    delivered_bytes: int = 0
    dropped_queue: int = 0
    dropped_mtu: int = 0  # larger than the link's MTU
    dropped_bottleneck: int = 0  # the bottleneck's queue was full
    max_queued_bytes: int = 0


@dataclass(frozen=True)
class Bottleneck:
    """A rate limit with a bounded drop-tail queue, for each direction of the link."""

    rate_bps: float  # bits per second
    queue_bytes: int

    def __post_init__(self) -> None:
        if self.rate_bps <= 0 or self.queue_bytes <= 0:
            raise ValueError("a bottleneck needs a positive rate and queue")

    @property
    def bytes_per_second(self) -> float:
        return self.rate_bps / 8

    @classmethod
    def for_path(cls, rate_mbit: float, rtt: float, buffer_bdp: float) -> Bottleneck:
        """``rate_mbit`` Mbit/s with a queue of ``buffer_bdp`` x rate x ``rtt`` bytes (at least
        :data:`MIN_QUEUE_BYTES`)."""
        rate_bps = rate_mbit * 1e6
        return cls(rate_bps, max(int(buffer_bdp * rate_bps / 8 * rtt), MIN_QUEUE_BYTES))


class Shaper:
    """One direction's bottleneck (pure: the clock is an argument). :meth:`admit` says when
    a packet arriving at ``now`` leaves the queue, or None when the queue is full."""

    def __init__(self, bottleneck: Bottleneck, stats: ImpairStats | None = None) -> None:
        self.bottleneck = bottleneck
        self.stats = stats or ImpairStats()
        self._free_at = 0.0
        self._backlog: deque[tuple[float, int]] = deque()  # (departure, size) still queued
        self.queued = 0

    def admit(self, now: float, size: int) -> float | None:
        backlog = self._backlog
        while backlog and backlog[0][0] <= now:
            self.queued -= backlog.popleft()[1]
        if self.queued + size > self.bottleneck.queue_bytes:
            self.stats.dropped_bottleneck += 1
            return None
        departure = max(now, self._free_at) + size / self.bottleneck.bytes_per_second
        self._free_at = departure
        backlog.append((departure, size))
        self.queued += size
        if self.queued > self.stats.max_queued_bytes:
            self.stats.max_queued_bytes = self.queued
        return departure


class Impairer:
    """Decides, for one direction of the link, when each packet leaves (if at all).

    :meth:`schedule` returns the departure times of the packet's copies: ``[]`` when it
    is lost, two times when it is duplicated. A reordered copy is held ``reorder_delay``
    longer so that later packets overtake it. Same rules as :class:`iac.testing.relay.UdpRelay`.
    """

    def __init__(self, impairment: Impairment, seed: int) -> None:
        self.impairment = impairment
        self.rng = random.Random(seed)
        self.stats = ImpairStats()

    def schedule(self, now: float, size: int = 0) -> list[float]:
        imp, rng, st = self.impairment, self.rng, self.stats
        st.packets += 1
        st.bytes += size
        if imp.mtu is not None and size > imp.mtu:
            st.dropped_mtu += 1
            return []
        if imp.loss and rng.random() < imp.loss:
            st.dropped += 1
            return []
        copies = 1
        if imp.duplicate and rng.random() < imp.duplicate:
            copies = 2
            st.duplicated += 1
        out = []
        for _ in range(copies):
            delay = imp.delay + (rng.uniform(0.0, imp.jitter) if imp.jitter else 0.0)
            if imp.reorder and rng.random() < imp.reorder:
                delay += imp.reorder_delay
                st.reordered += 1
            out.append(now + delay)
        return out
