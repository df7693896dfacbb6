"""Handler slots and worker threads, shared fairly between the peers that are waiting.

:class:`Slots` bounds the handlers that run at once; :class:`FairThreads` runs synchronous ones on
worker threads. Both serve waiting peers in turn rather than in arrival order.

``asyncio.to_thread`` queues every call in one first-come, first-served line: a peer that floods a
node with valid messages puts hundreds of handler calls ahead of an honest peer's one request,
which then waits for all of them. :class:`FairThreads` keeps a line per peer and hands the threads
the next call from the peers in turn (round robin), never more at once than it has threads, so a
peer's wait depends on how many peers are waiting, not on how much one of them sent.

Results come back to the event loop together: a thread that finishes a call while earlier
results still wait for the loop adds its own to them instead of waking the loop again, so a busy
node pays one wake-up for many calls.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger("iac.node")

#: Threads, as asyncio's default executor has them.
DEFAULT_THREADS = min(32, (os.cpu_count() or 1) + 4)

_Call = tuple[Callable[[], Any], "asyncio.Future[Any]"]
_Handed = tuple[str, Callable[[], Any], "asyncio.Future[Any]"]


class _LeastRecent:
    """Which waiting peer goes next: the one served least recently (one never served, or back
    after a pause, first)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}
        self._served = 0

    def key(self, peer: str) -> int:
        return self._last.get(peer, -1)

    def served(self, peer: str) -> None:
        self._served += 1
        self._last[peer] = self._served

    def forget(self, peer: str) -> None:
        self._last.pop(peer, None)


