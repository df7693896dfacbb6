"""The contenders of the transport scenarios (``rtt``, ``setup``, ``oneway``), in one process: IAC
connections without a node (:class:`IacServer`, :class:`IacClient`), the bare aioquic and TLS echoes
they are compared with, and a TCP proxy that delays each direction (:class:`TcpDelayProxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
from dataclasses import dataclass, field

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer, serve
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from iac.bench.contenders.baselines import now_us
from iac.bench.contenders.floor import CONFIG, DICT
from iac.protocol.replay import ReplayGuard, require_new
from iac.stores.memory import MemoryReplayStore
from iac.transport.base import Connection, Incoming
from iac.transport.certs import generate_self_signed
from iac.transport.tls import client_context
from iac.wire._pb.iac_pb2 import Message, MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import (
    Session,
    build_message,
    open_message,
    sender_of,
    sign_message,
)

PAYLOAD = json.dumps({"name": "summarize", "args": ["q3 report for the european market"], "k": 3})
REPLY = '{"ok": true}'
BARE_BODY = b"x" * 100
DEPTH = 64


def open_incoming(conn: Connection, item: Incoming) -> Message:
    """A received MESSAGE frame opened and checked as a node's receive pipeline does (the transport
    hands frames over unopened): the signature, and that the sender is the connection's peer."""
    msg = open_message(item.frame.body)
    if sender_of(msg) != conn.peer.agent_id:
        raise RuntimeError("a message whose sender is not the connection's peer")
    return msg


# --- IAC endpoints ------------------------------------------------------------------------------


