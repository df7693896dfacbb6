"""What this node waits for: requests until their REPLY or ERROR, and ACK_REQUESTED messages until
their ACK — retransmitted (same ids, fresh timestamp, signed again) with exponential backoff and
after every reconnect, up to ``delivery_timeout``.

Per request the table keeps an :class:`Out`, a permit of the peer's ``max_in_flight``
(:class:`Permits`) and a deadline in :class:`Deadlines`: one wake-up of the transport's timer
structure for all the requests' timeouts, set for the earliest, not a loop timer per request."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import math
import weakref
from collections import deque
from collections.abc import Iterable
from functools import partial
from typing import Any

from iac.errors import ConfigError, DeliveryError, RemoteError, RequestTimeout, TransportError
from iac.node.outbox import Outbox
from iac.node.parts import Parts
from iac.node.peers import Peers
from iac.node.types import Key, Reply, Sent
from iac.transport.timers import Timer, loop_timers
from iac.wire._pb.iac_pb2 import Message, TaskState
from iac.wire.enums import MessageType
from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_ORDERED

log = logging.getLogger("iac.node")

_CANCEL = int(MessageType.CANCEL)


class Out:
    """One outgoing request or ACK_REQUESTED message waiting for its answer."""

    __slots__ = (
        "acked",
        "early",
        "future",
        "give_up_at",
        "is_request",
        "key",
        "msg",
        "peer",
        "reliable",
        "rto",
        "timer",
        "via",
    )

    def __init__(
        self,
        peer: str,
        msg: Message,
        reliable: bool,
        is_request: bool,
        give_up_at: float,
        rto: float,
        future: asyncio.Future[Any],
        via: str | None = None,
        early: bool = True,
    ) -> None:
        # (positional: a class called with keywords collects them in a dict, one per request)
        self.peer = peer
        self.msg = msg
        self.key: Key = (peer, msg.session_id, msg.msg_id)
        self.reliable = reliable
        self.is_request = is_request
        self.give_up_at = give_up_at
        self.rto = rto
        self.future = future
        self.timer: asyncio.TimerHandle | None = None
        self.acked = False
        self.via = via
        #: May ride in 0-RTT early data (see Connection.send).
        self.early = early


class Permits:
    """The ``max_in_flight`` permits toward one peer: a FIFO semaphore (``asyncio.Semaphore``'s
    ``acquire``, ``release`` and ``locked``) whose free permit is taken by one call,
    :meth:`try_take`, as a request at 1 in flight does every time."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    def locked(self) -> bool:
        """No permit can be taken without waiting."""
        return self._free <= 0 or bool(self._waiters)

    def try_take(self) -> bool:
        """Take a free permit if one is there and nobody waits for one; else False."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def acquire(self) -> bool:
        """Take a permit, waiting in turn (first come, first served) while none is free."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a permit as it was cancelled: pass it on
                self.release()
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
                self._wake()
            raise
        return True

    def release(self) -> None:
        """Give a permit back: to the first waiter, if any."""
        self._free += 1
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters and self._free > 0:
            fut = waiters.popleft()
            if not fut.done():
                self._free -= 1
                fut.set_result(None)


