"""The QUIC adapter over real UDP loopback: handshake, stream-per-message, stream
credit, backpressure, limits, a dead peer, loss."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import message_of, run, settle

from iac.errors import CloseCode, ConnectionClosed, HandshakeError, IacError, TransportError
from iac.testing import Impairment, UdpRelay, eventually
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic import SHARE_LIMIT, QuicConn, QuicListener, dial_quic, listen_quic
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, sender_of

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "quic://127.0.0.1:0"


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
            assert message_of(item) is not None
            await conn.send(
                message(conn.identity, sender_of(message_of(item)), session, message_of(item).payload_json)
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
        server_got: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        peer_session = Session()

        async def exchange(conn: Connection) -> list[int]:
            assert isinstance(conn, QuicConn)

            async def send_all() -> None:
                for i in range(n):
                    await conn.send(message(conn.identity, conn.peer.agent_id, peer_session, str(i)))

            task = asyncio.create_task(send_all())
            got: list[int] = []
            for _ in range(n):
                item = await conn.recv()
                assert message_of(item) is not None
                got.append(int(message_of(item).payload_json))
            await task
            return got

        async def handler(conn: Connection) -> None:
            await settle(server_got, exchange(conn))

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
            assert message_of(item) is not None
            got_client.append(int(message_of(item).payload_json))
        await task
        got_server = await server_got
        assert sorted(got_client) == list(range(n))
        assert sorted(got_server) == list(range(n))
        accepted = server.conns[0]
        assert isinstance(accepted, QuicConn)
        for side in (conn, accepted):
            # never more streams opened than the peer allowed: the library's queue of blocked
            # streams never held one (its high-water mark is 0), and the pump waited for credit
            assert side.stats.max_blocked_streams == 0
            assert side.stats.frames_sent == n
            assert side.stats.streams_opened <= n
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
                    assert message_of(item) is not None
                    received.append(message_of(item).payload_json)
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
        queue = config.send_queue_frames
        sent = 0  # sends that returned

        def queued() -> int:
            """Frames accepted by send() that the pump has not put into a stream yet."""
            return sent - conn.stats.frames_sent

        def stuck() -> bool:
            """No stream credit left (nothing gets through to grant more) and the queue is full."""
            return conn.stats.credit_stalls > 0 and queued() == queue

        async def start_send() -> asyncio.Task[None]:
            """Start the next send; return once it ran as far as it can without waiting."""
            started = asyncio.Event()

            async def one(i: int) -> None:
                started.set()
                await conn.send(message(client, server.identity.agent_id, session, str(i), big))

            task = asyncio.create_task(one(sent))
            await started.wait()  # the task ran: its send returned, or it waits for room
            return task

        while True:
            task = await start_send()
            if not task.done():  # waiting for room, which the pump makes while stream credit lasts
                await eventually(lambda t=task: t.done() or stuck())
            if not task.done():
                blocked = task  # stuck: it waits until the path heals
                break
            task.result()
            sent += 1
        # every stream the peer allowed is used, then the bounded queue filled, and send waits
        assert conn.stats.credit_stalls > 0
        assert conn.stats.streams_opened == conn.stats.frames_sent >= 128
        assert queued() == queue
        relay.set_impairment(Impairment())
        await blocked
        sent += 1
        await eventually(lambda: len(received) == sent)
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
        assert message_of(item) is not None and message_of(item).payload_json == "still here"
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
            with pytest.raises(ConnectionClosed) as info:
                while True:  # the queue fills once credit runs out; then send waits and fails
                    await conn.send(message(client, conn.peer.agent_id, session, "more", b"y" * 1500))
            # Found dead by its unanswered keep-alive probes (QUIC's own idle timer, 3 probes long),
            # not by IAC's much longer idle_timeout, which closes with IDLE_TIMEOUT instead.
            assert "no answer from the peer" in str(info.value)
            assert info.value.code != CloseCode.IDLE_TIMEOUT
            with pytest.raises(ConnectionClosed):
                await conn.recv()
            assert conn.closed and conn.close_error is info.value

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
            assert message_of(item) is not None
            got.append(int(message_of(item).payload_json))
        assert sorted(got) == list(range(n))
        assert relay.stats.dropped_loss > 0
        await conn.close()
        await server.close()
        await relay.close()

    run(main(), timeout=60)


def test_close_sends_code_and_flushes() -> None:
    async def main() -> None:
        got: list[str] = []
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def receive_until_closed(conn: Connection) -> int:
            try:
                while True:
                    item = await conn.recv()
                    assert message_of(item) is not None
                    got.append(message_of(item).payload_json)
            except ConnectionClosed as exc:
                return exc.code

        async def handler(conn: Connection) -> None:
            await settle(done, receive_until_closed(conn))

        server = Server(handler)
        url = await server.start()
        client = Identity.generate()
        conn = await dial_quic(url, client)
        session = Session()
        for i in range(300):
            await conn.send(message(client, server.identity.agent_id, session, str(i)))
        await conn.close(CloseCode.GOING_AWAY, "bye")
        assert await done == CloseCode.GOING_AWAY
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
    from aioquic.asyncio import connect
    from aioquic.asyncio.server import QuicServer
    from aioquic.quic.configuration import QuicConfiguration
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

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

        # what aioquic's serve() does, keeping the UDP transport to learn the port it bound
        mitm_transport, mitm = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: QuicServer(configuration=sconf, stream_handler=on_stream), local_addr=("127.0.0.1", 0)
        )
        mport = mitm_transport.get_extra_info("sockname")[1]
        with pytest.raises((HandshakeError, TransportError)) as info:
            await dial_quic(
                f"quic://127.0.0.1:{mport}",
                Identity.generate(),
                expect=server.identity.agent_id,
                config=TransportConfig(handshake_timeout=2.0),
            )
        # the server's GOAWAY travelled back through the relay's pipe
        assert info.value.reason == "channel_binding_mismatch"
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
        # Nothing is read, so every frame the receiver decoded is waiting for recv(): past
        # recv_queue_frames it withholds stream credit; the sender's credit runs out and its
        # queue (sends returned, frames not yet in a stream) fills.
        await eventually(
            lambda: (
                accepted.stats.frames_received >= config.recv_queue_frames
                and conn.stats.credit_stalls > 0
                and sent - conn.stats.frames_sent >= config.send_queue_frames - 1
            )
        )
        assert not task.done()
        assert not accepted.closed
        waiting = accepted.stats.frames_received
        assert waiting < 64 + 128 * (SHARE_LIMIT // 100)  # bounded by what was already granted
        got = [int(message_of(await accepted.recv()).payload_json) for _ in range(n)]  # type: ignore[union-attr]
        await task
        assert sorted(got) == list(range(n))
        await conn.close()
        await server.close()

    run(main(), timeout=60)