class IacServer:
    """Answers every COMMAND with a signed REPLY; notes when each connection's first message
    arrived (for the handshake part); counts one-way messages."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        # one replay store for the node, started before any client exists
        self.guard = ReplayGuard(MemoryReplayStore(now_us()))
        self.firsts: asyncio.Queue[float] = asyncio.Queue(maxsize=1024)
        self.oneway_target = 0
        self.oneway_seen = 0
        self.oneway_done: asyncio.Future[float] | None = None

    async def on_connection(self, conn: Connection) -> None:
        identity = self.identity
        session = Session()
        guard = self.guard
        loop = asyncio.get_running_loop()
        first = True
        with contextlib.suppress(Exception):
            while True:
                req = open_incoming(conn, await conn.recv())
                require_new(
                    guard.check_and_mark(sender_of(req), req.session_id, req.msg_id, req.timestamp, now_us())
                )
                if first:
                    first = False
                    if not self.firsts.full():
                        self.firsts.put_nowait(loop.time())
                if req.msg_type == MessageType.BROADCAST:  # one-way traffic: counted, not answered
                    self._count_oneway(loop.time())
                    continue
                reply = build_message(
                    sender=identity.agent_id,
                    to=sender_of(req),
                    msg_type=MessageType.REPLY,
                    session=session,
                    timestamp_us=now_us(),
                    payload_json=REPLY,
                    reply_to=req.msg_id,
                    reply_session_id=req.session_id,
                )
                await conn.send(
                    encode_frame(FrameType.MESSAGE, sign_message(identity, reply), compress_with=DICT)
                )

    def _count_oneway(self, t: float) -> None:
        self.oneway_seen += 1
        if self.oneway_seen == self.oneway_target and self.oneway_done is not None:
            self.oneway_done.set_result(t)


class IacClient:
    """One IAC connection and its sending session and replay guard."""

    def __init__(self, conn: Connection, identity: Identity, server_id: str) -> None:
        self.conn = conn
        self.identity = identity
        self.server_id = server_id
        self.session = Session()
        self.guard = ReplayGuard(MemoryReplayStore(now_us()))

    def request(self, payload: str = PAYLOAD, msg_type: int = MessageType.COMMAND) -> tuple[int, bytes]:
        msg = build_message(
            sender=self.identity.agent_id,
            to=self.server_id,
            msg_type=msg_type,
            session=self.session,
            timestamp_us=now_us(),
            payload_json=payload,
        )
        return msg.msg_id, encode_frame(
            FrameType.MESSAGE, sign_message(self.identity, msg), compress_with=DICT
        )

    async def reply(self) -> Message:
        reply = open_incoming(self.conn, await self.conn.recv())
        require_new(
            self.guard.check_and_mark(
                sender_of(reply), reply.session_id, reply.msg_id, reply.timestamp, now_us()
            )
        )
        return reply

    async def rtt(self, count: int) -> list[float]:
        out = []
        clock = time.perf_counter
        for _ in range(count):
            t = clock()
            msg_id, frame = self.request()
            await self.conn.send(frame)
            reply = await self.reply()
            if reply.reply_to != msg_id:
                raise RuntimeError("reply to another request")
            out.append((clock() - t) * 1e6)
        return out

    async def depth(self, count: int, depth: int) -> float:
        """Requests/s with ``depth`` requests outstanding."""
        t = time.perf_counter()
        sent = 0
        for _ in range(min(depth, count)):
            await self.conn.send(self.request()[1])
            sent += 1
        for _ in range(count):
            await self.reply()
            if sent < count:
                await self.conn.send(self.request()[1])
                sent += 1
        return count / (time.perf_counter() - t)


# --- bare aioquic echo --------------------------------------------------------------------------


class EchoServer(QuicConnectionProtocol):
    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived) and event.end_stream:
            self._quic.send_stream_data(event.stream_id, event.data, end_stream=True)
            self.transmit()


class EchoClient(QuicConnectionProtocol):
    def __init__(self, quic: QuicConnection) -> None:
        super().__init__(quic)
        self.replies: asyncio.Queue[None] = asyncio.Queue()

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived) and event.end_stream:
            self.replies.put_nowait(None)

    def request(self) -> None:
        sid = self._quic.get_next_available_stream_id()
        self._quic.send_stream_data(sid, BARE_BODY, end_stream=True)
        self.transmit()


class BareQuic:
    def __init__(self, port: int) -> None:
        self.port = port
        self.proto: EchoClient | None = None
        self.transport: asyncio.BaseTransport | None = None

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        conf = QuicConfiguration(is_client=True, alpn_protocols=["echo"], verify_mode=ssl.CERT_NONE)
        quic = QuicConnection(configuration=conf)
        self.transport, self.proto = await loop.create_datagram_endpoint(
            lambda: EchoClient(quic), remote_addr=("127.0.0.1", self.port)
        )
        self.proto.connect(("127.0.0.1", self.port))
        await self.proto.wait_connected()

    async def rtt(self, count: int) -> list[float]:
        proto = self.proto
        assert proto is not None
        out = []
        clock = time.perf_counter
        for _ in range(count):
            t = clock()
            proto.request()
            await proto.replies.get()
            out.append((clock() - t) * 1e6)
        return out

    async def depth(self, count: int, depth: int) -> float:
        proto = self.proto
        assert proto is not None
        t = time.perf_counter()
        sent = 0
        for _ in range(min(depth, count)):
            proto.request()
            sent += 1
        for _ in range(count):
            await proto.replies.get()
            if sent < count:
                proto.request()
                sent += 1
        return count / (time.perf_counter() - t)

    async def close(self) -> None:
        if self.proto is not None:
            self.proto.close()
            await self.proto.wait_closed()
        if self.transport is not None:
            self.transport.close()


async def start_echo_quic() -> QuicServer:
    cert = generate_self_signed("bench")
    sconf = QuicConfiguration(is_client=False, alpn_protocols=["echo"])
    sconf.certificate = x509.load_pem_x509_certificate(cert.cert_pem)
    sconf.private_key = serialization.load_pem_private_key(cert.key_pem, password=None)
    return await serve("127.0.0.1", 0, configuration=sconf, create_protocol=EchoServer)


# --- bare TLS echo ------------------------------------------------------------------------------


async def tls_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        while True:
            data = await reader.readexactly(len(BARE_BODY))
            writer.write(data)
    writer.close()


class BareTls:
    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        ctx = client_context(Identity.generate(), CONFIG)
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port, ssl=ctx)

    async def rtt(self, count: int) -> list[float]:
        reader, writer = self.reader, self.writer
        assert reader is not None and writer is not None
        out = []
        clock = time.perf_counter
        size = len(BARE_BODY)
        for _ in range(count):
            t = clock()
            writer.write(BARE_BODY)
            await reader.readexactly(size)
            out.append((clock() - t) * 1e6)
        return out

    async def depth(self, count: int, depth: int) -> float:
        reader, writer = self.reader, self.writer
        assert reader is not None and writer is not None
        size = len(BARE_BODY)
        t = time.perf_counter()
        sent = min(depth, count)
        writer.write(BARE_BODY * sent)
        for _ in range(count):
            await reader.readexactly(size)
            if sent < count:
                writer.write(BARE_BODY)
                sent += 1
        return count / (time.perf_counter() - t)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()


# --- TCP delay proxy ----------------------------------------------------------------------------


@dataclass
class TcpDelayProxy:
    """Forwards TCP to ``target`` and delays every chunk by ``delay`` seconds each way.

    A client's TCP handshake completes at the proxy without delay, so the client's first
    bytes are also held until one round trip (2 x ``delay``) after the accept: the SYN /
    SYN-ACK exchange of a real path with this delay. Order is kept; each direction's queue
    is bounded (``max_chunks``), and reading waits while it is full.
    """

    target: tuple[str, int]
    delay: float
    max_chunks: int = 1024
    port: int = 0
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def _accept(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        opened = loop.time()
        try:
            ureader, uwriter = await asyncio.open_connection(*self.target)
        except OSError:
            cwriter.close()
            return
        up = asyncio.ensure_future(self._pipe(creader, uwriter, opened + 2 * self.delay))
        down = asyncio.ensure_future(self._pipe(ureader, cwriter, 0.0))
        self._tasks.update((up, down))
        with contextlib.suppress(Exception, asyncio.CancelledError):  # closed under it: done
            await asyncio.gather(up, down)
        self._tasks.difference_update((up, down))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: float) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(self.max_chunks)

        async def forward() -> None:
            while True:
                due, chunk = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not chunk:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(chunk)

        sender = asyncio.ensure_future(forward())
        try:
            while True:
                chunk = await reader.read(65536)
                await queue.put((max(loop.time(), hold) + self.delay, chunk))
                if not chunk:
                    break
            await sender
        except (OSError, asyncio.IncompleteReadError):
            sender.cancel()
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)