class Deadlines:
    """The request timeouts of one pending table, on one wake-up of the transport's timer
    structure (a :class:`~iac.transport.timers.Timer` of the loop's
    :func:`~iac.transport.timers.loop_timers`, which every connection's timers share).

    A request's deadline is an entry ``(when, number)`` in a heap and its future by number; the
    wake-up is set for the earliest entry only, so a request costs a heap push and a dict entry,
    not a timer of its own. (The loop's timer wheel holds one deadline per owner: the table
    keeps its own heap of the requests under that one deadline, as a connection keeps its
    several deadlines under its one wake-up.) An answered request's entry stays in the heap until
    it reaches the top or the stale entries outnumber the live ones (then the heap is rebuilt):
    it holds two numbers, never the future. On expiry the future fails with ``TimeoutError``."""

    __slots__ = ("__weakref__", "_armed", "_heap", "_live", "_loop", "_seq", "_stale", "_timer")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, asyncio.Future[Any]] = {}
        self._seq = 0
        self._stale = 0  # heap entries whose request ended
        self._timer: Timer | None = None
        self._armed = math.inf  # when the wake-up is set for
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """Requests with a deadline."""
        return len(self._live)

    @property
    def heap_size(self) -> int:
        """Heap entries, stale ones included (at most about twice the live ones, plus 64)."""
        return len(self._heap)

    def add(self, loop: asyncio.AbstractEventLoop, when: float, future: asyncio.Future[Any]) -> int:
        """Fail ``future`` with ``TimeoutError`` once ``loop.time()`` reaches ``when``, unless it is
        :meth:`remove`-d first; the number that removes it."""
        seq = self._seq = self._seq + 1
        self._live[seq] = future
        heapq.heappush(self._heap, (when, seq))
        if when < self._armed or loop is not self._loop:
            self._arm(loop, self._heap[0][0])
        return seq

    def remove(self, seq: int) -> None:
        """The request of ``seq`` ended: its deadline no longer matters."""
        if self._live.pop(seq, None) is not None:
            self._stale += 1
            if self._stale > 64 and self._stale > len(self._live):
                live = self._live
                self._heap = [e for e in self._heap if e[1] in live]
                heapq.heapify(self._heap)
                self._stale = 0

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        timer = self._timer
        if loop is not self._loop or timer is None:  # the first wake-up, or a node on a new loop
            if timer is not None:
                timer.cancel()
            # The wake-up holds the table weakly: a closed node's table goes with the node.
            timer = self._timer = loop_timers(loop).timer(partial(_fire, weakref.ref(self)))
            self._loop = loop
        self._armed = when
        timer.at(when)

    def fire(self) -> None:
        """The wake-up came: fail the requests whose deadline passed; set it for the next."""
        armed, self._armed = self._armed, math.inf
        loop = self._loop
        if loop is None:  # pragma: no cover - armed only with a loop
            return
        now = max(loop.time(), armed)  # (the loop may run a wake-up up to its resolution early)
        heap, live = self._heap, self._live
        while heap:
            when, seq = heap[0]
            future = live.get(seq)
            if future is None:  # its request ended
                heapq.heappop(heap)
                self._stale -= 1
                continue
            if when > now:
                self._arm(loop, when)
                return
            heapq.heappop(heap)
            del live[seq]
            # (a request left waiting on a loop that was closed meanwhile is only dropped)
            if not future.done() and future.get_loop() is loop:
                future.set_exception(TimeoutError())


def _fire(ref: weakref.ReferenceType[Deadlines]) -> None:
    deadlines = ref()
    if deadlines is not None:
        deadlines.fire()