class Slots:
    """Handlers running at once: a counter, and the peers waiting for a slot, each with its own
    line. A freed slot goes to the waiting peer served least recently (one never served, or back
    after a pause, first), so a peer's flood does not queue ahead of the others."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self._lines: dict[str, deque[asyncio.Future[None]]] = {}
        self._turns = _LeastRecent()

    def try_take(self) -> bool:
        if self.used < self.size and not self._lines:
            self.used += 1
            return True
        return False

    async def take(self, peer: str) -> None:
        if self.try_take():
            return
        fut = asyncio.get_running_loop().create_future()
        self._lines.setdefault(peer, deque()).append(fut)
        try:
            await fut  # the slot was handed over by give()
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.give()  # handed over as we were cancelled: pass it on
            else:
                line = self._lines.get(peer)
                if line is not None:
                    line.remove(fut)
                    if not line:
                        self._drop(peer)
            raise

    def give(self) -> None:
        while self._lines:
            peer = min(self._lines, key=self._turns.key)
            line = self._lines[peer]
            fut = line.popleft()
            if not line:
                self._drop(peer)
            else:
                self._turns.served(peer)
            if not fut.done():
                fut.set_result(None)  # the slot passes to this waiter
                return
        self.used -= 1

    def _drop(self, peer: str) -> None:
        del self._lines[peer]
        self._turns.forget(peer)


class FairThreads:
    """Runs calls on ``threads`` worker threads (started on first use); the next call to start is
    taken from the peers with calls waiting, in turn."""

    def __init__(self, threads: int = DEFAULT_THREADS) -> None:
        self.threads = threads
        self._lines: dict[str, deque[_Call]] = {}  # calls waiting, by peer
        self.running = 0  # calls handed to the threads and not yet back on the loop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: list[threading.Thread] = []
        self._lock = threading.Condition(threading.Lock())
        self._busy: Counter[str] = Counter()  # calls on the threads, by peer
        self._turns = _LeastRecent()
        self._todo: deque[_Handed] = deque()  # handed to the threads (guarded by _lock)
        self._results: list[tuple[str, asyncio.Future[Any], bool, Any]] = []  # (guarded by _lock)
        self._closed = False

    @property
    def waiting(self) -> int:
        """Calls waiting for a thread."""
        return sum(len(line) for line in self._lines.values())

    def run(self, peer: str, func: Callable[[], Any]) -> asyncio.Future[Any]:
        """Run ``func()`` (in a copy of the caller's context) on a worker thread when ``peer``'s
        turn comes; the future of its result."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut: asyncio.Future[Any] = loop.create_future()
        call = functools.partial(contextvars.copy_context().run, func)
        self._lines.setdefault(peer, deque()).append((call, fut))
        self._hand_out()
        return fut

    def close(self) -> None:
        """Cancel what has not started; the threads end once their call returns."""
        for line in self._lines.values():
            for _, fut in line:
                fut.cancel()
        self._lines.clear()
        with self._lock:
            self._closed = True
            for _, _, fut in self._todo:
                fut.cancel()
            self._todo.clear()
            self._lock.notify_all()

    # --- the loop's side --------------------------------------------------------------------------

    def _hand_out(self) -> None:
        calls: list[_Handed] = []
        while self.running < self.threads and self._lines:
            peer = self._next_peer()
            line = self._lines[peer]
            call, fut = line.popleft()
            if not line:
                del self._lines[peer]
            if fut.cancelled():  # the caller gave up (a deadline, a CANCEL) before it started
                continue
            self.running += 1
            self._busy[peer] += 1
            calls.append((peer, call, fut))
        if not calls:
            return
        with self._lock:
            self._todo.extend(calls)
            self._lock.notify(len(calls))
        while len(self._workers) < min(self.threads, self.running):
            t = threading.Thread(target=self._work, name=f"iac-handler-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()

    def _next_peer(self) -> str:
        """Of the peers with calls waiting: one with no call on a thread before one with some,
        then the one served least recently."""
        busy, turns = self._busy, self._turns
        peer = min(self._lines, key=lambda p: (busy.get(p, 0) > 0, turns.key(p)))
        turns.served(peer)
        return peer

    def _deliver(self) -> None:
        with self._lock:
            results, self._results = self._results, []
        self.running -= len(results)
        for peer, fut, ok, value in results:
            self._busy[peer] -= 1
            if self._busy[peer] <= 0:
                del self._busy[peer]
                if peer not in self._lines:  # idle: forgotten
                    self._turns.forget(peer)
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            elif isinstance(value, StopIteration):  # a future cannot hold one
                fut.set_exception(RuntimeError(f"the handler raised StopIteration: {value}"))
            else:
                fut.set_exception(value)
        self._hand_out()

    # --- the threads' side ------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._todo and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                peer, call, fut = self._todo.popleft()
            try:
                out: tuple[str, asyncio.Future[Any], bool, Any] = (peer, fut, True, call())
            except BaseException as exc:  # handed to the awaiting handler task
                out = (peer, fut, False, exc)
            with self._lock:
                self._results.append(out)
                first = len(self._results) == 1
            if first and self._loop is not None:  # later results ride on this wake-up
                try:
                    self._loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody waits any more
                    return


class HandlerSpeeds:
    """Which plain-function handlers have proved fast enough to run on the event loop.

    With ``sync_in_thread`` a plain function runs on a worker thread, so that one that blocks
    does not stall every peer; but the hop costs more than a quick handler itself, and while a
    flood keeps the threads busy, every hop is loop work in the flood's favour. A function that
    returned within :attr:`fast` seconds on :attr:`streak` calls in a row on a thread runs on the
    loop from then on; one call there that takes over :attr:`slow` seconds sends it back to the
    threads, with a warning that names it (after :attr:`strikes` such calls, for good).
    """

    def __init__(self, fast: float = 0.0005, streak: int = 64, slow: float = 0.005, strikes: int = 3) -> None:
        self.fast, self.streak, self.slow, self.strikes = fast, streak, slow, strikes
        self._runs: dict[Callable[..., Any], int] = {}  # fast calls in a row on a thread
        self._inline: set[Callable[..., Any]] = set()
        self._struck: Counter[Callable[..., Any]] = Counter()

    def inline(self, func: Callable[..., Any]) -> bool:
        return func in self._inline

    def timed(self, func: Callable[..., Any], call: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` as run on a thread, its duration counted for ``func``."""
        if self._struck[func] >= self.strikes:
            return call

        def run() -> Any:
            t0 = time.perf_counter()
            try:
                return call()
            finally:
                self._ran(func, time.perf_counter() - t0)

        return run

    def ran_inline(self, func: Callable[..., Any], seconds: float) -> None:
        """A call of ``func`` on the loop took ``seconds``: too long sends it back to the threads."""
        if seconds <= self.slow:
            return
        self._inline.discard(func)
        self._runs.pop(func, None)
        self._struck[func] += 1
        log.warning(
            "handler %s blocked the event loop for %.1f ms: it runs on a worker thread again%s",
            getattr(func, "__qualname__", repr(func)), seconds * 1e3,
            " (for good)" if self._struck[func] >= self.strikes else "",
            extra={"reason": "blocking_handler"},
        )  # fmt: skip

    def _ran(self, func: Callable[..., Any], seconds: float) -> None:  # on a worker thread
        if seconds > self.fast:
            self._runs[func] = 0
            return
        runs = self._runs.get(func, 0) + 1
        self._runs[func] = runs
        if runs >= self.streak:
            self._inline.add(func)


class LoopShare:
    """Holds the busiest peer to a share of the event loop while the loop is saturated (sans-IO).

    Every :attr:`period` the node reports how late its timer fired (the loop's lag: how long
    ready work kept it) and how many frames each peer sent meanwhile. While the lag is above
    :attr:`busy_lag` and other peers sent frames too, the peer that sent the most — at least
    :attr:`min_frames`, and :attr:`dominant` times the next — gets a rate of :attr:`cut` times
    what it sent (at least :attr:`floor` per second): its reader waits on that rate, the
    transport's flow control slows it, and the others' frames meet a shorter queue. While the
    lag is below :attr:`idle_lag`, every rate set here grows by :attr:`grow` per report until it
    is lifted. A peer alone is never held back: there is nobody to be fair to.
    """

    def __init__(
        self,
        *,
        period: float = 0.02,
        busy_lag: float = 0.0005,
        idle_lag: float = 0.0002,
        cut: float = 0.7,
        grow: float = 1.25,
        floor: float = 100.0,
        ceiling: float = 50_000.0,
        dominant: float = 4.0,
        min_frames: int = 16,
    ) -> None:
        self.period, self.busy_lag, self.idle_lag = period, busy_lag, idle_lag
        self.cut, self.grow, self.floor, self.ceiling = cut, grow, floor, ceiling
        self.dominant, self.min_frames = dominant, min_frames
        #: Frames per second each held peer may send now (peers not here are not held).
        self.rates: dict[str, float] = {}
        self.cuts = 0

    def report(self, lag: float, frames: dict[str, int], elapsed: float) -> None:
        """One period: the loop's lag (s), the frames each peer sent, over ``elapsed`` seconds."""
        ranked = sorted(frames.items(), key=lambda kv: kv[1], reverse=True)
        if lag > self.busy_lag and len(ranked) > 1 and ranked[1][1] > 0:
            peer, most = ranked[0]
            if most < max(self.min_frames, self.dominant * ranked[1][1]):
                return  # nobody stands out: nothing to share fairly
            sent = most / max(elapsed, 1e-6)
            now = self.rates.get(peer, sent)
            self.rates[peer] = max(self.floor, min(now, sent) * self.cut)
            self.cuts += 1
            return
        if lag < self.idle_lag:
            for peer in list(self.rates):
                rate = self.rates[peer] * self.grow
                if rate >= self.ceiling:
                    del self.rates[peer]
                else:
                    self.rates[peer] = rate


__all__ = ["DEFAULT_THREADS", "FairThreads", "HandlerSpeeds", "LoopShare", "Slots"]
