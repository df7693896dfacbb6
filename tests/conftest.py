"""Shared helpers for the transport tests: identities, an echo node, short socket dirs."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from redis_server import start_redis

from iac.errors import MessageRejected
from iac.transport.base import Connection, Incoming
from iac.wire._pb.iac_pb2 import Message, MessageType
from iac.wire.frames import FrameType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, open_message

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: Transports the conformance suite runs on.
TRANSPORT_PARAMS = ["quic", "tls", "unix"]

T = TypeVar("T")


def run(coro: Awaitable[Any], timeout: float = 30.0, *, loop_errors: bool = True) -> Any:
    """Run a coroutine on a fresh event loop with an overall timeout (a hang fails the test
    instead of blocking). With ``loop_errors`` (the default) an exception that reached the
    loop's exception handler fails the test too: an error inside a library callback (a
    transmit, a timer, a done-callback) is otherwise only logged."""
    seen: list[dict[str, Any]] = []

    async def guarded() -> Any:
        if loop_errors:
            asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        async with asyncio.timeout(timeout):
            return await coro

    result = asyncio.run(guarded())
    assert not seen, [f"{c.get('message')}: {c.get('exception')!r}" for c in seen]
    return result


async def settle(future: asyncio.Future[T], work: Awaitable[T]) -> None:
    """Await ``work`` and put its result, or the exception it raised, into ``future``.

    For code the library calls (a listener's connection handler, a node's callback): what it
    raises is only logged there, so an assert inside it would leave the test waiting for a
    result that never comes. The test body awaits ``future`` and sees the failure at once."""
    try:
        future.set_result(await work)
    except Exception as exc:
        future.set_exception(exc)


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short private directory for UNIX sockets (sun_path is limited to 108 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="iac-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def listen_url(transport: str, sockdir: Path, name: str = "node") -> str:
    if transport == "unix":
        return f"unix://{sockdir}/run/{name}.sock"
    return f"{transport}://127.0.0.1:0"


def ping_frame(sender: Identity, to: str, session: Session, payload: str = "") -> bytes:
    msg = build_message(
        sender=sender.agent_id,
        to=to,
        msg_type=MessageType.PING,
        session=session,
        timestamp_us=0,
        payload_json=payload,
    )
    return encode_message_frame(sender, msg)


def message_of(inc: Incoming) -> Message:
    """Open a received MESSAGE frame (the transport delivers it unopened; a node's receive pipeline
    would verify it the same way). Raises the typed error of a refused message."""
    assert inc.frame.type == FrameType.MESSAGE, inc.frame.type
    return open_message(inc.frame.body)


def reply_frame(sender: Identity, inc: Incoming, session: Session) -> bytes:
    req = message_of(inc)
    msg = build_message(
        sender=sender.agent_id,
        to=getattr(req, "from"),
        msg_type=MessageType.REPLY,
        session=session,
        timestamp_us=0,
        reply_to=req.msg_id,
        reply_session_id=req.session_id,
        payload_json=req.payload_json,
    )
    return encode_message_frame(sender, msg)


class EchoNode:
    """An ``on_connection`` handler that answers every MESSAGE with a REPLY."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.peers: list[str] = []
        self.connections: list[Connection] = []
        self.errors: list[BaseException] = []
        self.rejected: list[BaseException] = []

    async def __call__(self, conn: Connection) -> None:
        self.peers.append(conn.peer.agent_id)
        self.connections.append(conn)
        session = Session()
        try:
            while True:
                inc = await conn.recv()
                try:
                    message_of(inc)
                except MessageRejected as exc:
                    self.rejected.append(exc)
                    continue
                await conn.send(reply_frame(self.identity, inc, session))
        except Exception as exc:
            self.errors.append(exc)


async def roundtrip(conn: Connection, me: Identity, session: Session | None = None) -> Incoming:
    """Send one PING and wait for its REPLY."""
    session = session or Session()
    await conn.send(ping_frame(me, conn.peer.agent_id, session, "hi"))
    inc = await conn.recv()
    assert message_of(inc).msg_type == MessageType.REPLY
    return inc


OnConn = Callable[[Connection], Awaitable[None]]


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server.url
    finally:
        server.stop()
