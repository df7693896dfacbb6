"""Delivery-rate sampling and the windowed filters BBR keeps, sans-IO (time is an argument).

The sampler follows the delivery-rate estimation that Linux TCP uses (``tcp_rate.c``):
every packet carries a snapshot of the connection's delivery counters taken when it was
sent (:class:`SentSnapshot`); when ACKs arrive, the snapshot of the most recently sent
packet among the acknowledged ones gives one rate sample per ACK: the bytes delivered
since that packet was sent, over the longer of its send interval and its ACK interval
(the longer one, so that neither a burst of sends nor a compressed burst of ACKs makes
the rate look higher than the path delivered).

A sample is *app-limited* when the sender had nothing to send for some of the interval it
covers (the connection ran out of data, not out of window): such a sample may show a rate
below the path's, so BBR only takes it when it is higher than its current estimate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SentSnapshot:
    """The delivery counters as they were when one packet was sent."""

    size: int
    sent_time: float
    delivered: int
    delivered_time: float
    first_sent_time: float
    app_limited: bool


@dataclass(frozen=True, slots=True)
class RateSample:
    """What one ACK tells about the delivery rate."""

    #: Bytes newly acknowledged by this ACK, and bytes declared lost since the previous ACK.
    acked: int
    lost: int
    #: ``delivered`` when the most recently sent acknowledged packet was sent.
    prior_delivered: int
    #: Bytes delivered over ``interval`` (seconds); ``rate`` is None when the interval is not
    #: a valid measurement (shorter than the minimum RTT, or no packet was acknowledged).
    delivered: int
    interval: float
    rate: float | None
    app_limited: bool
    #: Bytes in flight before this ACK (and the losses it revealed) took packets out.
    prior_in_flight: int


class DeliveryRateSampler:
    """Per-connection delivery counters; one :class:`RateSample` per ACK."""

    def __init__(self) -> None:
        #: Bytes acknowledged since the connection started, and when the last ACK came.
        self.delivered = 0
        self.delivered_time = 0.0
        self.first_sent_time = 0.0
        #: Nonzero while the connection is app-limited: the value of ``delivered`` after
        #: which samples are no longer app-limited (the data in flight when it went idle).
        self.app_limited_until = 0
        self._acked = 0
        self._lost = 0
        self._prior: SentSnapshot | None = None
        self._ack_time = 0.0
        self._prior_in_flight: int | None = None

    def on_sent(self, now: float, size: int, bytes_in_flight: int) -> SentSnapshot:
        """A packet of ``size`` bytes leaves; ``bytes_in_flight`` is before it."""
        if bytes_in_flight == 0:  # after an idle period the intervals start now
            self.first_sent_time = now
            self.delivered_time = now
        return SentSnapshot(
            size=size,
            sent_time=now,
            delivered=self.delivered,
            delivered_time=self.delivered_time,
            first_sent_time=self.first_sent_time,
            app_limited=self.app_limited_until != 0,
        )

    def on_acked(self, now: float, packet: SentSnapshot, bytes_in_flight: int) -> None:
        """``packet`` was acknowledged by the ACK being processed (``bytes_in_flight``: before
        this packet left it)."""
        if self._prior_in_flight is None:
            self._prior_in_flight = bytes_in_flight
        self.delivered += packet.size
        self.delivered_time = now
        self._acked += packet.size
        self._ack_time = now
        prior = self._prior
        if prior is None or (packet.delivered, packet.sent_time) > (prior.delivered, prior.sent_time):
            self._prior = packet
            self.first_sent_time = packet.sent_time

    def on_lost(self, size: int, bytes_in_flight: int) -> None:
        """``size`` bytes were declared lost (``bytes_in_flight``: before they left it)."""
        if self._prior_in_flight is None:
            self._prior_in_flight = bytes_in_flight
        self._lost += size

    def mark_app_limited(self, bytes_in_flight: int) -> None:
        """The sender has nothing to send and room in its window: samples are app-limited
        until the data now in flight is delivered."""
        self.app_limited_until = max(self.delivered + bytes_in_flight, 1)

    @property
    def pending(self) -> bool:
        """An ACK or a loss is waiting for :meth:`sample`."""
        return self._prior_in_flight is not None

    def sample(self, min_rtt: float, bytes_in_flight: int) -> RateSample:
        """The sample of the ACK just processed (and the losses since the previous one);
        resets the per-ACK counters."""
        prior = self._prior
        prior_in_flight = self._prior_in_flight if self._prior_in_flight is not None else bytes_in_flight
        acked, lost = self._acked, self._lost
        self._prior, self._prior_in_flight, self._acked, self._lost = None, None, 0, 0
        if self.app_limited_until and self.delivered > self.app_limited_until:
            self.app_limited_until = 0
        if prior is None:
            return RateSample(acked, lost, 0, 0, 0.0, None, False, prior_in_flight)
        delivered = self.delivered - prior.delivered
        send_elapsed = prior.sent_time - prior.first_sent_time
        ack_elapsed = self._ack_time - prior.delivered_time
        interval = max(send_elapsed, ack_elapsed)
        # An interval shorter than the minimum RTT cannot be a real measurement of the path
        # (ACKs compressed on the way back, a timer that fired late).
        valid = interval > 0 and interval >= min_rtt
        rate = delivered / interval if valid else None
        return RateSample(
            acked, lost, prior.delivered, delivered, interval, rate, prior.app_limited, prior_in_flight
        )


class WindowedMax:
    """The maximum of the values seen in the last ``window`` rounds (exact: a monotonic
    queue holding at most one entry per round)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._entries: deque[tuple[int, float]] = deque()

    def update(self, round_count: int, value: float) -> None:
        entries = self._entries
        while entries and entries[-1][1] <= value:
            entries.pop()
        if not entries or entries[-1][0] != round_count:  # else a larger value of this round stays
            entries.append((round_count, value))
        self.expire(round_count)

    def expire(self, round_count: int) -> None:
        entries = self._entries
        while entries and round_count - entries[0][0] >= self.window:
            entries.popleft()

    @property
    def best(self) -> float:
        return self._entries[0][1] if self._entries else 0.0

    def reset(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["DeliveryRateSampler", "RateSample", "SentSnapshot", "WindowedMax"]
