"""The QUIC adapter over real UDP loopback: handshake, stream-per-message, stream
credit, backpressure, limits, a dead peer, loss."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from iac.errors import ChannelBindingMismatch, CloseCode, ConnectionClosed, IacError, TransportError
from iac.testing.relay import Impairment, UdpRelay
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic import SHARE_LIMIT, QuicConn, QuicListener, dial_quic, listen_quic
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, sender_of

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "quic://127.0.0.1:0"


def run(coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def now_us() -> int:
    return time.time_ns() // 1000


def message(identity: Identity, to: str, session: Session, payload: str = "", extra: bytes = b"") -> bytes:
    msg = build_message(
        sender=identity.agent_id,
        to=to,
        msg_type=MessageType.COMMAND,
        session=session,
        timestamp_us=now_us(),
        payload_json=payload,
        extra_data=extra,
    )
    return encode_message_frame(identity, msg)


class Server:
    """A listener whose connections are collected; optional per-connection handler."""

    def __init__(self, handler: Callable[[Connection], Awaitable[None]] | None = None) -> None:
        self.identity = Identity.generate()
        self.conns: list[Connection] = []
        self.handler = handler
        self.arrived = asyncio.Event()
        self.listener: QuicListener | None = None

    async def on_connection(self, conn: Connection) -> None:
        self.conns.append(conn)
        self.arrived.set()
        if self.handler is not None:
            await self.handler(conn)

    async def start(self, config: TransportConfig | None = None) -> str:
        self.listener = await listen_quic(LOOPBACK, self.identity, self.on_connection, config=config)
        return self.listener.addresses[0]

    async def close(self) -> None:
        if self.listener is not None:
            await self.listener.close()


async def echo(conn: Connection) -> None:
    """Answer every message with a message carrying the same payload."""
    assert isinstance(conn, QuicConn)
    session = Session()
    try:
        while True:
            item = await conn.recv()
            assert item.message is not None
            await conn.send(
                message(conn.identity, sender_of(item.message), session, item.message.payload_json)
            )
    except IacError:
        return


def test_handshake_over_udp_loopback() -> None:
    async def main() -> None:
        server = Server()
        url = await server.start()
        client = Identity.generate()
        conn = await dial_quic(url, client, expect=server.identity.agent_id)
        await server.arrived.wait()
        assert conn.peer.agent_id == server.identity.agent_id
        assert conn.peer.transport == "quic"
        assert conn.peer.dialed and not conn.peer.resumed
        assert conn.peer.hello.peer_agent_id == client.agent_id
        accepted = server.conns[0]
        assert accepted.peer.agent_id == client.agent_id
        assert not accepted.peer.dialed
        assert conn.local_hello.nonce == accepted.peer.hello.nonce
        await conn.close()
        await server.close()

    run(main())


def test_ten_thousand_each_way_within_stream_credit() -> None:
    n = 10_000

    async def main() -> None:
        got_server: list[int] = []
        peer_session = Session()

        async def handler(conn: Connection) -> None:
            assert isinstance(conn, QuicConn)

            async def send_all() -> None:
                for i in range(n):
                    await conn.send(message(conn.identity, conn.peer.agent_id, peer_session, str(i)))

            task = asyncio.create_task(send_all())
            for _ in range(n):
                item = await conn.recv()
                assert item.message is not None
                got_server.append(int(item.message.payload_json))
            await task

        server = Server(handler)
        url = await server.start()
        client = Identity.generate()
        conn = await dial_quic(url, client, expect=server.identity.agent_id)
        session = Session()

        async def send_all() -> None:
            for i in range(n):
                await conn.send(message(client, server.identity.agent_id, session, str(i)))

        task = asyncio.create_task(send_all())
        got_client = []
        for _ in range(n):
            item = await conn.recv()
            assert item.message is not None
            got_client.append(int(item.message.payload_json))
        await task
        while len(got_server) < n:
            await asyncio.sleep(0.01)
        assert sorted(got_client) == list(range(n))
        assert sorted(got_server) == list(range(n))
        accepted = server.conns[0]
        assert isinstance(accepted, QuicConn)
        for side in (conn, accepted):
            # never more streams opened than the peer allowed: aioquic's queue of
            # blocked streams stayed empty, and the pump did wait for credit
            assert side.stats.max_blocked_streams == 0
            assert side.stats.frames_sent == n
            assert side.stats.streams_opened <= n
            assert side._quic._streams_blocked_uni == []
        assert conn.stats.credit_stalls > 0 or conn.stats.streams_opened < 128
        await conn.close()
        await server.close()

    run(main(), timeout=120)


def test_send_blocks_when_queue_is_full_and_resumes() -> None:
    """Cut the path after the handshake: stream credit runs out, the bounded queue
    fills, ``send`` waits; heal the path and everything arrives."""
    config = TransportConfig(send_queue_frames=8, keepalive_interval=30.0, idle_timeout=60.0)
    big = b"x" * 1500  # above SHARE_LIMIT: one stream per frame

    async def main() -> None:
        received: list[str] = []

        async def handler(conn: Connection) -> None:
            try:
                while True:
                    item = await conn.recv()
                    assert item.message is not None
                    received.append(item.message.payload_json)
            except IacError:
                return

        server = Server(handler)
        url = await server.start(config)
        port = int(url.rsplit(":", 1)[1])
        relay = UdpRelay(("127.0.0.1", port), seed=1)
        host, rport = await relay.start()
        client = Identity.generate()
        conn = await dial_quic(f"quic://{host}:{rport}", client, config=config)
        relay.set_impairment(Impairment(loss=1.0))  # black hole both ways
        session = Session()
        sent = 0
        blocked: asyncio.Task[None] | None = None
        while blocked is None:
            task = asyncio.create_task(
                conn.send(message(client, server.identity.agent_id, session, str(sent), big))
            )
            for _ in range(3):
                await asyncio.sleep(0)
            if task.done():
                task.result()
                sent += 1
            else:
                blocked = task
        # stream credit (128 at start) is spent, then the queue filled
        assert sent >= 128 + config.send_queue_frames - 1
        assert len(conn._queue) == config.send_queue_frames
        assert conn.stats.credit_stalls > 0
        for _ in range(10):
            await asyncio.sleep(0)
        assert not blocked.done()
        relay.set_impairment(Impairment())
        await blocked
        sent += 1
        while len(received) < sent:
            await asyncio.sleep(0.01)
        assert sorted(map(int, received)) == list(range(sent))
        assert conn.stats.max_blocked_streams == 0
        await conn.close()
        await server.close()
        await relay.close()

    run(main(), timeout=60)


def test_oversized_frame_closes_only_that_connection() -> None:
    config = TransportConfig(max_frame_size=64 * 1024)

    async def main() -> None:
        server = Server(echo)
        url = await server.start(config)
        bad_id, good_id = Identity.generate(), Identity.generate()
        bad = await dial_quic(url, bad_id)
        good = await dial_quic(url, good_id)
        await bad.send(encode_frame(FrameType.MESSAGE, b"\x00" * (100 * 1024)))
        with pytest.raises(ConnectionClosed) as info:
            await bad.recv()
        assert info.value.code == CloseCode.FRAME_TOO_LARGE
        with pytest.raises(IacError):
            await bad.send(message(bad_id, server.identity.agent_id, Session()))
        await good.send(message(good_id, server.identity.agent_id, Session(), "still here"))
        item = await good.recv()
        assert item.message is not None and item.message.payload_json == "still here"
        await good.close()
        await server.close()

    run(main())


SERVER_SCRIPT = """
import asyncio, sys
from iac.wire.identity import Identity
from iac.transport.quic import listen_quic

