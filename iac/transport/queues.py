"""The bounded queues between the application and an adapter's I/O.

:class:`SendQueue` holds encoded frames on their way out: ``send()`` waits while
it is full, and an adapter takes out everything queued in one event-loop turn
(one write) or, on QUIC, a few frames at a time as stream credit allows.
:class:`Inbox` holds received frames, compressed, until ``recv()`` takes them,
each counted at its decompressed size against the connection's receive budget
(:mod:`iac.transport.budget`); an adapter stops reading while it is blocked.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from iac.errors import ConnectionClosed, IacError, ProtocolError
from iac.transport.base import Incoming
from iac.transport.budget import MemoryBudget, RecvBudget
from iac.wire.dicts import DictionarySet
from iac.wire.frames import Frame, PackedFrame

T = TypeVar("T")


#: A batch this large handed to ``recv()`` stays counted after a close until its frames are dropped.
LEASE_BYTES = 64 * 1024
#: How long a connection waiting for the node's budget waits before it asks for leased
#: budget to be reclaimed (:meth:`MemoryBudget.reclaim`).
RECLAIM_DELAY = 0.05


class _Reader(Protocol):
    """What an :class:`Inbox` knows of its reader (:class:`~iac.transport.reader.Reader`)."""

    running: bool
    busy: bool

    def wake(self) -> None: ...
    def deliver(self) -> None: ...


class _Lease:
    """Lent bytes of a closed connection: given back to the node when the last frame goes."""

    def __init__(self, node: MemoryBudget, nbytes: int, frames: list[Frame]) -> None:
        self.node = node
        self.nbytes = nbytes
        self.left = len(frames)
        node.lease(nbytes)
        for frame in frames:
            weakref.finalize(frame, self._dropped)

    def _dropped(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.node.settle(self.nbytes)


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
        #: Bytes queued (read it; the queue keeps it).
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._items)

    def has_room(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes fits now (an empty queue takes any frame)."""
        return not self._items or (
            len(self._items) < self.max_frames and self.nbytes + size <= self.max_bytes
        )


class SendQueue(_Bounded[bytes]):
    """Frames waiting to be written. ``put`` waits while the queue is full (bytes or
    frames); one frame larger than the byte bound still goes through an empty queue.
    ``get_batch``, ``take_all`` and ``take_data`` return everything queued so far, so frames
    queued in one event-loop turn leave in one write; ``take_shared`` takes a few at a time."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        super().__init__(max_frames, max_bytes)
        self._error: IacError | None = None
        self._finished = False
        self._finish_error: IacError | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._getter: asyncio.Future[None] | None = None

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` if that needs no wait; False when full (or closing: ``put`` raises)."""
        items = self._items
        size = len(frame)
        if self._error is not None or self._finished:
            return False
        if items and (len(items) >= self.max_frames or self.nbytes + size > self.max_bytes):
            return False  # (has_room, written out: this runs for every frame sent)
        items.append(frame)
        self.nbytes += size
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
        self.nbytes += len(frame)
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
        self.nbytes -= size
        if self._putters:
            _wake(self._putters)
        return out

    def take_data(self) -> bytes:
        """Everything queued now, joined (``b""`` when nothing is), without waiting; wakes waiting
        ``put`` calls. What one write of a stream takes."""
        items = self._items
        if not items:
            return b""
        data = items.popleft() if len(items) == 1 else b"".join(items)
        items.clear()
        self.nbytes = 0
        if self._putters:
            _wake(self._putters)
        return data

    def take_all(self) -> list[bytes]:
        """Everything queued now (maybe nothing), without waiting; wakes waiting ``put`` calls."""
        out = list(self._items)
        self._items.clear()
        self.nbytes = 0
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
        self.nbytes = 0
        _wake(self._putters)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)


