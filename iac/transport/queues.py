"""The bounded queues between the application and an adapter's I/O.

:class:`SendQueue` holds encoded frames on their way out: ``send()`` waits while
it is full, and an adapter takes out everything queued in one event-loop turn
(one write) or, on QUIC, a few frames at a time as stream credit allows.
:class:`RecvQueue` holds judged frames waiting for ``recv()``; an adapter checks
for room before it queues and stops reading while there is none.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

from iac.errors import ConnectionClosed, IacError
from iac.transport.base import Incoming

T = TypeVar("T")


def _wake(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)


class _Bounded(Generic[T]):
    """Items counted against a bound in frames and one in bytes."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._items: deque[T] = deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def has_room(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes fits now (an empty queue takes any frame)."""
        return not self._items or (
            len(self._items) < self.max_frames and self._bytes + size <= self.max_bytes
        )


class SendQueue(_Bounded[bytes]):
    """Frames waiting to be written. ``put`` waits while the queue is full (bytes or
    frames); one frame larger than the byte bound still goes through an empty queue.
    ``get_batch`` and ``take_all`` return everything queued so far, so frames queued
    in one event-loop turn leave in one write; ``take_shared`` takes a few at a time."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        super().__init__(max_frames, max_bytes)
        self._error: IacError | None = None
        self._finished = False
        self._finish_error: IacError | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._getter: asyncio.Future[None] | None = None

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` if that needs no wait; False when full (or closing: ``put`` raises)."""
        if self._error is not None or self._finished or not self.has_room(len(frame)):
            return False
        self._items.append(frame)
        self._bytes += len(frame)
        return True

    async def put(self, frame: bytes) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if self._finished:
                raise self._finish_error or ConnectionClosed("connection is closing")
            if self.has_room(len(frame)):
                break
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            await fut
        self.put_nowait(frame)

    def put_nowait(self, frame: bytes) -> None:
        """Queue regardless of the bound (GOAWAY, internal control frames)."""
        self._items.append(frame)
        self._bytes += len(frame)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)

    async def get_batch(self) -> list[bytes] | None:
        """Everything queued (waits for at least one frame); None once finished and empty."""
        while not self._items:
            if self._finished or self._error is not None:
                return None
            self._getter = asyncio.get_running_loop().create_future()
            await self._getter
            self._getter = None
        return self.take_all()

    def take_shared(self, limit: int) -> list[bytes]:
        """The first queued frame (the queue must not be empty) and, while their total
        stays within ``limit`` bytes, the frames behind it: small frames that share one
        QUIC stream. Wakes waiting ``put`` calls."""
        items = self._items
        first = items.popleft()
        out = [first]
        size = len(first)
        while items and size + len(items[0]) <= limit:
            nxt = items.popleft()
            out.append(nxt)
            size += len(nxt)
        self._bytes -= size
        if self._putters:
            _wake(self._putters)
        return out

    def take_all(self) -> list[bytes]:
        """Everything queued now (maybe nothing), without waiting; wakes waiting ``put`` calls."""
        out = list(self._items)
        self._items.clear()
        self._bytes = 0
        if self._putters:
            _wake(self._putters)
        return out

    @property
    def done(self) -> bool:
        """Finished or failed, and nothing left to write."""
        return (self._finished or self._error is not None) and not self._items

    def finish(self, error: IacError | None = None) -> None:
        """No more frames: the writer drains what is queued, then stops. Later and
        waiting ``put`` calls raise ``error``."""
        self._finished = True
        self._finish_error = error
        _wake(self._putters)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)

    def fail(self, error: IacError) -> None:
        """Drop everything queued; waiting and later ``put`` calls raise ``error``."""
        self._error = error
        self._items.clear()
        self._bytes = 0
        _wake(self._putters)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)


class RecvQueue(_Bounded[Incoming]):
    """Frames waiting for ``recv()``. ``put`` waits while full (the adapter stops
    reading, which pushes back on the peer). After ``fail`` the queued frames are
    still handed out, then ``get`` raises the error."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        super().__init__(max_frames, max_bytes)
        self._error: IacError | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()

    def put_nowait(self, item: Incoming) -> None:
        """Queue regardless of the bound: the caller checked :meth:`has_room`, or bounds
        the queue another way (QUIC withholds stream credit). Also after ``fail``: frames
        the peer sent before it closed still reach ``get``."""
        self._items.append(item)
        self._bytes += item.frame.wire_size or len(item.frame.body)
        if self._getters:
            _wake(self._getters)

    async def put(self, item: Incoming) -> None:
        size = item.frame.wire_size or len(item.frame.body)
        while self._error is None and not self.has_room(size):
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            await fut
        if self._error is not None:
            return
        self._items.append(item)
        self._bytes += size
        _wake(self._getters)

    async def get(self) -> Incoming:
        return (await self.get_many(1))[0]

    async def get_many(self, limit: int) -> list[Incoming]:
        """Wait for one frame; return it with up to ``limit - 1`` more that are already queued."""
        while not self._items:
            if self._error is not None:
                raise self._error
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            await fut
        items = self._items
        out = [items.popleft() for _ in range(min(limit, len(items)))]
        self._bytes -= sum(item.frame.wire_size or len(item.frame.body) for item in out)
        if self._putters:
            _wake(self._putters)
        return out

    def fail(self, error: IacError) -> None:
        if self._error is None:
            self._error = error
        _wake(self._putters)
        _wake(self._getters)


__all__ = ["RecvQueue", "SendQueue"]