async def main():
    async def on_connection(conn):
        while True:
            await conn.recv()   # read, never answer
    listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_connection)
    print(listener.addresses[0], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_peer_killed_mid_stream_fails_pending_sends() -> None:
    config = TransportConfig(send_queue_frames=4, keepalive_interval=0.2, idle_timeout=5.0)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT], stdout=subprocess.PIPE, cwd=ROOT, text=True
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()

        async def main() -> None:
            client = Identity.generate()
            conn = await dial_quic(url, client, config=config)
            session = Session()
            await conn.send(message(client, conn.peer.agent_id, session, "first"))
            proc.kill()
            proc.wait()
            started = time.monotonic()
            with pytest.raises((ConnectionClosed, TransportError)):
                while True:  # the queue fills once credit runs out; then send waits and fails
                    await conn.send(message(client, conn.peer.agent_id, session, "more", b"y" * 1500))
            assert time.monotonic() - started < 5.0
            with pytest.raises((ConnectionClosed, TransportError)):
                await conn.recv()
            assert conn.closed

        run(main(), timeout=20)
    finally:
        proc.kill()
        proc.wait()


def test_five_percent_loss_through_relay() -> None:
    n = 500

    async def main() -> None:
        server = Server(echo)
        url = await server.start()
        port = int(url.rsplit(":", 1)[1])
        relay = UdpRelay(("127.0.0.1", port), Impairment(delay=0.002, jitter=0.002, loss=0.05), seed=7)
        host, rport = await relay.start()
        client = Identity.generate()
        conn = await dial_quic(f"quic://{host}:{rport}", client, expect=server.identity.agent_id)
        session = Session()
        for i in range(n):
            await conn.send(message(client, server.identity.agent_id, session, str(i)))
        got = []
        for _ in range(n):
            item = await conn.recv()
            assert item.message is not None
            got.append(int(item.message.payload_json))
        assert sorted(got) == list(range(n))
        assert relay.stats.dropped_loss > 0
        await conn.close()
        await server.close()
        await relay.close()

    run(main(), timeout=60)


