"""A real node on a UNIX socket with a frozen wall clock, and a hand-driven peer that records.

:func:`vector_node` starts the node and connects a :class:`RawPeer` to it; every frame the
peer sends or receives can go into a :class:`Recorder` as one vector. The inputs are fixed
(:data:`VECTOR_TIME_US`, the seeds, both session ids), so the recording is deterministic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from tools.vectors.payload_schemas import dumps_payload, payload_problems

if TYPE_CHECKING:
    from iac.transport.base import Connection
    from iac.wire._pb.iac_pb2 import Message
    from iac.wire.message import Session

#: Fixed inputs: the wall clock every message and record uses, seeds, session ids.
VECTOR_TIME_US = 1_735_689_600_000_000
SEEDS = {"node": 0x44, "peer": 0x55, "successor": 0x66}
NODE_SESSION = 0x0A0A0A0A0A0A0A  # below 2**53: JSON readers keep it exact
PEER_SESSION = 0x0B0B0B0B0B0B0B
DEADLINE_US = VECTOR_TIME_US + 30_000_000


class FrozenClock:
    """Wall-clock time stands still at ``now_us`` (so timestamps and records are fixed); the
    monotonic clock runs (timeouts)."""

    def __init__(self, now_us: int) -> None:
        self._now = now_us

    def now_us(self) -> int:
        return self._now

    def monotonic(self) -> float:
        return time.monotonic()


def header_of(msg: Message) -> dict[str, Any]:
    from iac.wire._pb.iac_pb2 import MessageType

    return (
        {
            "msg_type": MessageType.Name(msg.msg_type),
            "session_id": msg.session_id,
            "msg_id": msg.msg_id,
            "flags": msg.flags,
            "expects_reply": bool(msg.deadline),
            "reply_session_id": msg.reply_session_id,
            "reply_to": msg.reply_to,
        }
        | ({"stream_seq": msg.stream_seq} if msg.stream_seq else {})
        | ({"credit": msg.credit} if msg.credit else {})
    )


class Recorder:
    def __init__(self) -> None:
        self.vectors: list[dict[str, Any]] = []
        self._names: dict[tuple[int, int], str] = {}

    def add(self, name: str, description: str, kind: str, writer: str, msg: Message) -> None:
        problems = payload_problems(kind, msg.payload_json)
        if problems and writer == "node":  # pragma: no cover - never write a wrong node vector
            raise AssertionError(f"vector {name}: {problems}")
        v: dict[str, Any] = {
            "name": name,
            "description": description,
            "kind": kind,
            "writer": writer,
            "header": header_of(msg),
            "payload": json.loads(msg.payload_json) if msg.payload_json else None,
            "payload_json": msg.payload_json,
        }
        if problems:  # a deliberately wrong request: what a receiver must refuse it for
            v["problems"] = problems
        if msg.reply_to or msg.reply_session_id:
            v["about"] = self._names[(msg.reply_session_id, msg.reply_to)]
        self._names[(msg.session_id, msg.msg_id)] = name
        self.vectors.append(v)


class RawPeer:
    """A hand-driven peer on one connection to the node: fixed session, every frame recorded."""

    def __init__(self, conn: Connection, identity: Any, node_id: str) -> None:
        from iac.wire.message import Session

        self.conn = conn
        self.identity = identity
        self.node_id = node_id
        self.session = Session(PEER_SESSION, 1)
        self._held: list[Message] = []

    async def send(self, msg_type: int, payload_json: str = "", **kw: Any) -> Message:
        from iac.wire.message import build_message, encode_message_frame

        credit = kw.pop("credit", 0)
        msg = build_message(
            sender=self.identity.agent_id,
            to=self.node_id,
            msg_type=msg_type,
            session=self.session,
            timestamp_us=VECTOR_TIME_US,
            payload_json=payload_json,
            **kw,
        )
        if credit:
            msg.credit = credit
        await self.conn.send(encode_message_frame(self.identity, msg))
        return msg

    async def request(self, msg_type: int, payload: Any = None, **kw: Any) -> tuple[Message, Message]:
        text = "" if payload is None else dumps_payload(payload)
        kw.setdefault("deadline_us", DEADLINE_US)
        req = await self.send(msg_type, text, **kw)
        ans = await self.receive(lambda m: (m.reply_session_id, m.reply_to) == (req.session_id, req.msg_id))
        return req, ans

    async def receive(self, match: Callable[[Message], bool]) -> Message:
        from iac.wire.message import open_message

        for m in self._held:
            if match(m):
                self._held.remove(m)
                return m
        while True:
            inc = await asyncio.wait_for(self.conn.recv(), 10)
            msg = open_message(inc.frame.body)  # the node sends only MESSAGE frames here
            if match(msg):
                return msg
            self._held.append(msg)


@contextlib.contextmanager
def quiet(*names: str) -> Any:
    """The handler that fails on purpose logs its traceback; keep the generator's output clean."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def pin_node_session(node: Any, peer_id: str, session: Session) -> None:
    """Fix the node's session toward ``peer_id``, so that the ids the node writes are fixed too.

    The node has no public way to choose its session ids: this writes into its private
    runtime's sessions table and must move to a proper hook once the node offers one.
    """
    node._runtime.sessions[(peer_id, "main")] = session


@contextlib.asynccontextmanager
async def vector_node() -> AsyncIterator[tuple[Any, RawPeer, dict[str, Any]]]:
    from iac.node.node import Node
    from iac.transport import dial
    from iac.transport.base import TransportConfig
    from iac.wire.identity import Identity
    from iac.wire.message import Session

    ids = {role: Identity.from_seed(bytes([b]) * 32) for role, b in SEEDS.items()}
    clock = FrozenClock(VECTOR_TIME_US)
    d = tempfile.mkdtemp(prefix="iacpv-")
    try:
        async with Node(ids["node"], listen=[f"unix://{d}/n.sock"], clock=clock) as node:
            conn = await dial(
                node.addresses[0], ids["peer"], expect=node.agent_id, config=TransportConfig(clock=clock)
            )
            try:
                pin_node_session(node, ids["peer"].agent_id, Session(NODE_SESSION, 1))
                yield node, RawPeer(conn, ids["peer"], node.agent_id), ids
            finally:
                await conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
