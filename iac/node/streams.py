"""Streaming replies: a request answered by a sequence of REPLY parts (docs/PROTOCOL.md,
"Streaming replies").

The consumer sends a request flagged STREAM with ``credit`` = the parts it will take in all so far
(its window); the producer sends part ``stream_seq`` 1, 2, 3, ... only while ``stream_seq <=
credit``, then a last REPLY flagged END (or an ERROR, which carries the next ``stream_seq`` too).
The consumer grants more with CREDIT messages (``credit`` grows as it takes parts), so the producer
never runs more than the window ahead of what the consumer took. Parts may arrive out of order
(one QUIC stream each): the consumer puts them back in ``stream_seq`` order; it holds at most a
window of them. Closing the consumer's iterator early sends CANCEL, which ends the handler.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from iac.errors import ConfigError, IacError, MessageRejected, RemoteError, RequestTimeout
from iac.node.observe import Observers
from iac.node.outbox import Outbox
from iac.node.pending import Pending
from iac.node.types import Key, Reply
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.message import FLAG_END, FLAG_STREAM

#: Most parts a consumer may let a producer run ahead.
MAX_WINDOW = 1024


@dataclass(slots=True)
class StreamIn:
    """The consumer's side of one stream: parts put back in order, credit to grant."""

    key: Key
    window: int
    #: Parts (or the ending ERROR) by stream_seq, not yet taken.
    held: dict[int, Reply | RemoteError] = field(default_factory=dict)
    next_seq: int = 1
    #: The credit granted so far (parts the producer may send in all).
    granted: int = 0
    end_seq: int | None = None
    failure: BaseException | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def on_part(self, msg: Message, reply: Reply) -> None:
        if not msg.flags & FLAG_STREAM:  # a peer that does not stream answered once: the only part
            if self.next_seq == 1 and not self.held:
                self.held[1] = reply
                self.end_seq = 2
                self.wake.set()
            return
        seq = int(msg.stream_seq)
        if seq < self.next_seq or seq in self.held:
            return  # a duplicate: the replay window stops these first
        if seq > self.granted + 1:  # beyond the credit (+1: the END or ERROR that closes it)
            self.fail(
                MessageRejected(f"part {seq} came with credit for {self.granted}", reason="stream_overrun")
            )
            return
        if msg.flags & FLAG_END:
            self.end_seq = seq
        else:
            self.held[seq] = reply
        self.wake.set()

    def on_error(self, msg: Message, error: RemoteError) -> None:
        seq = int(msg.stream_seq) or self.next_seq
        self.held[seq] = error
        self.end_seq = seq
        self.wake.set()

    def fail(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc
        self.wake.set()

    def take(self) -> Reply | None:
        """The next part in order, or None: none ready yet, or the stream ended (:attr:`done`);
        raises the ERROR that ended it."""
        if self.failure is not None:
            raise self.failure
        part = self.held.pop(self.next_seq, None)
        if part is None:
            self.wake.clear()
            return None
        self.next_seq += 1
        if isinstance(part, RemoteError):
            raise part
        return part

    @property
    def done(self) -> bool:
        return self.end_seq is not None and self.next_seq >= self.end_seq

    def credit_due(self) -> int | None:
        """The credit to grant now (every half window taken), or None."""
        if self.end_seq is not None:
            return None  # the producer has sent its last part
        if self.granted - (self.next_seq - 1) <= self.window // 2:
            self.granted = self.next_seq - 1 + self.window
            return self.granted
        return None


class StreamOut:
    """The producer's side of one stream: the credit the consumer granted, and a waiter.
    ``link``: the neighbour the request came from (the consumer, or the relay it came through):
    once this node has no connection to it, the stream ends (:meth:`Dispatcher.link_lost`)."""

    __slots__ = ("_wake", "granted", "link")

    def __init__(self, granted: int, link: str = "") -> None:
        self.granted = granted
        self.link = link
        self._wake = asyncio.Event()

    def grant(self, credit: int) -> None:
        if credit > self.granted:  # credit only grows: a late or repeated CREDIT changes nothing
            self.granted = credit
            self._wake.set()

    async def wait_for(self, seq: int) -> None:
        """Wait until part ``seq`` may go (the consumer granted credit for it)."""
        while seq > self.granted:
            self._wake.clear()
            await self._wake.wait()


class Streams:
    """The streams this node consumes, by the key of their request: parts land here."""

    def __init__(self, outbox: Outbox, pending: Pending, observers: Observers) -> None:
        self._outbox = outbox
        self._pending = pending
        self._observers = observers
        self.open: dict[Key, StreamIn] = {}

    def on_reply(self, key: Key, msg: Message, reply: Reply) -> bool:
        st = self.open.get(key)
        if st is None:
            return False
        st.on_part(msg, reply)
        return True

    def on_error(self, key: Key, msg: Message, error: RemoteError) -> bool:
        st = self.open.get(key)
        if st is None:
            return False
        st.on_error(msg, error)
        return True

    def fail_all(self, exc: BaseException, peer: str | None = None) -> None:
        """End the streams (of ``peer`` only, when given) with ``exc``."""
        for st in self.open.values():
            if peer is None or st.key[0] == peer:
                st.fail(exc)

    async def consume(
        self,
        peer: str,
        msg_type: int,
        payload: Any,
        *,
        timeout: float,
        idle_timeout: float,
        window: int,
        via: str | None,
        early: bool,
        **build: Any,
    ) -> AsyncGenerator[Reply, None]:
        """Send a STREAM request and yield its parts in order (see :meth:`~iac.Node.stream`)."""
        for name, value in (("timeout", timeout), ("idle_timeout", idle_timeout)):
            if not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a positive, finite number of seconds, not {value!r}")
        if not 1 <= window <= MAX_WINDOW:
            raise ConfigError(f"window must be in 1 .. {MAX_WINDOW}")
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + timeout
        sem = self._pending.permit(peer)
        await sem.acquire()
        outbox = self._outbox
        msg = outbox.build(peer, msg_type, payload, flags=FLAG_STREAM,
                           deadline_us=outbox.clock.now_us() + int(timeout * 1e6), **build)  # fmt: skip
        msg.credit = window
        st = StreamIn((peer, msg.session_id, msg.msg_id), window, granted=window)
        self.open[st.key] = st
        finished = False
        outcome = "cancelled"  # closed before the end, unless said otherwise below
        try:
            await outbox.transmit(peer, msg, via, early=early)
            while True:
                part = st.take()  # raises the ERROR that ended the stream
                if part is not None:
                    credit = st.credit_due()
                    if credit is not None:
                        await outbox.send_control(peer, MessageType.CREDIT, msg, via, credit=credit)
                    yield part
                    continue
                if st.done:
                    finished = True
                    outcome = "reply"
                    return
                left = ends_at - loop.time()
                if left <= 0:
                    raise RequestTimeout(f"stream from {peer[:16]}…: not over within {timeout:g} s")
                try:
                    async with asyncio.timeout(min(idle_timeout, left)):
                        await st.wake.wait()
                except TimeoutError:
                    if idle_timeout < left:
                        raise RequestTimeout(
                            f"stream from {peer[:16]}…: no part for {idle_timeout:g} s"
                        ) from None
        except RemoteError as exc:
            finished = True  # the producer ended it
            outcome = exc.code
            raise
        except RequestTimeout:
            outcome = "timeout"
            raise
        except IacError:
            outcome = "transport"
            raise
        finally:
            if self._observers.items:
                self._observers.answered(peer, msg_type, loop.time() - (ends_at - timeout), outcome)
            del self.open[st.key]
            sem.release()
            if not finished:  # closed early, timed out, failed: the handler stops
                self._pending.spawn(outbox.send_control(peer, MessageType.CANCEL, msg, via))


__all__ = ["StreamIn", "StreamOut", "Streams"]
