"""What this node waits for: requests until their REPLY or ERROR, and ACK_REQUESTED messages until
their ACK — retransmitted (same ids, fresh timestamp, signed again) with exponential backoff and
after every reconnect, up to ``delivery_timeout``."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from typing import Any

from iac.errors import ConfigError, DeliveryError, RemoteError, RequestTimeout, TransportError
from iac.node.outbox import Outbox
from iac.node.parts import Parts
from iac.node.peers import Peers
from iac.node.types import Key, Reply, Sent
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
        *,
        reliable: bool,
        is_request: bool,
        give_up_at: float,
        rto: float,
        future: asyncio.Future[Any],
        via: str | None = None,
        early: bool = True,
    ) -> None:
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


def _expire(future: asyncio.Future[Any]) -> None:
    """A request's timer fired before its answer came (becomes :class:`RequestTimeout`)."""
    if not future.done():
        future.set_exception(TimeoutError())


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
        self._in_flight: dict[str, asyncio.Semaphore] = {}

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
        **build: Any,
    ) -> Reply:
        """Send a request and wait for its answer (see :meth:`~iac.Node.request`); observers
        and the peer's round-trip estimate learn how it ended."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        outcome = "transport"
        try:
            reply = await self._request(peer, msg_type, payload, timeout=timeout, ack=ack, task=task, via=via,
                                        early=early, **build)  # fmt: skip
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

    async def _request(
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
        **build: Any,
    ) -> Reply:
        if not 0 < timeout < math.inf:
            raise ConfigError(f"timeout must be a positive, finite number of seconds, not {timeout!r}")
        sem = self._sem(peer)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if sem.locked():
            try:
                await asyncio.wait_for(sem.acquire(), timeout)
            except TimeoutError:
                raise RequestTimeout(
                    f"{peer[:16]}…: {self.config.max_in_flight} requests in flight"
                ) from None
        else:
            await sem.acquire()  # a free permit: taken without waiting (no task, no timer)
        out: Out | None = None
        timer: asyncio.TimerHandle | None = None
        try:
            left = max(0.001, timeout - (loop.time() - start))
            msg = self._outbox.build(
                peer,
                msg_type,
                payload,
                flags=FLAG_ACK_REQUESTED if ack else 0,
                task=task,
                deadline_us=self._outbox.clock.now_us() + int(left * 1e6),
                **build,
            )
            out = self._track(peer, msg, reliable=ack, is_request=True, via=via, early=early)
            await self._first_send(out)
            # One timer instead of wait_for(shield(...)): on expiry it fails the future with TimeoutError.
            # A cancelled caller cancels the future itself; the out stays tracked until `finally`,
            # which is how the handler below tells "not answered yet" (send CANCEL) from answered.
            if not out.future.done():
                timer = loop.call_later(left, _expire, out.future)
            result: Reply = await out.future
            return result
        except TimeoutError:
            if out is not None:
                self._tasks.spawn(self._send_cancel(out))
            raise RequestTimeout(f"no answer from {peer[:16]}… within {timeout:g} s") from None
        except asyncio.CancelledError:
            if out is not None and self.outs.get(out.key) is out:
                self._tasks.spawn(self._send_cancel(out))
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if out is not None:
                self.finish(out, exc=asyncio.CancelledError())
            sem.release()

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

    def _sem(self, peer: str) -> asyncio.Semaphore:
        sem = self._in_flight.get(peer)
        if sem is None:
            sem = self._in_flight[peer] = asyncio.Semaphore(self.config.max_in_flight)
        return sem

    def _track(
        self, peer: str, msg: Message, *, reliable: bool, is_request: bool, via: str | None, early: bool
    ) -> Out:
        loop = asyncio.get_running_loop()
        out = Out(
            peer,
            msg,
            reliable=reliable,
            is_request=is_request,
            give_up_at=loop.time() + self.config.delivery_timeout,
            rto=self.config.retransmit_initial,
            future=loop.create_future(),
            via=via,
            early=early,
        )
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

    async def _first_send(self, out: Out) -> None:
        try:
            await self._outbox.transmit(out.peer, out.msg, out.via, early=out.early)
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

    def permit(self, peer: str) -> asyncio.Semaphore:
        """The in-flight permits toward ``peer`` (a stream takes one, as a request does)."""
        return self._sem(peer)


__all__ = ["Out", "Pending"]
