"""The receiving side of a node: a read loop per connection, the per-peer verify budget, FORWARD
frames through the Router, and acting on the receive pipeline's decisions."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

from google.protobuf.message import DecodeError

from iac.errors import (
    ERROR_CODES,
    CloseCode,
    ErrorCode,
    IacError,
    MessageRejected,
    ProtocolError,
    Refusal,
    RemoteError,
)
from iac.node.answers import Answers
from iac.node.dispatch import Dispatcher
from iac.node.fair import LoopShare
from iac.node.files import Files
from iac.node.ordered import OrderedDelivery
from iac.node.outbox import Outbox
from iac.node.parts import Parts
from iac.node.peers import Peers
from iac.node.pending import Pending
from iac.node.pipeline import Decision, Duplicate, ReceivePipeline, Refuse, Response, Route
from iac.node.streams import Streams
from iac.node.types import Item, Reply, error_fields
from iac.node.verify import Opened, Verifier
from iac.protocol.clock import Clock
from iac.protocol.guards import RESPONSE_TYPES, TokenBucket
from iac.protocol.replay import Verdict
from iac.protocol.routing import RouteRefusal, parse_forward
from iac.transport.base import Connection, Incoming
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType

log = logging.getLogger("iac.node")

_ERROR = int(MessageType.ERROR)
_ACK = int(MessageType.ACK)
_CANCEL = int(MessageType.CANCEL)
_CREDIT = int(MessageType.CREDIT)
_FILE_TRANSFER = int(MessageType.FILE_TRANSFER)
_MESSAGE_FRAME = FrameType.MESSAGE
_FORWARD_FRAME = FrameType.FORWARD

ErrorCallback = Callable[[str, Message, str, str], Any]

#: Frames a read loop takes from its connection at a time (opened together, then acted on in order).
BATCH = 32


class Inbound:
    """Reads every connection of a node and acts on what arrives."""

    def __init__(
        self,
        parts: Parts,
        *,
        pipeline: ReceivePipeline,
        verifier: Verifier,
        peers: Peers,
        outbox: Outbox,
        answers: Answers,
        pending: Pending,
        streams: Streams,
        dispatcher: Dispatcher,
        ordered: OrderedDelivery,
        files: Files,
    ) -> None:
        self.config = config = parts.config
        self._pipeline = pipeline
        self._store = parts.store
        self._router = parts.router
        self._peers = peers
        self._outbox = outbox
        self._answers = answers
        self._pending = pending
        self._dispatcher = dispatcher
        self._ordered = ordered
        self._files = files
        self._verifier = verifier
        self._observers = parts.observers
        self._streams = streams
        self._c = parts.counters
        self._tasks = parts.tasks
        self._clock: Clock = parts.rx_clock
        self._buckets: dict[str, TokenBucket] = {}
        #: The busiest peer held to a share of the loop while it is saturated (``fair_share``).
        self.share = LoopShare(ceiling=config.verify_rate)
        self._frames: Counter[str] = Counter()  # frames per peer since the last report
        self._held: set[str] = set()  # peers whose bucket runs at a rate the share set
        self._relay_dials: set[str] = set()
        self.error_callbacks: list[ErrorCallback] = []

    async def read_loop(self, conn: Connection) -> None:
        """Read ``conn`` until it closes: frames in batches (what is already received, up to
        ``BATCH``), opened together, acted on in order; the answers they got are written at once
        (:meth:`Connection.serve`: a batch runs right in the transport's receive callback when
        it can finish there, and yields to the other connections while more frames wait)."""
        try:
            await conn.serve(functools.partial(self._on_batch, conn), BATCH)
        except IacError as exc:
            if not conn.closed:  # this side failed (a worker): close it, never leave it unread
                self._close_failed(conn, exc)
        finally:
            self._peers.unregister(conn)

    def _close_failed(self, conn: Connection, exc: IacError) -> None:
        """Close a connection whose reading failed on this side (not the peer's fault), with
        INTERNAL_ERROR, so that the peer reconnects instead of waiting on a connection nobody
        reads; the node goes on serving every other one."""
        name = exc.reason
        peer = conn.peer.agent_id
        log.warning("closing the connection from %s…: %s: %s", peer[:16], name, exc,
                    extra={"peer": peer[:16], "transport": conn.peer.transport, "reason": name,
                           "code": CloseCode.INTERNAL_ERROR.name})  # fmt: skip
        self._c.closed_internal += 1
        self._tasks.spawn(conn.close(CloseCode.INTERNAL_ERROR, f"{name}: {exc}"[:200]))

    async def share_loop(self) -> None:
        """Every ``share.period``: the loop's lag and each peer's frames to :attr:`share`, and the
        rates it sets to the peers' verify budgets."""
        share, loop = self.share, asyncio.get_running_loop()
        period = share.period
        while True:
            start = loop.time()
            await asyncio.sleep(period)
            now = loop.time()
            frames = dict(self._frames)
            share.report(now - start - period, frames, now - start)
            self._frames.clear()
            # Two peers sending, or one held: look again soon; else a quarter of a second.
            period = share.period if len(frames) > 1 or share.rates else 0.25
            for peer in self._held - share.rates.keys():  # lifted
                bucket = self._buckets.get(peer)
                if bucket is not None:
                    bucket.rate, bucket.burst = self.config.verify_rate, self.config.verify_burst
                self._held.discard(peer)
            for peer, rate in share.rates.items():
                bucket = self._buckets.get(peer)
                if bucket is not None:
                    bucket.rate, bucket.burst = rate, max(float(BATCH), rate * share.period)
                    self._held.add(peer)

    def expire(self, connected: set[str]) -> None:
        """Forget the verify budgets of peers that are not connected and have a full bucket."""
        now = self._clock.now_us() * 1e-6
        for peer in [p for p, b in self._buckets.items() if p not in connected and b.full(now)]:
            del self._buckets[peer]

    @property
    def budgets(self) -> int:
        return len(self._buckets)

    def _bucket(self, peer: str, now_us: int) -> TokenBucket:
        """``peer``'s verify budget (its bucket runs on the receive clock's seconds)."""
        bucket = self._buckets.get(peer)
        if bucket is None:
            bucket = self._buckets[peer] = TokenBucket(
                self.config.verify_rate, self.config.verify_burst, now_us * 1e-6
            )
        return bucket

    async def _throttle(self, peer: str, cost: float, now_us: int) -> bool:
        """Take ``cost`` from ``peer``'s verify budget; True when it had to wait for it."""
        wait = self._bucket(peer, now_us).take(cost, now_us * 1e-6)
        if wait <= 0:
            return False
        self._c.throttled += 1
        await asyncio.sleep(wait)
        return True

    async def _on_batch(self, conn: Connection, incs: list[Incoming]) -> bool:
        """Act on a batch of frames in order, the clock read once for it (again only after the
        verify budget made it wait); False when the connection was closed for a fault."""
        peer = conn.peer.agent_id
        n = len(incs)
        self._frames[peer] += n
        c = self._c
        now = self._clock.now_us()
        bucket = self._buckets.get(peer) or self._bucket(peer, now)
        wait = bucket.take(n, now * 1e-6)  # the frames' share of the verify budget
        if wait > 0:
            c.throttled += 1
            await asyncio.sleep(wait)
            now = self._clock.now_us()
        c.received += n
        size = 0
        bodies: list[bytes] = []
        for inc in incs:
            frame = inc.frame
            size += frame.wire_size or len(frame.body)
            if frame.type == _MESSAGE_FRAME:
                bodies.append(frame.body)
        c.bytes_received += size
        opened: list[Opened] = []
        decisions: list[Decision] = []
        if bodies:
            verifier = self._verifier
            on_loop = verifier.open_now(bodies, peer)  # opened right here (no await), or None
            opened = on_loop if on_loop is not None else await verifier.offload(bodies, peer)
            # Every one verified (the common case): the list itself, no copy and no cast() call.
            msgs: list[Message] = opened  # type: ignore[assignment]
            for m in opened:
                if type(m) is not Message:
                    msgs = [m for m in opened if not isinstance(m, IacError)]
                    break
            if msgs:  # one pipeline call for the batch's verified messages (their replay checks together)
                decisions = await self._pipeline.receive(conn, msgs, now)
        at = decided = 0  # the next of opened, of decisions
        for inc in incs:
            frame = inc.frame
            if frame.type == _FORWARD_FRAME:
                await self._on_forward(conn, frame.body)
                continue
            if frame.type != _MESSAGE_FRAME:
                continue
            result = opened[at]
            at += 1
            if type(result) is Message or isinstance(result, Message):
                decision = decisions[decided]
                decided += 1
                if type(decision) is Response:  # an answer to this node: matched right here
                    self._on_response(decision)
                else:
                    await self._act(conn, result, now, decision)
            elif isinstance(result, MessageRejected):  # 1. signature: refused, the connection goes on
                await self._on_bad_signature(conn, frame.body)
            elif isinstance(result, ProtocolError):  # malformed, or an impersonation: close it
                log.info("closing the connection from %s…: %s: %s", peer[:16], result.name, result,
                         extra={"peer": peer[:16], "transport": conn.peer.transport, "reason": result.name,
                                "code": CloseCode(result.close_code).name})  # fmt: skip
                await conn.close(result.close_code, str(result)[:200])
                # Raised, not returned: returning False here let the receiver's memory reach
                # 48 MiB in the many-connection amplification test (bound: 18 MiB), raising
                # keeps it under (tests/test_exhaustion.py).
                raise result
            else:  # pragma: no cover - open() raises only the two above
                return False
        return True

    async def on_message(self, conn: Connection, msg: Message, *, forwarded: bool = False) -> None:
        """One verified message (a FORWARD's inner message: its origin's signature was checked)."""
        now = self._clock.now_us()
        (decision,) = await self._pipeline.receive(conn, (msg,), now, forwarded=forwarded)
        await self._act(conn, msg, now, decision)

    async def _act(self, conn: Connection, msg: Message, now: int, decision: Decision) -> None:
        """Act on the pipeline's decision: it names the route."""
        # (the four decisions have no subclasses: type() is no call, isinstance() is)
        if type(decision) is Item:  # delivered: the decision is the item itself
            item = decision
            route = item.route
            try:
                if route is Route.HANDLER:
                    await self._dispatcher.dispatch(item)
                elif route is Route.ORDERED:
                    self._ordered.push(item, now)
                elif route is Route.FILE:
                    await self._files.on_message(item)
                elif route is Route.CANCEL:
                    self._store.commit_item(item, now)
                    self._dispatcher.cancel(item.key[0], item.msg)
                else:  # Route.CREDIT
                    self._store.commit_item(item, now)
                    self._dispatcher.credit(item.key[0], item.msg)
            except BaseException:
                self._store.release_item(item, self._clock.now_us())
                raise
        elif type(decision) is Response:
            self._on_response(decision)
        elif type(decision) is Refuse:
            if decision.consumed is not None:
                self._store.commit(decision.consumed, now)
                self._ordered.skip(msg, now)
            await self._answers.refuse(conn, msg, decision.reason, decision.detail, answer=decision.answer)
        else:
            await self._on_duplicate(conn, msg, cast(Duplicate, decision))

    async def _on_duplicate(self, conn: Connection, msg: Message, dup: Duplicate) -> None:
        if dup.verdict is Verdict.TOO_OLD:
            self._c.refused[Refusal.REPLAYED.value] += 1
            return
        self._c.refused[Refusal.DUPLICATE.value] += 1
        if dup.verdict is Verdict.IN_PROGRESS or not dup.answer:
            return  # the first copy's answer is on its way
        await self._answers.again(conn, msg)

    def _on_response(self, r: Response) -> None:
        """A REPLY, ERROR or ACK for this node: to what waits for it (a stream, a request, a file)."""
        if r.store_failed:
            self._c.refused[Refusal.STORE_UNAVAILABLE.value] += 1  # delivered all the same
        mt = r.msg_type
        if mt == _ERROR:
            code, text = error_fields(r.payload)
            # Counted by code from the closed list: a peer cannot grow the table with codes of its own.
            self._c.errors_received[code if code in ERROR_CODES else "other"] += 1
            err = RemoteError(code, text)
            if (
                self._streams.on_error(r.key, r.msg, err)
                or self._pending.on_error(r.key, err)
                or self._files.on_error(r.key, err)
            ):
                return
            for cb in self.error_callbacks:
                with contextlib.suppress(Exception):
                    cb(r.key[0], r.msg, code, text)
            return
        if mt == _ACK:
            self._c.acks_received += 1
            self._pending.on_ack(r.key)
            return
        reply = Reply(r.msg, r.payload)
        if not self._streams.on_reply(r.key, r.msg, reply) and not self._pending.on_reply(r.key, reply):
            self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1

    async def _on_bad_signature(self, conn: Connection, body: bytes) -> None:
        self._c.refused[Refusal.BAD_SIGNATURE.value] += 1
        await self._throttle(conn.peer.agent_id, self.config.bad_signature_cost, self._clock.now_us())
        try:
            claimed = Message.FromString(body)
        except DecodeError:
            return
        if claimed.msg_type in RESPONSE_TYPES:
            return
        # The connection's HELLO proved who sent the frame: answer that peer.
        await self._answers.send_error(
            conn, conn.peer.agent_id, claimed, ErrorCode.BAD_SIGNATURE, "signature does not verify"
        )

    # --- relays and broadcast -------------------------------------------------------------------

    async def _on_forward(self, conn: Connection, body: bytes, *, retry: bool = True) -> None:
        """A FORWARD frame: the Router checks it (origin's signature, hop limit, loop, path, seen-cache,
        policy); this node sends on what it says and runs a delivered message through the pipeline."""
        from_peer = conn.peer.agent_id
        conns = self._peers.by_id()
        dec = self._router.on_forward(body, from_peer, conns, self._clock.now_us())
        if dec.refusal is RouteRefusal.BAD_SIGNATURE:
            await self._throttle(from_peer, self.config.bad_signature_cost, self._clock.now_us())
        elif dec.refusal is RouteRefusal.NO_ROUTE and retry:
            self._relay_after_dial(conn, body)
        if dec.refusal is not None and dec.refusal is not RouteRefusal.DUPLICATE:
            log.debug("FORWARD from %s… refused: %s (%s)", from_peer[:16], dec.refusal.value, dec.error)
        if dec.sends:
            self._c.relayed += len(dec.sends)
            if self._observers.items and dec.message_bytes:
                inner = dec.message or Message.FromString(dec.message_bytes)
                self._observers.relayed(dec.origin, inner, from_peer, [s.peer for s in dec.sends])
            await self._outbox.send_all(conns, dec.sends)
        msg = dec.message
        if msg is None:
            return
        if not msg.to and self._observers.items:
            self._observers.flooded(dec.origin, from_peer, [s.peer for s in dec.sends])
        if msg.to and dec.origin == from_peer and len(dec.path) == 1:
            # Nothing was relayed: the neighbour's own message to this node belongs in a MESSAGE frame.
            self._c.refused[Refusal.FORWARD_NOT_RELAYED.value] += 1
            return
        await self.on_message(conn, msg, forwarded=True)

    def _relay_after_dial(self, conn: Connection, body: bytes) -> None:
        """A unicast to relay toward a peer this node knows but is not connected to: dial it, then
        decide again (the Router refused it before entering it in the seen-cache)."""
        if not self.config.relay_policy.relay_unicast:
            return
        try:
            inner = Message.FromString(parse_forward(body).message)
        except (IacError, DecodeError):
            return
        to = inner.to
        if not to or to not in self._peers.book or to in self._relay_dials or len(self._relay_dials) >= 64:
            return
        self._relay_dials.add(to)

        async def dial_then_relay() -> None:
            try:
                await self._peers.connect(to)
            except IacError as exc:
                log.debug("relay: could not dial %s…: %s", to[:16], exc)
                return
            finally:
                self._relay_dials.discard(to)
            self._router.stats.refused[RouteRefusal.NO_ROUTE] -= 1  # counted again if it fails again
            await self._on_forward(conn, body, retry=False)

        self._tasks.spawn(dial_then_relay())


__all__ = ["ErrorCallback", "Inbound"]
