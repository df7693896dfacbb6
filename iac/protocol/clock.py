"""Time, injectable.

The sans-IO core takes time as an argument. The asyncio adapters read it from a
:class:`Clock`, so that tests can skew a side's wall clock (stale HELLOs) without
touching the system clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Where an adapter reads the time."""

    def now_us(self) -> int:
        """Wall-clock microseconds since the Unix epoch (HELLO and message timestamps)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back (timeouts, RTT)."""
        ...


def _wall_us() -> int:
    return time.time_ns() // 1000


class SystemClock:
    """The real clock."""

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


class OffsetClock:
    """The system clock shifted by ``offset_us`` (a node whose clock is wrong)."""

    def __init__(self, offset_us: int) -> None:
        self.offset_us = offset_us

    def now_us(self) -> int:
        return time.time_ns() // 1000 + self.offset_us

    def monotonic(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return f"OffsetClock(offset_us={self.offset_us})"


class ManualClock:
    """A clock that moves only when told to (deterministic sans-IO tests)."""

    def __init__(self, now_us: int = 1_700_000_000_000_000, monotonic: float = 0.0) -> None:
        self._now_us = now_us
        self._mono = monotonic

    def now_us(self) -> int:
        return self._now_us

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now_us += int(seconds * 1_000_000)
        self._mono += seconds

    def __repr__(self) -> str:
        return f"ManualClock(now_us={self._now_us})"


class SteadyClock:
    """A clock that follows ``clock`` except where it jumps: time never runs backwards, and never
    ahead of the real time elapsed (``clock.monotonic()``) by more than ``slack_us``.

    What a receiver judges freshness and replay windows by: if its wall clock jumped (a bad time
    server, a manual change), following it would make every live replay window look expired at
    the next expiry -- after which a captured, still-fresh message is new again -- or make fresh
    messages look stale. Gradual corrections (NTP slewing, within ``slack_us`` per read) are
    followed. ``jumps`` counts the reads that did not follow; a clock that was wrong when this
    one started stays wrong until a restart."""

    def __init__(self, clock: Clock, slack_us: int = 1_000_000) -> None:
        self._clock = clock
        # The two reads, bound once (the real clock's straight from ``time``: this is read for
        # every batch of received frames).
        system = type(clock) is SystemClock
        self._wall: Callable[[], int] = _wall_us if system else clock.now_us
        #: The system clock's nanoseconds (None: another clock, read through ``_wall``).
        self._wall_ns: Callable[[], int] | None = time.time_ns if system else None
        self._steady: Callable[[], float] = time.monotonic if system else clock.monotonic
        self.slack_us = slack_us
        self._last = clock.now_us()
        self._mono = clock.monotonic()
        self.jumps = 0
        #: How far the followed clock is from ``clock`` now (µs; 0 while it follows).
        self.offset_us = 0

    def now_us(self) -> int:
        ns = self._wall_ns
        wall = ns() // 1000 if ns is not None else self._wall()
        mono = self._steady()
        last = self._last
        expected = last + int((mono - self._mono) * 1_000_000)
        slack = self.slack_us
        if -slack <= wall - expected <= slack:
            now = wall if wall > last else last
        else:
            now = expected if expected > last else last
            self.jumps += 1
        self._last, self._mono = now, mono
        self.offset_us = now - wall
        return now

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def __repr__(self) -> str:
        return f"SteadyClock({self._clock!r}, jumps={self.jumps})"


SYSTEM_CLOCK: Clock = SystemClock()


def now_us() -> int:
    """Wall-clock microseconds since the Unix epoch."""
    return time.time_ns() // 1000


__all__ = ["SYSTEM_CLOCK", "Clock", "ManualClock", "OffsetClock", "SteadyClock", "SystemClock", "now_us"]
