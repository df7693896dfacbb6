"""QUIC keep-alive PINGs and the IAC idle timeout are two clocks (docs/PROTOCOL.md, section 7,
"QUIC versions, streams and parameters"): PINGs keep the QUIC connection alive past QUIC's own
idle timeout, and never reset the IAC idle timeout, which counts IAC frames only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from conftest import run

from iac.errors import CloseCode, ConnectionClosed
from iac.transport import dial, listen
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic.configuration import transport_idle
from iac.transport.quic.connection import QuicConn
from iac.transport.timers import loop_timers
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity

#: PINGs every 0.1 s; QUIC's idle timeout is 3 of them (0.3 s), the IAC idle timeout 1 s.
CONFIG = TransportConfig(handshake_timeout=5.0, linger_timeout=0.2, keepalive_interval=0.1, idle_timeout=1.0)


@contextlib.asynccontextmanager
async def quic_pair(config: TransportConfig) -> AsyncIterator[tuple[Connection, Connection]]:
    """A QUIC connection on loopback: the dialer's end and the listener's."""
    server, client = Identity.generate(), Identity.generate()
    accepted: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

    async def on_conn(conn: Connection) -> None:
        accepted.set_result(conn)
        await conn.wait_closed()

    async with await listen("quic://127.0.0.1:0", server, on_conn, config=config) as listener:
        conn = await dial(listener.addresses[0], client, expect=server.agent_id, config=config)
        yield conn, await asyncio.wait_for(accepted, 5)


@pytest.mark.parametrize("side", ["dialer", "listener"])
def test_a_connection_with_only_keepalives_ends_at_the_iac_idle_timeout(side: str) -> None:
    assert transport_idle(CONFIG) < (CONFIG.idle_timeout or 0) / 2

    async def main() -> None:
        async with quic_pair(CONFIG) as (conn, other):
            watched = conn if side == "dialer" else other
            await asyncio.wait_for(watched.wait_closed(), 10)
            err = watched.close_error
            # QUIC's own idle timeout (0.3 s) would end it as "no answer from the peer" without a
            # code: the PINGs kept QUIC alive, and the IAC idle timeout ended it anyway
            assert isinstance(err, ConnectionClosed), err
            assert err.code == CloseCode.IDLE_TIMEOUT, err
            await conn.close()

    run(main())


#: Keep-alives by hand (``alive()``): the interval's own PINGs and path MTU probes stay out.
QUIET = TransportConfig(handshake_timeout=5.0, linger_timeout=0.2, keepalive_interval=60.0, quic_pmtud=False)


def test_a_keepalive_ping_costs_the_answering_side_one_flush_and_no_timer() -> None:
    """A datagram that gives the connection no event (a keep-alive PING) has no reply to wait
    for: its ACK leaves in the callback that received it (docs/IMPLEMENTATION.md, "Timers at
    scale"), not after a flush that finds nothing due, the library's ACK-delay timer and a
    second flush. Counted over many PINGs; a few stray packets of the handshake's tail (late
    ACKs) may add a flush or a timer each."""
    rounds = 20

    async def main() -> None:
        async with quic_pair(QUIET) as (conn, other):
            assert isinstance(other, QuicConn)
            for _ in range(3):  # the handshake's tail settles
                assert await conn.alive(5.0)
            timers = loop_timers()
            flushes, fired = other.stats.transmits, timers.fired
            for _ in range(rounds):
                assert await conn.alive(5.0)  # a QUIC PING, answered by the listener's ACK
            # one flush per PING on the answering side (it was two: an empty one, then the
            # ACK-delay timer's), and no timer on either side (each PING's ACK-delay timer)
            assert other.stats.transmits - flushes <= rounds + 3
            assert timers.fired - fired <= 3
            await conn.close()

    run(main())


def test_a_keepalive_ping_costs_the_pinging_side_one_flush() -> None:
    """The PING's ACK gives the pinging side an event (the PING acknowledged) that nothing
    answers on the wire, and frees nothing to send: no flush for it (it was one that found
    nothing to send, a loop turn later)."""
    rounds = 20

    async def main() -> None:
        async with quic_pair(QUIET) as (conn, _other):
            assert isinstance(conn, QuicConn)
            for _ in range(3):  # the handshake's tail settles
                assert await conn.alive(5.0)
            flushes = conn.stats.transmits
            for _ in range(rounds):
                assert await conn.alive(5.0)  # the PING's flush; its ACK, no flush
                for _ in range(3):  # a flush the ACK asked for would run in these loop turns
                    await asyncio.sleep(0)
            assert conn.stats.transmits - flushes <= rounds + 3
            await conn.close()

    run(main())


def test_a_frame_whose_ack_comes_back_costs_its_sender_one_flush() -> None:
    """A datagram of ACKs only that frees nothing to send (nothing lost, nothing held back by
    the congestion window, nothing queued) gets no flush: the sender of a reply pays one flush
    for it, not a second one when its ACK comes back (docs/IMPLEMENTATION.md, "Timers at
    scale"). Counted over many frames, each acknowledged before the next goes."""
    rounds = 20
    body = b"r" * 200
    frame = encode_frame(FrameType.MESSAGE, body)

    async def main() -> None:
        async with quic_pair(QUIET) as (conn, other):
            assert isinstance(other, QuicConn)
            for _ in range(3):  # the handshake's tail settles
                assert await conn.alive(5.0)
            proto = cast(Any, other._proto)
            arrived = asyncio.Event()
            received = proto.datagram_received

            def counted(data: bytes, addr: Any) -> None:
                received(data, addr)
                arrived.set()

            proto.datagram_received = counted

            async def acknowledged() -> None:
                while other.quic._loss.bytes_in_flight:
                    arrived.clear()
                    await asyncio.wait_for(arrived.wait(), 5)

            await acknowledged()
            flushes = other.stats.transmits
            for _ in range(rounds):
                await other.send(frame)
                assert (await conn.recv()).frame.body == body
                await acknowledged()  # the dialer's ACK, a datagram of ACKs only, came back
            # one flush per frame (it was two: the frame's, then one after its ACK that found
            # nothing to send); a stray packet of the handshake's tail may add one or two
            assert other.stats.transmits - flushes <= rounds + 3
            await conn.close()

    run(main())
