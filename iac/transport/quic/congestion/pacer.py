"""A token-bucket pacer, sans-IO: when may the next datagram leave at a given pacing rate.

The bucket fills at the pacing rate and holds at most the *send quantum*,
``max(2 datagrams, rate x 1 ms)``; a datagram may leave while the bucket holds a whole
datagram, and leaving takes its bytes out. So over any window of ``W`` seconds the bytes
sent are at most ``rate x W`` plus one quantum: a connection never bursts a whole window,
and a timer that fires late (asyncio's tick is about 1 ms) releases at most one quantum
at once. The quantum of 1 ms matches that tick: pacing finer than the timers can wake
would only leave bandwidth unused.

The QUIC library decides how big a packet is only while building it, so the adapter takes
a whole datagram per packet (:meth:`Pacer.on_sent`) and gives back the difference once
the packets' real sizes are known (:meth:`Pacer.refund`); packets that do not count
towards congestion control (ACK-only) are refunded whole.
"""

from __future__ import annotations

#: How much of the pacing rate the bucket may hold, in seconds (the send quantum).
BURST_TIME = 0.001
#: A wait shorter than this is no wait (a timer cannot be set finer).
MIN_WAIT = 1e-6


class Pacer:
    """Paces datagrams of at most ``max_datagram_size`` bytes at :attr:`rate` bytes/s."""

    def __init__(self, max_datagram_size: int, rate: float | None = None) -> None:
        self.mds = max_datagram_size
        #: Bytes per second; None: not pacing.
        self.rate = rate
        self._tokens = float(self.capacity)
        self._time: float | None = None

    @property
    def capacity(self) -> int:
        """The send quantum: what the bucket holds at most."""
        if self.rate is None:
            return 2 * self.mds
        return max(2 * self.mds, int(self.rate * BURST_TIME))

    @property
    def tokens(self) -> float:
        return self._tokens

    def _refill(self, now: float) -> None:
        last = self._time
        self._time = now if last is None else max(now, last)
        if last is not None and self.rate is not None and now > last:
            self._tokens = min(float(self.capacity), self._tokens + (now - last) * self.rate)

    def set_rate(self, now: float, rate: float | None) -> None:
        """Pace at ``rate`` from ``now`` on (the bucket fills at the old rate until then)."""
        if rate == self.rate:
            return
        self._refill(now)
        self.rate = rate if rate is None or rate > 0 else None
        self._tokens = min(self._tokens, float(self.capacity))

    def next_send_time(self, now: float) -> float | None:
        """None when a datagram may leave now, else when one may."""
        if self.rate is None:
            return None
        self._refill(now)
        missing = self.mds - self._tokens
        if missing <= 0:
            return None
        wait = missing / self.rate
        return None if wait < MIN_WAIT else now + wait

    def on_sent(self, now: float, size: int) -> None:
        """``size`` bytes left (paced or not: a datagram that had to go anyway still counts)."""
        self._refill(now)
        self._tokens -= size

    def refund(self, size: int) -> None:
        """Give back bytes taken for a datagram that turned out smaller (or not paced)."""
        if size > 0:
            self._tokens = min(float(self.capacity), self._tokens + size)


__all__ = ["BURST_TIME", "Pacer"]
