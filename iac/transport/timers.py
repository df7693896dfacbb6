"""One timer structure for every connection of an event loop: :class:`TimerWheel` and
:class:`LoopTimers`.

A node with thousands of connections used to hold thousands of event-loop timers (each
connection's keep-alive and idle deadline, each QUIC connection's ACK-delay and loss timer),
each one a ``TimerHandle`` in the loop's heap, ordered by a Python ``__lt__``. Here they are
entries of one heap instead:

* :class:`TimerWheel` is the sans-IO part: deadlines keyed by their owner, at most one per
  owner, in a heap of plain tuples; time is an argument (``now``), never read from a clock.
  A deadline may carry a *slack* (how late it may fire): it is then rounded up to a grid
  (1 ms, 10 ms, 100 ms or 1 s, the coarsest not above the slack), so deadlines that may be
  coarse (keep-alive, idle) fall on shared instants and are served by one wake-up. A
  deadline never fires early; one without slack (QUIC's ACK delay, loss and pacing timers)
  fires at its instant.
* :class:`LoopTimers` is the asyncio driver: one ``loop.call_at`` for the earliest deadline
  of the loop's wheel; when it fires, every due owner's callback runs, earliest first.
  :func:`loop_timers` gives the running loop's one driver (the transport layer's; every
  adapter of the loop shares it).

A :class:`Timer` is one owner's wake-up (:meth:`Timer.at` sets, moves or clears its
deadline); :meth:`LoopTimers.call_at` is the ``loop.call_at`` shape for code written against
asyncio (the QUIC library's protocol).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

#: The grids a deadline with slack is rounded up to, coarsest first (seconds).
GRIDS = (1.0, 0.1, 0.01, 0.001)


def rounded(at: float, slack: float) -> float:
    """``at`` rounded up to the coarsest of :data:`GRIDS` not above ``slack`` (``at`` itself
    when ``slack`` is below the finest grid). Never earlier than ``at``."""
    for grid in GRIDS:
        if slack >= grid:
            up = math.ceil(at / grid) * grid
            return up if up >= at else at  # float rounding: never early
    return at


class TimerWheel(Generic[K]):
    """Deadlines of many owners in one heap (sans-IO: ``now`` is an argument).

    Each owner (any hashable key) has at most one deadline; setting it again replaces it. The
    heap holds ``(deadline, sequence number)`` only, never the owner: a replaced or cleared entry
    keeps nothing alive (a closed connection's buffers go at once) and is dropped lazily, when it
    reaches the top or when stale entries outnumber live ones (the heap never holds more than
    about twice the live deadlines)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._live: dict[K, tuple[float, int]] = {}
        self._owner: dict[int, K] = {}  # sequence number of a live entry -> its owner
        self._seq = itertools.count()

    def __len__(self) -> int:
        """Owners with a deadline."""
        return len(self._live)

    def __contains__(self, key: object) -> bool:
        return key in self._live

    @property
    def heap_size(self) -> int:
        """Heap entries, stale ones included (bounded by about twice :func:`len`)."""
        return len(self._heap)

    def set(self, key: K, at: float | None, slack: float = 0.0) -> float | None:
        """Give ``key`` the deadline ``at`` (None: none), which may fire up to ``slack`` seconds
        late (rounded by :func:`rounded`); the deadline as stored."""
        old = self._live.get(key)
        if at is not None and slack > 0.0:
            at = rounded(at, slack)
        if old is not None:
            if old[0] == at:
                return at  # unchanged: no new entry
            del self._owner[old[1]]
        if at is None:
            if old is not None:
                del self._live[key]
                if len(self._heap) > 2 * len(self._live) + 64:  # (_compact's test: a call saved)
                    self._compact()
            return None
        seq = next(self._seq)
        self._live[key] = (at, seq)
        self._owner[seq] = key
        heapq.heappush(self._heap, (at, seq))
        if len(self._heap) > 2 * len(self._live) + 64:
            self._compact()
        return at

    def deadline(self, key: K) -> float | None:
        """``key``'s deadline (None: it has none)."""
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def next_deadline(self) -> float | None:
        """The earliest deadline (None: no owner has one)."""
        heap, owner = self._heap, self._owner
        while heap:
            if heap[0][1] in owner:
                return heap[0][0]
            heapq.heappop(heap)  # stale: replaced or cleared
        return None

    def due(self, now: float) -> list[K]:
        """Take every owner whose deadline is at or before ``now`` (their deadlines are
        cleared), earliest first."""
        heap, live, owner = self._heap, self._live, self._owner
        out: list[K] = []
        while heap and heap[0][0] <= now:
            key = owner.pop(heapq.heappop(heap)[1], None)
            if key is not None:
                del live[key]
                out.append(key)
        return out

    def _compact(self) -> None:
        heap = self._heap
        if len(heap) > 2 * len(self._live) + 64:
            owner = self._owner
            self._heap = [e for e in heap if e[1] in owner]
            heapq.heapify(self._heap)


class Timer:
    """One owner's wake-up in its loop's :class:`LoopTimers`: ``callback()`` runs once the
    deadline set by :meth:`at` has passed (at most one deadline at a time). ``slack``: how
    late it may run (0: exact)."""

    __slots__ = ("__weakref__", "_args", "_timers", "callback", "slack")

    def __init__(
        self, timers: LoopTimers, callback: Callable[..., object], slack: float = 0.0, *args: Any
    ) -> None:
        self._timers = timers
        self.callback = callback
        self.slack = slack
        self._args = args

    def at(self, when: float | None) -> None:
        """Run the callback once ``when`` has passed (None: not at all); replaces the deadline."""
        self._timers.set(self, when, self.slack)

    @property
    def when(self) -> float | None:
        """The deadline, as rounded (None: none)."""
        return self._timers.wheel.deadline(self)

    def cancel(self) -> None:
        """Clear the deadline (``asyncio.TimerHandle.cancel``'s name)."""
        self._timers.set(self, None, 0.0)

    def cancelled(self) -> bool:
        """No deadline is set."""
        return self not in self._timers.wheel

    def fire(self) -> None:
        """Run the callback now (the driver calls this once the deadline passed)."""
        self.callback(*self._args)


class LoopTimers:
    """The asyncio driver of one :class:`TimerWheel`: one ``loop.call_at`` armed for the
    earliest deadline. ``wakes`` counts the times it fired, ``fired`` the callbacks it ran."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wheel: TimerWheel[Timer] = TimerWheel()
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        #: The timers the running wake-up took as due and has not run yet.
        self._taken: set[Timer] = set()
        self.wakes = 0
        self.fired = 0

    def timer(self, callback: Callable[[], object], slack: float = 0.0) -> Timer:
        """A wake-up for one owner, with no deadline yet (:meth:`Timer.at`)."""
        return Timer(self, callback, slack)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any) -> Timer:
        """``loop.call_at``'s shape: ``callback(*args)`` once ``when`` has passed (exact); the
        returned :class:`Timer` has ``cancel()``."""
        t = Timer(self, callback, 0.0, *args)
        self.set(t, when, 0.0)
        return t

    def set(self, timer: Timer, when: float | None, slack: float) -> None:
        wheel = self.wheel
        if self._taken:
            self._taken.discard(timer)  # taken as due in this wake-up: cancelled or moved meanwhile
        wheel.set(timer, when, slack)
        if when is None:
            # A cleared deadline: the armed wake-up, at or before every deadline left, stays (it
            # finds nothing due, as below); no look at the heap.
            return
        first = wheel.next_deadline()
        armed = self._armed_at
        if first is None:
            return  # an armed wake-up stays: it finds nothing due (cheaper than re-arming each time)
        if armed is None or first < armed:
            if self._handle is not None:
                self._handle.cancel()
            self._armed_at = first
            self._handle = self.loop.call_at(first, self._fire)
        # a later first deadline: the armed wake-up finds nothing due and re-arms then

    def _fire(self) -> None:
        armed = self._armed_at
        self._handle = self._armed_at = None
        self.wakes += 1
        # asyncio runs a handle up to its clock resolution early: never let a deadline see that
        due = self.wheel.due(max(self.loop.time(), armed or 0.0))
        taken = self._taken = set(due)
        for timer in due:
            if timer not in taken:
                continue  # an earlier callback cancelled or moved it (as asyncio skips a cancelled handle)
            taken.discard(timer)
            self.fired += 1
            try:
                timer.fire()
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:  # one owner's fault does not stop the others
                self.loop.call_exception_handler(
                    {"message": "exception in a timer callback", "exception": exc, "timer": timer}
                )
        self._taken = set()
        first = self.wheel.next_deadline()
        if first is not None and self._handle is None:
            self._armed_at = first
            self._handle = self.loop.call_at(first, self._fire)


#: Each loop's driver, both held weakly: a driver lives while its timers or its armed loop timer
#: hold it, and a closed loop is collected with it (a driver refers to its loop).
_drivers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ReferenceType[LoopTimers]] = (
    weakref.WeakKeyDictionary()
)


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time`` as a function to call: :func:`time.monotonic` itself for asyncio's own
    loops (whose ``time()`` returns just that: one call per read, not two), else ``loop.time``
    (uvloop's, a test loop's own clock)."""
    if getattr(loop.time, "__func__", None) is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


def loop_timers(loop: asyncio.AbstractEventLoop | None = None) -> LoopTimers:
    """The one :class:`LoopTimers` of ``loop`` (default: the running loop)."""
    loop = loop or asyncio.get_running_loop()
    ref = _drivers.get(loop)
    drv = None if ref is None else ref()
    if drv is None:
        drv = LoopTimers(loop)
        _drivers[loop] = weakref.ref(drv)
    return drv


__all__ = ["GRIDS", "LoopTimers", "Timer", "TimerWheel", "loop_clock", "loop_timers", "rounded"]
