"""A bound on the QUIC handshakes one event loop dials at once: :class:`DialSlots`.

A QUIC handshake is a few round trips of CPU-heavy steps (key shares, certificate,
Finished, the HELLO exchange with its signatures), all run by the dialing process's
event loop. When hundreds of dials start together in one loop (a node reconnecting
to its peers after a restart, a registry's clients after a network blip, many client
nodes in one process), every loop turn carries a step of each of them: every
handshake's round trips stretch together, all of them pass their timeout together,
give up together and dial again together, and the server spends its handshake slots
on dials whose client has already gone (congestion collapse).

So :func:`~iac.transport.quic.dial_quic` takes a slot of its event loop's
:class:`DialSlots` before its handshake starts and gives it back once the handshake
ended (verified, failed or cancelled; a 0-RTT dial once its early HELLO went, as
the dial then returns). At most ``TransportConfig.quic_dial_concurrency`` handshakes run per loop;
further dials wait their turn, oldest first, and their ``handshake_timeout`` starts
when their turn comes (the wait does not count against it). A caller's own deadline
(``DialPolicy.attempt_timeout``, ``asyncio.timeout``) covers the wait too: a
cancelled waiter leaves the queue and the next one takes its turn.

The bound is per event loop, not per node, because the loop's turns are what the
handshakes share; the limit is read from each dial's configuration when it asks (a
dial asking with a lower limit waits until fewer run).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class DialSlots:
    """Handshakes in flight on one event loop, at most ``limit`` at a time, the rest queued
    first come, first served. No clock: who waits and for how long is the caller's."""

    def __init__(self) -> None:
        #: Handshakes holding a slot now.
        self.in_flight = 0
        #: The most that held a slot at once (diagnostics and tests).
        self.peak = 0
        #: Dials that had to wait for their turn.
        self.waited = 0
        self._waiters: deque[tuple[asyncio.Future[None], int]] = deque()

    @property
    def waiting(self) -> int:
        """Dials waiting for a slot."""
        return sum(1 for fut, _ in self._waiters if not fut.done())

    async def acquire(self, limit: int) -> None:
        """Take a slot: at once while fewer than ``limit`` run and nobody waits, else in turn."""
        if self.in_flight < limit and not self._waiters:
            self._take()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((fut, limit))
        self.waited += 1
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():  # granted, then cancelled: pass the slot on
                self.release()
            else:
                self._wake()  # a waiter behind this one may fit now
            raise

    def release(self) -> None:
        """Give a slot back; the oldest waiter that fits takes it."""
        self.in_flight -= 1
        self._wake()

    def _take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            fut, limit = waiters[0]
            if fut.done():  # cancelled while queued
                waiters.popleft()
                continue
            if self.in_flight >= limit:
                return
            waiters.popleft()
            self._take()
            fut.set_result(None)

    @asynccontextmanager
    async def slot(self, limit: int) -> AsyncIterator[None]:
        """A slot for the body of the ``async with``."""
        await self.acquire(limit)
        try:
            yield
        finally:
            self.release()


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DialSlots] = weakref.WeakKeyDictionary()


def dial_slots(loop: asyncio.AbstractEventLoop | None = None) -> DialSlots:
    """The :class:`DialSlots` of ``loop`` (default: the running loop)."""
    loop = loop or asyncio.get_running_loop()
    slots = _per_loop.get(loop)
    if slots is None:
        slots = _per_loop[loop] = DialSlots()
    return slots


__all__ = ["DialSlots", "dial_slots"]
