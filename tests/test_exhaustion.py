"""Memory exhaustion: what a hostile peer can make a node hold, on real sockets.

The receiving node runs in a process of its own (tests/exhaustion_receiver.py): its
resident set is what is measured (libzstd allocates outside tracemalloc), away from
this process's allocations. A hostile peer written here sends raw frames; an honest
node sends requests before, during and after each attack, and every one must be
answered. The bounds asserted are the ones docs/THREAT_MODEL.md ("Memory
exhaustion") documents, next to the figures these tests measured.

The default runs are short; ``IAC_SLOW=1`` runs the bigger variants marked slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from conftest import HERE, TRANSPORT_PARAMS, run

from iac.errors import CloseCode, DialError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.protocol.handshake import ALPN
from iac.testing import eventually
from iac.transport import dial, listen
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic import QuicConn
from iac.transport.stream import StreamConnection, StreamListener
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, FLAG_ZSTD, FrameType
from iac.wire.identity import Identity
from iac.wire.scan import encode_varint

SLOW = os.environ.get("IAC_SLOW") == "1"
MiB = 1 << 20
KiB = 1 << 10
FRAME = DEFAULT_MAX_FRAME_SIZE  # the receiver's max_frame_size

#: What one idle authenticated connection may cost the receiver (docs/THREAT_MODEL.md).
IDLE_CONNECTION_BYTES = 128 * KiB


def bomb(size: int = FRAME, ftype: FrameType = FrameType.MESSAGE) -> bytes:
    """A MESSAGE frame whose zstd body declares ``size`` zero bytes: about 150 bytes on the wire."""
    body = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(size))
    return bytes((ftype, FLAG_ZSTD)) + encode_varint(len(body)) + body


def frame_head(length: int) -> bytes:
    """The header of a raw MESSAGE frame of ``length`` bytes (its body to follow)."""
    return bytes((FrameType.MESSAGE, 0)) + encode_varint(length)


# --- the receiver, in a process of its own -------------------------------------------------------


class Receiver:
    """tests/exhaustion_receiver.py: a node that answers RUN with its payload, and its RSS."""

    def __init__(self, proc: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.proc = proc
        self.agent_id: str = info["id"]
        self.address: str = info["addrs"][0]

    async def command(self, name: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": name}).encode() + b"\n")
        await self.proc.stdin.drain()
        return dict(json.loads(await self.proc.stdout.readline()))

    async def mark(self) -> int:
        """Reset the peak; the RSS now (bytes)."""
        return int((await self.command("mark"))["rss"])

    async def peak(self) -> tuple[int, int]:
        """(the highest RSS since :meth:`mark`, the RSS now)."""
        got = await self.command("peak")
        return int(got["peak"]), int(got["rss"])


@contextlib.asynccontextmanager
async def receiver(listen: str, **transport: Any) -> AsyncIterator[Receiver]:
    spec = {"listen": [listen], "transport": transport}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE / "exhaustion_receiver.py"),
        json.dumps(spec),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(HERE.parent),
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line, "the receiver did not start"
        yield Receiver(proc, json.loads(line))
    finally:
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.write(b'{"cmd": "quit"}\n')
            await proc.stdin.drain()
            await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class Honest:
    """An honest node asking the receiver for echoes; every request must be answered."""

    def __init__(self, node: Node, rx: Receiver) -> None:
        self.node = node
        self.rx = rx
        self.answered = 0

    async def ask(self, n: int = 3) -> None:
        for _ in range(n):
            reply = await self.node.request(
                self.rx.agent_id, MessageType.RUN, {"n": self.answered}, timeout=10
            )
            assert reply.payload == {"n": self.answered}
            self.answered += 1

    @contextlib.asynccontextmanager
    async def asking(self) -> AsyncIterator[None]:
        """Keep asking while the block runs (during an attack); at least one answer must come."""
        before = self.answered
        stop = asyncio.Event()

        async def loop() -> None:
            while not stop.is_set():
                await self.ask(1)
                await asyncio.sleep(0.02)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            stop.set()
            await task  # a failed request fails the test here
        assert self.answered > before


@contextlib.asynccontextmanager
async def honest(rx: Receiver) -> AsyncIterator[Honest]:
    async with Node(config=NodeConfig()) as node:
        node.add_peer(rx.agent_id, rx.address)
        for attempt in range(3):  # a receiver just started on a busy machine may answer late
            try:
                await node.connect(rx.agent_id)
                break
            except DialError:
                if attempt == 2:
                    raise
        peer = Honest(node, rx)
        await peer.ask(5)  # warm up both sides before the receiver's memory is marked
        yield peer


def check(growth: int, bound: int, what: str) -> None:
    print(f"{what}: RSS +{growth / MiB:.2f} MiB (bound {bound / MiB:.2f} MiB)")
    assert growth <= bound, (
        f"{what}: the receiver's RSS grew {growth / MiB:.1f} MiB, above {bound / MiB:.1f} MiB"
    )


async def released(rx: Receiver, base: int, bound: int, what: str, within: float = 5.0) -> None:
    """What a closed connection held comes back: the RSS falls to ``base + bound`` within
    ``within`` seconds (a closed QUIC connection lingers while it drains, and with it what
    the QUIC library held for it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        _, now = await rx.peak()
        if now - base <= bound or loop.time() > deadline:
            break
        await asyncio.sleep(0.25)
    check(now - base, bound, what)


def listen_on(transport: str, sockdir: Path) -> str:
    return f"unix://{sockdir}/rx.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"


async def attacker(rx: Receiver) -> Connection:
    """An authenticated hostile peer: a HELLO of its own, then raw bytes (:func:`write_raw`)."""
    return await dial(rx.address, Identity.generate(), expect=rx.agent_id, config=TransportConfig())


def write_raw(conn: Connection, data: bytes, *, end: bool = True) -> None:
    """Put ``data`` on the wire as it is: one write on TLS/UNIX, one new stream on QUIC."""
    if isinstance(conn, StreamConnection):
        conn._transport.write(data)
    else:
        assert isinstance(conn, QuicConn)
        quic = conn._quic
        quic.send_stream_data(quic.get_next_available_stream_id(is_unidirectional=True), data, end_stream=end)
        conn._proto.transmit()


# --- compression amplification -------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_amplification_batch_holds_one_frame(transport: str, sockdir: Path) -> None:
    """100 MESSAGE frames of ~150 bytes, each a zstd frame declaring 4 MiB, in one write
    (15 KB): the receiver inflates one frame at a time, when its reader takes it, and holds
    nothing once it closed the connection (malformed_message)."""

    async def main() -> None:
        async with receiver(listen_on(transport, sockdir)) as rx, honest(rx) as peer:
            base = await rx.mark()
            conn = await attacker(rx)
            async with peer.asking():
                write_raw(conn, bomb() * 100)
                await asyncio.wait_for(conn.wait_closed(), 10)
            error = conn.close_error
            assert error is not None and getattr(error, "code", None) == CloseCode.MALFORMED_MESSAGE
            await peer.ask(3)
            high, _ = await rx.peak()
            check(high - base, FRAME + MiB, f"{transport} amplification batch, peak")
            await released(rx, base, MiB, f"{transport} amplification batch, after the close")

    run(main(), timeout=60)


@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_amplification_from_many_connections_stays_within_the_node_cap(transport: str, sockdir: Path) -> None:
    """Many hostile connections at once, each sending the batch: together they hold no more
    than the node's ``memory_budget_bytes`` (here 16 MiB; 4 frames of 4 MiB)."""
    n = 32 if SLOW else 12
    budget = 16 * MiB

    async def main() -> None:
        listen = listen_on(transport, sockdir)
        async with (
            receiver(listen, memory_budget_bytes=budget, recv_budget_bytes=8 * MiB) as rx,
            honest(rx) as peer,
        ):
            conns = [await attacker(rx) for _ in range(n)]
            base = await rx.mark()
            async with peer.asking():
                for conn in conns:
                    write_raw(conn, bomb() * 100)
                await asyncio.wait_for(asyncio.gather(*(c.wait_closed() for c in conns)), 20)
            high, _ = await rx.peak()  # (after a garbage collection)
            check(high - base, budget + 2 * MiB, f"{transport} amplification from {n} connections, peak")
            await released(
                rx, base, 2 * MiB, f"{transport} amplification from {n} connections, after the closes"
            )
            stats = await rx.command("stats")
            assert stats["budget_used"] < 64 * KiB  # the honest peer's connection

    run(main(), timeout=90)


# --- QUIC: frames before the HELLO ---------------------------------------------------------------


class _RawQuic:
    """A QUIC client with ALPN iac/1 that never sends a HELLO: it only opens streams."""

    def __init__(self) -> None:
        self.closed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.stack: contextlib.AsyncExitStack = contextlib.AsyncExitStack()
        self.proto: Any = None

    async def connect(self, address: str) -> None:
        from aioquic.asyncio.client import connect
        from aioquic.asyncio.protocol import QuicConnectionProtocol
        from aioquic.quic.configuration import QuicConfiguration
        from aioquic.quic.events import ConnectionTerminated

        closed = self.closed

        class Protocol(QuicConnectionProtocol):
            def quic_event_received(self, event: Any) -> None:
                if isinstance(event, ConnectionTerminated) and not closed.done():
                    closed.set_result(event.error_code)

        host, port = address.removeprefix("quic://").rsplit(":", 1)
        # a short idle timeout: should the server's close be lost, this side still ends
        qc = QuicConfiguration(
            is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE, idle_timeout=4.0
        )
        self.proto = await self.stack.enter_async_context(
            connect(host, int(port), configuration=qc, create_protocol=Protocol, wait_connected=True)
        )

    async def close_code(self, timeout: float = 10) -> int:
        """The error code the server closed the connection with (0: it ended without one).
        A close frame received shows at once; the library reports the end only after draining."""
        quic = self.proto._quic
        await eventually(lambda: quic._close_event is not None or self.closed.done(), timeout=timeout)
        if quic._close_event is not None:
            return int(quic._close_event.error_code)
        return self.closed.result()

    def send(self, data: bytes, *, end: bool = True) -> None:
        quic = self.proto._quic
        quic.send_stream_data(quic.get_next_available_stream_id(is_unidirectional=True), data, end_stream=end)
        self.proto.transmit()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.stack.aclose()


def test_quic_frames_before_the_hello_are_held_compressed() -> None:
    """Two connections, each with 120 bombs on 120 streams before (instead of) a HELLO: they
    are held as they came (36 KB in all), never inflated, until the handshake times out."""

    async def main() -> None:
        async with receiver("quic://127.0.0.1:0", handshake_timeout=2.0) as rx, honest(rx) as peer:
            base = await rx.mark()
            clients = [_RawQuic() for _ in range(2)]
            try:
                async with peer.asking():
                    for client in clients:
                        await client.connect(rx.address)
                        for _ in range(120):
                            client.send(bomb())
                    codes = await asyncio.gather(*(c.close_code() for c in clients))
                assert set(codes) <= {CloseCode.HANDSHAKE_FAILED, 0}  # (0: the close was lost)
            finally:
                for client in clients:
                    await client.aclose()
            high, _ = await rx.peak()
            check(high - base, MiB, "QUIC frames before the HELLO, peak")
            await released(rx, base, MiB, "QUIC frames before the HELLO, after the timeout")
            await peer.ask(3)

    run(main(), timeout=60, loop_errors=False)


def test_quic_bytes_before_the_hello_are_bounded() -> None:
    """Frames before the HELLO may hold ``early_frames_bytes`` (plus one HELLO's worth of
    partly received bytes); one byte more closes the connection with BUFFER_EXCEEDED."""

    async def main() -> None:
        early = 64 * KiB
        async with receiver("quic://127.0.0.1:0", early_frames_bytes=early, max_frame_size=64 * KiB) as rx:
            client = _RawQuic()
            try:
                await client.connect(rx.address)
                for _ in range(40):
                    client.send(frame_head(4000) + bytes(4000))  # 160 KB of whole frames
                code = await client.close_code()
                assert code == CloseCode.BUFFER_EXCEEDED
            finally:
                await client.aclose()

    run(main(), timeout=60, loop_errors=False)


def test_quic_data_behind_gaps_is_counted() -> None:
    """Stream data at high offsets, a byte each: the QUIC library holds it for reassembly,
    the gap before it filled with zeros (a 1.2 KB packet can make it allocate megabytes).
    The receiver counts those bytes against ``recv_budget_bytes`` and closes the connection
    (BUFFER_EXCEEDED) once they pass it."""
    budget = 8 * MiB

    async def main() -> None:
        async with receiver("quic://127.0.0.1:0", recv_budget_bytes=budget) as rx, honest(rx) as peer:
            base = await rx.mark()
            conn = await attacker(rx)
            assert isinstance(conn, QuicConn)
            quic = conn._quic
            sids = []
            for _ in range(100):
                sids.append(quic.get_next_available_stream_id(is_unidirectional=True))
                quic.send_stream_data(sids[-1], frame_head(FRAME) + b"x", end_stream=False)
            conn._proto.transmit()
            async with peer.asking():
                for _ in range(20):  # each round moves every stream's highest offset as far as allowed
                    await asyncio.sleep(0.2)
                    if conn.closed:
                        break
                    used = sum(quic._streams[sid].sender.highest_offset for sid in sids)
                    step = (quic._remote_max_data - used) // len(sids) - 64
                    for sid in sids:
                        stream = quic._streams[sid]
                        sender = stream.sender
                        offset = min(sender.highest_offset + step, stream.max_stream_data_remote - 1)
                        if step > 0 and offset > sender.highest_offset:  # one byte there, a gap before it
                            sender._buffer_start = sender._buffer_stop = sender.highest_offset = offset
                            quic.send_stream_data(sid, b"y", end_stream=False)
                    conn._proto.transmit()
                await asyncio.wait_for(conn.wait_closed(), 10)
            error = conn.close_error
            assert error is not None and getattr(error, "code", None) == CloseCode.BUFFER_EXCEEDED
            high, _ = await rx.peak()
            check(high - base, 4 * budget + 2 * MiB, "QUIC data behind gaps, peak")
            await released(rx, base, MiB, "QUIC data behind gaps, after the close")
            await peer.ask(3)

    run(main(), timeout=60, loop_errors=False)


# --- idle connections ----------------------------------------------------------------------------


@pytest.mark.slow  # 100 connections by default; IAC_SLOW=1 runs 500
@pytest.mark.parametrize("transport", TRANSPORT_PARAMS)
def test_idle_connections_cost_a_bounded_amount_each(transport: str, sockdir: Path) -> None:
    """Authenticated connections that send nothing: each costs the receiver at most
    ``IDLE_CONNECTION_BYTES``, and the node keeps answering the honest peer."""
    n = 500 if SLOW else 100

    async def main() -> None:
        async with receiver(listen_on(transport, sockdir)) as rx, honest(rx) as peer:
            base = await rx.mark()
            conns: list[Connection] = []
            async with peer.asking():
                for _ in range(n // 20):
                    conns += await asyncio.gather(*(attacker(rx) for _ in range(20)))
            await peer.ask(3)
            stats = await rx.command("stats")
            assert stats["connections"] >= n
            _, now = await rx.peak()
            check(now - base, n * IDLE_CONNECTION_BYTES, f"{transport} {n} idle connections")
            await asyncio.gather(*(c.close() for c in conns))
            await peer.ask(3)

    run(main(), timeout=180)


# --- QUIC: unfinished streams --------------------------------------------------------------------


def test_unfinished_quic_streams_are_bounded() -> None:
    """A peer opens streams, each with the start of a frame it never finishes. The receiver
    grants 128 streams (a stream that never ends returns no credit), so at most 128 partial
    frames exist; growing them past ``recv_budget_bytes`` closes the connection with
    BUFFER_EXCEEDED. A peer that opens 2,000 streams regardless of its credit is closed by
    QUIC itself at the first one beyond it (STREAM_LIMIT_ERROR)."""
    budget = 8 * MiB

    async def main() -> None:
        async with receiver("quic://127.0.0.1:0", recv_budget_bytes=budget) as rx, honest(rx) as peer:
            base = await rx.mark()
            conn = await attacker(rx)
            assert isinstance(conn, QuicConn)
            quic = conn._quic
            credit = quic._remote_max_streams_uni
            streams = []
            async with peer.asking():
                while quic._local_next_stream_id_uni // 4 < quic._remote_max_streams_uni:
                    sid = quic.get_next_available_stream_id(is_unidirectional=True)
                    quic.send_stream_data(sid, frame_head(FRAME) + bytes(4 * KiB), end_stream=False)
                    streams.append(sid)
                conn._proto.transmit()
                await asyncio.sleep(1.0)
                assert quic._remote_max_streams_uni == credit == len(streams)  # no stream came back
                high, _ = await rx.peak()
                check(high - base, budget + MiB, f"{len(streams)} unfinished QUIC streams, peak")
                # grow the partial frames the receiver holds: past the budget it closes
                for sid in streams:
                    quic.send_stream_data(sid, bytes(64 * KiB), end_stream=False)
                    conn._proto.transmit()
                    await asyncio.sleep(0)
                await asyncio.wait_for(conn.wait_closed(), 20)
            error = conn.close_error
            assert error is not None and getattr(error, "code", None) == CloseCode.BUFFER_EXCEEDED
            # The partial frames counted never exceed the budget; the process also holds what
            # receiving that much took (packets, the QUIC library, the C allocator's slack).
            high, _ = await rx.peak()
            check(high - base, 5 * budget // 2, "unfinished QUIC streams grown past the budget, peak")
            # nothing of the connection is left (its budget came back at once); what RSS keeps
            # is allocator slack (Python's small-object arenas go back only when empty)
            assert (await rx.command("stats"))["budget_used"] < 64 * KiB
            await released(rx, base, 3 * MiB, "unfinished QUIC streams, after the close")

            # 2,000 streams regardless of the credit: QUIC closes the connection at the first one
            base = await rx.mark()
            rogue = await attacker(rx)
            assert isinstance(rogue, QuicConn)
            rogue._quic._remote_max_streams_uni = 10_000
            for _ in range(2000):
                write_raw(rogue, frame_head(FRAME) + bytes(64), end=False)
            # the receiver's QUIC closes it: STREAM_LIMIT_ERROR (0x4)
            await eventually(lambda: rogue._quic._close_event is not None, timeout=10)
            assert rogue._quic._close_event.error_code == 0x4
            high, _ = await rx.peak()
            check(high - base, MiB, "2,000 QUIC streams beyond the credit, peak")
            await peer.ask(3)

    run(main(), timeout=90, loop_errors=False)


# --- nothing held after a close ------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["tls", "unix"])
def test_a_closed_connection_is_forgotten_at_once_and_its_error_holds_no_frames(
    transport: str, sockdir: Path
) -> None:
    """The listener forgets a connection as soon as it closed (not at the next accept), and
    the error it closed with carries its cause without a traceback: a traceback would keep
    the frames of the read that failed alive with the connection."""

    async def main() -> None:
        server = Identity.generate()
        accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

        async def on_conn(conn: Connection) -> None:
            accepted.set_result(conn)
            await conn.wait_closed()

        listener = await listen(listen_on(transport, sockdir), server, on_conn, config=TransportConfig())
        async with listener:
            conn = await dial(listener.addresses[0], Identity.generate(), config=TransportConfig())
            server_side = await accepted
            assert isinstance(listener, StreamListener) and listener._conns == {server_side}
            write_raw(conn, bytes((FrameType.MESSAGE, FLAG_ZSTD, 4)) + b"junk")  # not zstd
            await asyncio.wait_for(server_side.wait_closed(), 5)
            error = server_side.close_error
            assert error is not None and getattr(error, "code", None) == CloseCode.BAD_COMPRESSION
            cause = error.__cause__
            assert cause is not None and cause.__traceback__ is None
            assert listener._conns == set()  # forgotten without another accept
            await conn.close()

    run(main())