class Inbox:
    """The receive side of one connection, between its frame decoder(s) and ``recv()``.

    Frames come in as they were received (:class:`PackedFrame`: compressed bodies stay
    compressed) and every byte is counted against the connection's :class:`RecvBudget`
    (which draws from the node's) from the moment it arrived:

    * partly received frames: the bytes the decoders hold (:meth:`set_partial`);
    * received, not yet judged (the backlog, :meth:`arrived`): their wire size;
    * judged and waiting for ``recv()`` (the queue): their *decompressed* size, known from
      the zstd header (:meth:`next_frame` takes the difference, or stops while the budget
      cannot give it);
    * handed out by the last ``recv()``: the same, until the next ``recv()``.

    A frame is decompressed only when ``recv()`` takes it, and one ``recv()`` takes at most
    ``batch_bytes`` of decompressed bytes (at least one frame). The adapter stops reading
    while :attr:`blocked`; ``on_room`` is called when budget came back (a ``recv()``, or
    another connection of the node giving budget back), so the adapter can judge its
    backlog and read again. A frame that does not decompress is passed to ``on_fault``
    (the adapter closes the connection). After :meth:`close` the queued frames are still
    handed out (unless this side closed), then ``get_many`` raises the error; once
    nothing is queued or handed out, nothing is counted any more.
    """

    def __init__(
        self,
        *,
        max_frames: int,
        budget: RecvBudget,
        dictionaries: DictionarySet,
        batch_bytes: int,
        on_room: Callable[[], None],
        on_fault: Callable[[ProtocolError], None],
    ) -> None:
        self.max_frames = max_frames
        self.budget = budget
        self.dictionaries = dictionaries
        self.batch_bytes = batch_bytes
        self._on_room = on_room
        self._on_fault = on_fault
        self.backlog: deque[PackedFrame] = deque()
        #: Wire bytes of the backlog.
        self.backlog_bytes = 0
        #: Judged frames waiting for ``recv()``, in order (read it; the inbox keeps it).
        self.queue: deque[PackedFrame] = deque()
        #: The inbox closed (:meth:`close`): nothing more is judged. Kept by the inbox.
        self.closed = False
        self._told_blocked = False  # blocked was True since the last on_room
        #: Bytes of partly received frames the decoders hold (:meth:`set_partial`).
        self.partial = 0
        self._lent = 0
        self._handed: list[weakref.ref[Frame]] = []  # the last batch, when it was large
        self._error: IacError | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._waiting_node = False
        self._reclaim_handle: asyncio.TimerHandle | None = None
        #: The connection's reader while it serves (:meth:`Connection.serve`): the adapter
        #: calls its ``deliver()`` after judging frames in, and a close wakes it.
        self.reader: _Reader | None = None

    def __len__(self) -> int:
        """Frames waiting for ``recv()``."""
        return len(self.queue)

    @property
    def blocked(self) -> bool:
        """Read no further: frames wait to be judged, or the budget (this connection's or
        the node's) is spent. While the node's is, ``on_room`` follows when it comes back."""
        if self._error is not None:
            return False
        budget = self.budget
        if budget.spent:
            if budget.node.spent:
                self._wait_node()
        elif not self.backlog:
            return False
        self._told_blocked = True
        return True

    # --- fed by the adapter ---------------------------------------------------------------------

    def set_partial(self, nbytes: int) -> None:
        """The decoders now hold ``nbytes`` of partly received frames."""
        if self._error is None and nbytes != self.partial:
            self.budget.take(nbytes - self.partial)
            self.partial = nbytes

    def arrived(self, frames: list[PackedFrame]) -> None:
        """Whole frames received, to be judged in order (they are here: counted even past the budget)."""
        if self._error is not None:
            return
        size = 0
        for frame in frames:
            size += frame.wire_size
        self.budget.take(size)
        self.backlog_bytes += size
        self.backlog.extend(frames)

    def drop_backlog(self) -> None:
        """Forget the frames not judged yet (the connection is ending)."""
        self.budget.give(self.backlog_bytes)
        self.backlog.clear()
        self.backlog_bytes = 0

    def next_frame(self) -> PackedFrame | None:
        """The first backlog frame, once the queue has room and the budget can hold it
        decompressed (the difference is taken); None while it cannot: read no further."""
        backlog = self.backlog
        if not backlog or self._error is not None or len(self.queue) >= self.max_frames:
            return None
        frame = backlog[0]
        extra = frame.cost - frame.wire_size
        if extra > 0 and not self.budget.try_take(extra):
            if not self.budget.node.room_for(extra):
                self._wait_node()
            return None
        backlog.popleft()
        self.backlog_bytes -= frame.wire_size
        return frame

    def judged(self, frame: PackedFrame, *, keep: bool) -> None:
        """A frame from :meth:`next_frame` was judged: ``keep`` queues it for ``recv()``,
        else (a control frame, handled) its budget comes back."""
        if not keep or self._error is not None:
            self.budget.give(frame.cost)
            return
        self.budget.lend(frame.cost)
        self.queue.append(frame)
        if self._getters:
            _wake(self._getters)

    # --- the reader -----------------------------------------------------------------------------

    async def get_many(self, limit: int) -> list[Incoming]:
        """Wait for one frame; return it decoded, with up to ``limit - 1`` more that are
        already queued while their decompressed bytes stay within ``batch_bytes``. What the
        previous call handed out is given back to the budget now."""
        self.give_back()
        queue = self.queue
        while not queue:
            if self._error is not None:
                raise self._error
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            await fut
        return self.take(limit)

    def give_back(self) -> None:
        """The reader is done with the frames it was handed last: their budget comes back
        (``on_room`` when frames wait to be judged or the adapter was told to stop reading)."""
        if self._lent:
            self.budget.returned(self._lent)
            self._lent = 0
            self._handed = []
            if self.backlog or self._told_blocked:
                self._told_blocked = False
                self._on_room()

    def take(self, limit: int) -> list[Incoming]:
        """:meth:`get_many` without the wait, for a reader that was told frames are queued (a
        :class:`~iac.transport.reader.Reader`): the frames queued (none if none is), or the
        close error once the inbox closed and nothing is queued."""
        queue = self.queue
        if not queue and self._error is not None:
            raise self._error
        out: list[Incoming] = []
        size = 0
        lent = self._lent
        while queue and len(out) < limit:
            frame = queue[0]
            if out and size + frame.size > self.batch_bytes:
                break
            queue.popleft()
            try:
                out.append(Incoming(frame.unpack(self.dictionaries)))
            except ProtocolError as exc:
                self.budget.returned(frame.cost)
                self._on_fault(exc.with_traceback(None))  # the adapter closes the connection
                if not out:
                    raise (self._error or exc) from None
                break
            size += frame.size
            lent += frame.cost
        self._lent = lent
        if lent >= LEASE_BYTES:  # if the connection closes before the next call, follow them
            self._handed = [weakref.ref(inc.frame) for inc in out]
        if self._error is not None and not queue:
            self._settle()
        elif self.backlog:
            self._on_room()  # the queue has room again for frames waiting to be judged
        return out

    def close(self, error: IacError, *, drop: bool = False) -> None:
        """The connection is closing: judge nothing more, wake readers. ``drop`` (this side
        closed it): the queued frames go too. Otherwise readers still take what is queued
        (counted until taken, or until this inbox is dropped), then get ``error``. Frames
        handed out last stay counted until the reader comes back or drops them."""
        if self._error is None:
            self._error = error
            self.closed = True
            self.budget.node.forget(self._node_room)
            if self._reclaim_handle is not None:
                self._reclaim_handle.cancel()
                self._reclaim_handle = None
            self.budget.give(self.partial + self.backlog_bytes)
            self.backlog.clear()
            self.backlog_bytes = self.partial = 0
        if drop and self.queue:
            self.budget.returned(sum(frame.cost for frame in self.queue))
            self.queue.clear()
        if self.queue:
            weakref.finalize(self, self.budget.release)
        else:
            self._settle()
        _wake(self._getters)
        if self.reader is not None:
            self.reader.wake()

    def _settle(self) -> None:
        """Closed, nothing queued: give back everything but what the reader still holds."""
        held = [frame for ref in self._handed if (frame := ref()) is not None]
        self.budget.release(keep=self._lent if held else 0)
        if held:
            _Lease(self.budget.node, self._lent, held)
        self._lent = 0
        self._handed = []

    def _wait_node(self) -> None:
        node = self.budget.node
        if not self._waiting_node:
            self._waiting_node = True
            node.notify(self._node_room)
        if node.leased and self._reclaim_handle is None:
            # Frames handed out by closed connections may be held only by reference cycles.
            self._reclaim_handle = asyncio.get_running_loop().call_later(RECLAIM_DELAY, self._reclaim)

    def _reclaim(self) -> None:
        self._reclaim_handle = None
        if self._error is None and self._waiting_node:
            self.budget.node.reclaim(asyncio.get_running_loop().time())
            if self._waiting_node:
                self._wait_node()

    def _node_room(self) -> None:
        self._waiting_node = False
        if self._error is None:
            self._on_room()


__all__ = ["Inbox", "SendQueue"]