def test_close_sends_code_and_flushes() -> None:
    async def main() -> None:
        got: list[str] = []
        done = asyncio.Event()

        async def handler(conn: Connection) -> None:
            try:
                while True:
                    item = await conn.recv()
                    assert item.message is not None
                    got.append(item.message.payload_json)
            except ConnectionClosed as exc:
                assert exc.code == CloseCode.GOING_AWAY
                done.set()

        server = Server(handler)
        url = await server.start()
        client = Identity.generate()
        conn = await dial_quic(url, client)
        session = Session()
        for i in range(300):
            await conn.send(message(client, server.identity.agent_id, session, str(i)))
        await conn.close(CloseCode.GOING_AWAY, "bye")
        await done.wait()
        assert sorted(map(int, got)) == list(range(300))
        with pytest.raises(ConnectionClosed):
            await conn.send(message(client, server.identity.agent_id, session))
        await server.close()

    run(main())


def test_nothing_listening_is_a_transport_error() -> None:
    async def main() -> None:
        server = Server()
        url = await server.start()
        await server.close()
        with pytest.raises(TransportError):
            await dial_quic(url, Identity.generate(), config=TransportConfig(handshake_timeout=2.0))

    run(main())


def test_man_in_the_middle_with_its_own_certificate_is_refused() -> None:
    """A QUIC relay that terminates TLS with its own certificate and pipes the control
    stream both ways: the real server sees a client HELLO bound to the relay's
    certificate and refuses it; the client never gets a connection."""
    from aioquic.asyncio import connect, serve
    from aioquic.quic.configuration import QuicConfiguration
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from iac.errors import HandshakeError
    from iac.protocol.handshake import ALPN
    from iac.transport.certs import generate_self_signed

    async def main() -> None:
        server = Server()
        url = await server.start()
        port = int(url.rsplit(":", 1)[1])
        cert = generate_self_signed("mallory")
        sconf = QuicConfiguration(is_client=False, alpn_protocols=[ALPN])
        sconf.certificate = x509.load_pem_x509_certificate(cert.cert_pem)
        sconf.private_key = serialization.load_pem_private_key(cert.key_pem, password=None)
        tasks: set[asyncio.Task[None]] = set()
        stacks: list[Any] = []

        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while data := await reader.read(65536):
                writer.write(data)

        async def relay_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            cconf = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=0)
            ctx = connect("127.0.0.1", port, configuration=cconf)
            upstream = await ctx.__aenter__()
            stacks.append(ctx)
            ureader, uwriter = await upstream.create_stream()
            await asyncio.gather(pipe(reader, uwriter), pipe(ureader, writer), return_exceptions=True)

        def on_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.create_task(relay_stream(reader, writer))
            tasks.add(task)

        mitm = await serve("127.0.0.1", 0, configuration=sconf, stream_handler=on_stream)
        assert mitm._transport is not None
        mport = mitm._transport.get_extra_info("sockname")[1]
        with pytest.raises((HandshakeError, TransportError)) as info:
            await dial_quic(
                f"quic://127.0.0.1:{mport}",
                Identity.generate(),
                expect=server.identity.agent_id,
                config=TransportConfig(handshake_timeout=2.0),
            )
        # the server's GOAWAY travelled back through the relay's pipe
        assert isinstance(info.value, ChannelBindingMismatch)
        assert server.listener is not None
        assert server.listener.refused == {"channel_binding_mismatch": 1}
        assert server.conns == []
        for task in tasks:
            task.cancel()
        for ctx in stacks:
            with contextlib.suppress(Exception):
                await ctx.__aexit__(None, None, None)
        mitm.close()
        await server.close()

    run(main())


def test_slow_reader_pushes_back_on_the_sender() -> None:
    """A receiver that does not read withholds stream credit: the sender's ``send``
    waits instead of the receiver buffering without bound; reading resumes the flow."""
    config = TransportConfig(recv_queue_frames=64, send_queue_frames=16)
    n = 2000

    async def main() -> None:
        server = Server()
        url = await server.start(config)
        client = Identity.generate()
        conn = await dial_quic(url, client, config=config)
        await server.arrived.wait()
        accepted = server.conns[0]
        assert isinstance(accepted, QuicConn)
        session = Session()
        sent = 0

        async def send_all() -> None:
            nonlocal sent
            for i in range(n):
                await conn.send(message(client, server.identity.agent_id, session, str(i)))
                sent += 1

        task = asyncio.create_task(send_all())
        await until(lambda: accepted._recv_full and conn.stats.credit_stalls > 0 and len(conn._queue) >= 15)
        assert not task.done()
        assert not accepted.closed
        waiting = len(accepted._ready)
        assert waiting < 64 + 128 * (SHARE_LIMIT // 100)  # bounded by what was already granted
        got = [int((await accepted.recv()).message.payload_json) for _ in range(n)]  # type: ignore[union-attr]
        await task
        assert sorted(got) == list(range(n))
        await conn.close()
        await server.close()

    run(main(), timeout=60)


async def until(predicate: Callable[[], bool]) -> None:
    """Wait for a condition another task makes true (the test's timeout bounds it)."""
    while not predicate():
        await asyncio.sleep(0.005)
