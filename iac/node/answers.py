"""The reply path: REPLY, ERROR and ACK for what this node received, and the cache of answers that
re-answers a retransmitted request instead of handling it twice."""

from __future__ import annotations

import logging
from collections import OrderedDict

from iac.errors import ErrorCode, IacError, ProtocolError, Refusal
from iac.node.config import NodeConfig
from iac.node.outbox import Outbox
from iac.node.stats import Counters
from iac.node.types import Item, Key, error_payload
from iac.protocol.guards import RESPONSE_TYPES
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType, type_name
from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_END, FLAG_STREAM, sender_of

log = logging.getLogger("iac.node")

_REPLY = int(MessageType.REPLY)
_ERROR = int(MessageType.ERROR)
_ACK = int(MessageType.ACK)


class Answers:
    """Sends this node's answers; keeps the last ``answer_cache`` of them by request key."""

    def __init__(self, config: NodeConfig, outbox: Outbox, counters: Counters) -> None:
        self.config = config
        self._outbox = outbox
        self._c = counters
        self.cache: OrderedDict[Key, Message] = OrderedDict()

    async def refuse(
        self, conn: Connection, msg: Message, reason: Refusal, detail: str, *, answer: bool = True
    ) -> None:
        """Count a refusal; answer ERROR with its code unless ``msg`` is a response or ``answer``
        is False (broadcasts, and refusals that have no code). The ERROR is cached like a handler's
        answer: a retransmission of the refused message gets the same ERROR, never an ACK."""
        self._c.refused[reason.value] += 1
        sender = sender_of(msg)
        log.info("refused %s from %s…: %s", reason.value, sender[:16], detail,
                 extra={"peer": sender[:16], "transport": conn.peer.transport, "reason": reason.value,
                        "msg_type": type_name(msg.msg_type), "msg_id": msg.msg_id})  # fmt: skip
        code = reason.code
        if answer and code is not None and msg.msg_type not in RESPONSE_TYPES:
            await self.send_error(conn, sender_of(msg), msg, code, detail, cache=True)

    async def send_error(
        self, conn: Connection, to: str, req: Message, code: str, detail: str, *, cache: bool = False
    ) -> None:
        code = code.value if isinstance(code, ErrorCode) else code
        err = self._outbox.build(
            to,
            _ERROR,
            None,
            payload_json=error_payload(code, detail),
            reply_to=req.msg_id,
            reply_session_id=req.session_id,
        )
        if cache and (req.deadline or req.flags & FLAG_ACK_REQUESTED):
            self._remember((to, req.session_id, req.msg_id), err)
        if await self._outbox.try_send_to(to, err, conn):
            self._c.errors_sent[code] += 1
        else:
            log.debug("could not send ERROR %s to %s…", code, to[:16])

    async def error(self, item: Item, code: str, text: str) -> None:
        """A handler's outcome as ERROR, to a caller that waits for it (a deadline or ACK_REQUESTED)."""
        if not item.wants:
            return  # nobody waits for an answer to a one-way message without ACK, or to a broadcast
        code = code.value if isinstance(code, ErrorCode) else code
        self._c.errors_sent[code] += 1
        await self.answer(item, _ERROR, error_payload(code, text))

    async def part(self, item: Item, payload_json: str, *, end: bool = False) -> None:
        """A REPLY part of a stream (``end``: the last, empty one). Never cached: a stream is not
        re-answered."""
        msg = item.msg
        sender = item.key[0]
        ans = self._outbox.build(sender, _REPLY, None, payload_json=payload_json, reply_to=msg.msg_id,
                                 reply_session_id=msg.session_id, sealed=item.sealed,
                                 flags=FLAG_STREAM | (FLAG_END if end else 0))  # fmt: skip
        item.parts += 1
        ans.stream_seq = item.parts
        await self._outbox.try_send_to(sender, ans, item.conn)
        if not end:
            self._c.replies_sent += 1

    async def answer(self, item: Item, msg_type: int, payload_json: str) -> None:
        if item.broadcast:
            return
        msg = item.msg
        sender = item.key[0]
        if msg.flags & FLAG_STREAM:  # an ERROR that ends a stream: in its order, after the parts
            err = self._outbox.build(sender, msg_type, None, payload_json=payload_json, reply_to=msg.msg_id,
                                     reply_session_id=msg.session_id, flags=FLAG_STREAM)  # fmt: skip
            err.stream_seq = item.parts + 1
            await self._outbox.try_send_to(sender, err, item.conn)
            return
        now_us = self._outbox.clock.now_us()  # the answer's one clock read: built and sent
        ans = self._outbox.build(
            sender,
            msg_type,
            None,
            payload_json=payload_json,
            reply_to=msg.msg_id,
            reply_session_id=msg.session_id,
            sealed=item.sealed,
            now_us=now_us,
        )
        self._remember(item.key, ans)
        try:
            await self._outbox.send_to(sender, ans, item.conn, now_us)
        except ProtocolError as exc:
            if exc.reason != "frame_too_large":
                raise
            # Never lost in silence: the caller gets ERROR internal at once, this side logs it.
            self.cache.pop(item.key, None)
            self._c.answers_too_large += 1
            log.warning("the answer to %s from %s… is too large to send (%s)", type_name(msg.msg_type),
                        sender[:16], exc)  # fmt: skip
            if msg_type == _REPLY:
                await self.error(item, ErrorCode.INTERNAL, f"the reply is too large to send: {exc}")
            return
        except IacError:
            return  # the connection went away: the caller retransmits or times out
        if msg_type == _REPLY:
            self._c.replies_sent += 1

    def _remember(self, key: Key, answer: Message) -> None:
        self.cache[key] = answer
        while len(self.cache) > self.config.answer_cache:
            self.cache.popitem(last=False)

    async def ack(self, conn: Connection, msg: Message) -> None:
        if not msg.to:
            return  # broadcasts are never answered
        sender = sender_of(msg)
        ack = self._outbox.build(sender, _ACK, None, reply_to=msg.msg_id, reply_session_id=msg.session_id)
        if await self._outbox.try_send_to(sender, ack, conn):
            self._c.acks_sent += 1

    async def again(self, conn: Connection, msg: Message) -> None:
        """A retransmission of a message already handled: its cached answer, or its ACK."""
        key: Key = (sender_of(msg), msg.session_id, msg.msg_id)
        cached = self.cache.get(key)
        if cached is not None:
            await self._outbox.try_send_to(key[0], cached, conn)
        elif msg.flags & FLAG_ACK_REQUESTED:
            await self.ack(conn, msg)


__all__ = ["Answers"]