class Pending:
    """Outgoing requests and ACK_REQUESTED messages, by ``(peer, session_id, msg_id)``."""

    def __init__(self, parts: Parts, outbox: Outbox, peers: Peers) -> None:
        self.config = parts.config
        self._outbox = outbox
        self._peers = peers
        self._c = parts.counters
        self._tasks = parts.tasks
        self._observers = parts.observers
        self.outs: dict[Key, Out] = {}
        #: Per peer: smoothed request round trip (seconds), learned from its replies.
        self.rtt: dict[str, float] = {}
        self._by_peer: dict[str, dict[Key, Out]] = {}
        self._in_flight: dict[str, Permits] = {}
        #: The requests' timeouts (one wake-up for all of them).
        self._deadlines = Deadlines()

    # --- the calls ------------------------------------------------------------------------------

    async def send_reliable(
        self,
        peer: str,
        msg_type: int,
        payload: Any,
        *,
        ordered: bool,
        via: str | None,
        early: bool = True,
        **build: Any,
    ) -> Sent:
        """An ACK_REQUESTED one-way message: waits while ``max_in_flight`` are unacknowledged."""
        sem = self._sem(peer)
        await sem.acquire()
        try:
            flags = FLAG_ACK_REQUESTED | (FLAG_ORDERED if ordered else 0)
            kind = "ordered_ack" if ordered else "main"
            msg = self._outbox.build(peer, msg_type, payload, kind=kind, flags=flags, **build)
            out = self._track(peer, msg, reliable=True, is_request=False, via=via, early=early)
        except BaseException:
            sem.release()
            raise
        out.future.add_done_callback(lambda _f: sem.release())
        await self._first_send(out)
        return Sent(peer, msg.session_id, msg.msg_id, out.future)

    async def request(
        self,
        peer: str,
        msg_type: int,
        payload: Any,
        *,
        timeout: float,
        ack: bool,
        task: TaskState | None,
        via: str | None,
        early: bool = True,
        payload_json: str | None = None,
        extra_data: bytes = b"",
        sealed: bool = False,
        principal: str = "",
    ) -> Reply:
        """Send a request and wait for its answer (see :meth:`~iac.Node.request`); observers
        and the peer's round-trip estimate learn how it ended."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        outcome = "transport"
        try:
            if not 0 < timeout < math.inf:
                raise ConfigError(f"timeout must be a positive, finite number of seconds, not {timeout!r}")
            sem = self._in_flight.get(peer) or self._sem(peer)
            left, now = timeout, start
            if not sem.try_take():  # a free permit: taken without waiting (no task, no timer)
                try:
                    await asyncio.wait_for(sem.acquire(), timeout)
                except TimeoutError:
                    raise RequestTimeout(
                        f"{peer[:16]}…: {self.config.max_in_flight} requests in flight"
                    ) from None
                now = loop.time()
                left = max(0.001, timeout - (now - start))
            out: Out | None = None
            timer = 0
            try:
                now_us = self._outbox.clock.now_us()  # the message's one clock read: built and sent
                msg = self._outbox.build(
                    peer,
                    msg_type,
                    payload,
                    payload_json=payload_json,
                    extra_data=extra_data,
                    flags=FLAG_ACK_REQUESTED if ack else 0,
                    task=task,
                    deadline_us=now_us + int(left * 1e6),
                    sealed=sealed,
                    principal=principal,
                    now_us=now_us,
                )
                out = self._track(
                    peer, msg, reliable=ack, is_request=True, via=via, early=early, now=now, loop=loop
                )
                if ack:
                    await self._first_send(out, now_us)
                else:  # (a transport error ends it: the `finally` below forgets the out)
                    await self._outbox.transmit(peer, msg, via, early=early, now_us=now_us)
                # The table's one timer for every request (not a loop timer each): on expiry it
                # fails the future with TimeoutError. A cancelled caller cancels the future
                # itself; the out stays tracked until `finally`, which is how the handler below
                # tells "not answered yet" (send CANCEL) from answered.
                if not out.future.done():  # (``now + left``: ``timeout`` after the call began)
                    timer = self._deadlines.add(loop, now + left, out.future)
                reply: Reply = await out.future
            except TimeoutError:
                if out is not None:
                    self._tasks.spawn(self._send_cancel(out))
                raise RequestTimeout(f"no answer from {peer[:16]}… within {timeout:g} s") from None
            except asyncio.CancelledError:
                if out is not None and self.outs.get(out.key) is out:
                    self._tasks.spawn(self._send_cancel(out))
                raise
            finally:
                if timer:
                    self._deadlines.remove(timer)
                if out is not None and self.outs.get(out.key) is out:  # (an answer finished it)
                    self.finish(out, exc=asyncio.CancelledError())
                sem.release()
            outcome = "reply"
            rtt = loop.time() - start
            old = self.rtt.get(peer)
            self.rtt[peer] = rtt if old is None else old + (rtt - old) / 8  # EWMA, as TCP's SRTT
            return reply
        except RemoteError as exc:
            outcome = exc.code
            raise
        except RequestTimeout:
            outcome = "timeout"
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if self._observers.items:
                self._observers.answered(peer, msg_type, loop.time() - start, outcome)

    # --- answers ----------------------------------------------------------------------------------

    def on_reply(self, key: Key, reply: Reply) -> bool:
        """A REPLY for ``key``; False when it answers nothing this node asked."""
        out = self.outs.get(key)
        if out is None or not out.is_request:
            return False
        self.finish(out, reply)
        return True

    def on_ack(self, key: Key) -> None:
        out = self.outs.get(key)
        if out is None:
            return
        if out.is_request:
            out.acked = True  # keep waiting for the REPLY, stop retransmitting
            if out.timer is not None:
                out.timer.cancel()
                out.timer = None
        else:
            self.finish(out, None)

    def on_error(self, key: Key, error: RemoteError) -> bool:
        out = self.outs.get(key)
        if out is None:
            return False
        self.finish(out, exc=error)
        return True

    def resend(self, peer: str) -> None:
        """A (re)connection to ``peer``: resend what is unacknowledged at once."""
        for out in list(self._by_peer.get(peer, {}).values()):
            if out.reliable and not out.acked and out.timer is not None:
                out.timer.cancel()
                out.timer = None
                self._tasks.spawn(self._retransmit(out))

    def waiting_for_acks(self) -> bool:
        return any(o.reliable and not o.future.done() for o in self.outs.values())

    def fail_all(self, exc: BaseException) -> None:
        for out in list(self.outs.values()):
            self.finish(out, exc=exc)

    def in_flight(self, peer: str) -> int:
        """Requests and unacknowledged messages toward ``peer`` now."""
        return len(self._by_peer.get(peer, ()))

    def waited_on(self) -> Iterable[str]:
        """The peers with requests or unacknowledged messages toward them now (each once)."""
        return self._by_peer.keys()

    @property
    def tracked_peers(self) -> int:
        return len(self._in_flight)

    def waits_for(self, peer: str) -> bool:
        """Something toward ``peer`` is unanswered or waits for an in-flight permit."""
        sem = self._in_flight.get(peer)
        return peer in self._by_peer or (sem is not None and sem.locked())

    def expire(self, connected: set[str]) -> None:
        """Forget the in-flight permits of peers with nothing outstanding, and the round-trip
        estimates of peers that are not connected."""
        for peer in [p for p, sem in self._in_flight.items() if p not in self._by_peer and not sem.locked()]:
            del self._in_flight[peer]
        for peer in [p for p in self.rtt if p not in connected and p not in self._in_flight]:
            del self.rtt[peer]

    def counts(self) -> tuple[int, int]:
        """(pending requests, unacknowledged messages)."""
        outs = self.outs.values()
        return sum(1 for o in outs if o.is_request), sum(1 for o in outs if o.reliable and not o.acked)

    # --- tracking and retransmission --------------------------------------------------------------

    def _sem(self, peer: str) -> Permits:
        sem = self._in_flight.get(peer)
        if sem is None:
            sem = self._in_flight[peer] = Permits(self.config.max_in_flight)
        return sem

    def _track(
        self,
        peer: str,
        msg: Message,
        *,
        reliable: bool,
        is_request: bool,
        via: str | None,
        early: bool,
        now: float | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Out:
        """Track ``msg`` until its answer (``now``: the loop's time, if the caller just read it;
        ``loop``: the running loop, if the caller has it)."""
        if loop is None:
            loop = asyncio.get_running_loop()
        give_up_at = (loop.time() if now is None else now) + self.config.delivery_timeout
        out = Out(peer, msg, reliable, is_request, give_up_at, self.config.retransmit_initial,
                  loop.create_future(), via, early)  # fmt: skip
        self.outs[out.key] = out
        self._by_peer.setdefault(peer, {})[out.key] = out
        return out

    def finish(self, out: Out, result: Any = None, exc: BaseException | None = None) -> None:
        if out.timer is not None:
            out.timer.cancel()
            out.timer = None
        self.outs.pop(out.key, None)
        by_peer = self._by_peer.get(out.peer)
        if by_peer is not None:
            by_peer.pop(out.key, None)
            if not by_peer:
                del self._by_peer[out.peer]
        if not out.future.done():
            if isinstance(exc, asyncio.CancelledError):
                out.future.cancel()
            elif exc is not None:
                out.future.set_exception(exc)
                out.future.exception()  # mark retrieved: nobody may be waiting
            else:
                out.future.set_result(result)

    async def _first_send(self, out: Out, now_us: int = 0) -> None:
        """Send ``out`` for the first time (``now_us``: when it was built, if just now)."""
        try:
            await self._outbox.transmit(out.peer, out.msg, out.via, early=out.early, now_us=now_us)
        except TransportError as exc:
            if not out.reliable:
                self.finish(out, exc=exc)
                raise
            log.debug("send to %s… failed (%s); will retransmit", out.peer[:16], exc)
        if out.reliable and out.key in self.outs:
            self._arm(out)

    def _arm(self, out: Out) -> None:
        if out.timer is not None:
            out.timer.cancel()
        out.timer = asyncio.get_running_loop().call_later(out.rto, self._on_rto, out)

    def _on_rto(self, out: Out) -> None:
        out.timer = None
        if out.key not in self.outs or out.acked:
            return
        if asyncio.get_running_loop().time() >= out.give_up_at:
            self._c.delivery_failures += 1
            self.finish(
                out,
                exc=DeliveryError(
                    f"message {out.msg.msg_id} to {out.peer[:16]}… not acknowledged within "
                    f"{self.config.delivery_timeout:g} s"
                ),
            )
            return
        out.rto = min(out.rto * 2, self.config.retransmit_max)
        self._tasks.spawn(self._retransmit(out))

    async def _retransmit(self, out: Out) -> None:
        if out.key not in self.outs or out.acked:
            return
        self._c.retransmits += 1
        try:
            await self._outbox.transmit(out.peer, out.msg, out.via, early=out.early)
        except TransportError as exc:
            log.debug("retransmit to %s… failed: %s", out.peer[:16], exc)
        if out.key in self.outs and not out.acked:
            self._arm(out)

    async def _send_cancel(self, out: Out) -> None:
        await self._outbox.send_control(out.peer, _CANCEL, out.msg, out.via)

    def spawn(self, coro: Any) -> None:
        self._tasks.spawn(coro)

    def permit(self, peer: str) -> Permits:
        """The in-flight permits toward ``peer`` (a stream takes one, as a request does)."""
        return self._sem(peer)


__all__ = ["Deadlines", "Out", "Pending", "Permits"]
