"""Ordered delivery: a reorder buffer per sender session (ORDERED messages), and a worker per
session that hands the released messages to their handlers one at a time, in order.

A session's buffer starts where the replay store says the session stands (its highest id done or
held by another process, :meth:`~iac.protocol.replay.ReplayStore.frontier`), so a node that
restarted, or forgot an idle session, goes on at once instead of waiting for ids handled before.
While the store is asked (a store off the loop answers in a thread), the session's messages wait
in arrival order."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from iac.errors import Refusal
from iac.node.answers import Answers
from iac.node.dispatch import Dispatcher
from iac.node.parts import Parts
from iac.node.types import Item
from iac.protocol.reorder import Delivered, Duplicate, GapSkipped, Late, ReorderBuffer, ReorderConfig
from iac.protocol.replay import serial_add
from iac.wire._pb.iac_pb2 import Message
from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_ORDERED, sender_of

log = logging.getLogger("iac.node")


class _Stream:
    """Reorder state of one sender session: the buffer, and the queue its worker drains in order."""

    __slots__ = ("buffer", "early", "last_us", "queue", "timer", "timer_at", "worker")

    def __init__(self, buffer: ReorderBuffer[Item], now_us: int) -> None:
        self.buffer = buffer
        #: While the store is asked where the session stands: the messages (and refused ids, as
        #: ``(None, msg, now)``) that came meanwhile, in arrival order; None once the buffer runs.
        self.early: list[tuple[Item | None, Message, int]] | None = None
        self.queue: deque[Item] = deque()
        self.worker: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at: int | None = None
        self.last_us = now_us


class OrderedDelivery:
    """The ORDERED sessions of every sender."""

    def __init__(self, parts: Parts, dispatcher: Dispatcher, answers: Answers) -> None:
        self.config = parts.config
        self._dispatcher = dispatcher
        self._answers = answers
        self._c = parts.counters
        self._tasks = parts.tasks
        self._clock = parts.rx_clock
        self._store = parts.store
        self._streams: dict[tuple[str, int], _Stream] = {}
        self.queued = 0
        self.draining = False
        self.closed = False

    def push(self, item: Item, now: int) -> None:
        st = self._stream(item.msg, now)
        if st.early is not None:
            st.early.append((item, item.msg, now))
            return
        self._apply(st, st.buffer.push(item.msg.msg_id, item, now, item.msg.timestamp))

    def skip(self, msg: Message, now: int) -> None:
        """A refused ORDERED message still advances its session's buffer."""
        if msg.flags & FLAG_ORDERED:
            st = self._stream(msg, now)
            if st.early is not None:
                st.early.append((None, msg, now))
                return
            self._apply(st, st.buffer.skip(msg.msg_id, now))

    @property
    def streams(self) -> int:
        return len(self._streams)

    @property
    def held(self) -> int:
        return sum(len(st.buffer) + len(st.early or ()) for st in self._streams.values())

    def expire(self, now: int) -> None:
        """Forget sessions idle for 2 × max_skew (a message older than that is stale anyway)."""
        retention = 2 * self.config.transport.max_skew_us
        for skey, st in list(self._streams.items()):
            idle = not len(st.buffer) and not st.queue and st.worker is None and st.early is None
            if idle and now - st.last_us > retention:
                del self._streams[skey]

    def close(self) -> None:
        self.closed = True
        for st in self._streams.values():
            if st.timer is not None:
                st.timer.cancel()

    # --- internals --------------------------------------------------------------------------------

    def _stream(self, msg: Message, now: int) -> _Stream:
        skey = (sender_of(msg), msg.session_id)
        st = self._streams.get(skey)
        if st is None:
            cfg = ReorderConfig(
                max_buffered=self.config.reorder_max_buffered,
                reliable=bool(msg.flags & FLAG_ACK_REQUESTED),
                retransmit_deadline_us=int(self.config.delivery_timeout * 1e6),
            )
            st = self._streams[skey] = _Stream(ReorderBuffer(cfg, first_id=1), now)
            # Asked now, so the store answers before any commit this node makes for the session.
            asked = self._store.frontier(skey[0], skey[1], now)
            if asked.done():
                st.buffer = ReorderBuffer(cfg, first_id=self._first(msg.msg_id, asked.result()))
            else:
                st.early = []
                asked.add_done_callback(lambda f: self._begin(st, cfg, msg.msg_id, f))
        st.last_us = now
        return st

    def _first(self, msg_id: int, frontier: int | None) -> int:
        """Where a new buffer starts: after the session's highest id done or held by another
        process (one killed before its commit may have answered it), if the store knows the
        session; else at msg_id 1, or where it is first seen if that is further on (the store
        forgot the session, or never had it: a node that restarted with the memory store)."""
        if frontier is not None:
            return serial_add(frontier, 1)
        return 1 if msg_id < self.config.reorder_max_buffered else msg_id

    def _begin(self, st: _Stream, cfg: ReorderConfig, msg_id: int, asked: asyncio.Future[int | None]) -> None:
        """The store answered: start the buffer, then give it what came meanwhile, in order."""
        frontier = None if asked.cancelled() or asked.exception() is not None else asked.result()
        st.buffer = ReorderBuffer(cfg, first_id=self._first(msg_id, frontier))
        early, st.early = st.early or [], None
        for item, msg, now in early:
            if self.closed:
                if item is not None:
                    self._dispatcher.release(item)
                continue
            if item is None:
                self._apply(st, st.buffer.skip(msg.msg_id, now))
            else:
                self._apply(st, st.buffer.push(msg.msg_id, item, now, msg.timestamp))

    def _apply(self, st: _Stream, events: list[Any]) -> None:
        for ev in events:
            if isinstance(ev, Delivered):
                self._enqueue(st, ev.item)
            elif isinstance(ev, GapSkipped):
                self._c.gaps += 1
                log.info("ordered session: gave up on %d message(s) (%s)", ev.count, ev.reason.value)
            elif isinstance(ev, Late):
                # Behind the delivery point (its gap was given up): handle it out of order, never drop.
                self._c.late += 1
                self._enqueue(st, ev.item)
            elif isinstance(ev, Duplicate):  # pragma: no cover - the replay store stops these first
                self._c.refused[Refusal.DUPLICATE.value] += 1
                self._dispatcher.release(ev.item)
        if st.queue and st.worker is None:
            st.worker = self._tasks.spawn(self._worker(st))
        self._arm(st)

    def _enqueue(self, st: _Stream, item: Item) -> None:
        if len(st.queue) >= self.config.max_backlog or self.draining:
            self._dispatcher.commit(item)  # busy is this message's answer: a retransmission gets it again
            self._tasks.spawn(self._answers.refuse(item.conn, item.msg, Refusal.BUSY, "ordered queue full"))
            return
        st.queue.append(item)
        self.queued += 1

    def _arm(self, st: _Stream) -> None:
        at = st.buffer.next_deadline()
        if at is None or at == st.timer_at:
            return
        if st.timer is not None:
            st.timer.cancel()
        delay = max(0.0, (at - self._clock.now_us()) / 1e6)
        st.timer_at = at
        st.timer = asyncio.get_running_loop().call_later(delay, self._on_timer, st)

    def _on_timer(self, st: _Stream) -> None:
        st.timer = None
        st.timer_at = None
        self._apply(st, st.buffer.poll(self._clock.now_us()))

    async def _worker(self, st: _Stream) -> None:
        try:
            while st.queue:
                item = st.queue.popleft()
                self.queued -= 1
                self._dispatcher.admit(item)
                await self._dispatcher.run(item)
        finally:
            st.worker = None
            if st.queue and not self.closed:
                st.worker = self._tasks.spawn(self._worker(st))


__all__ = ["OrderedDelivery"]
