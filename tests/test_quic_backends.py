"""The QUIC adapter on each backend (aioquic, qh3) and across them: handshake and a
2,000-message exchange each way for every client/server pair, stream credit, flush
on close, 0-RTT, receive-side backpressure, backend selection.

Every run also fails on an exception that reached the event loop's handler (an error
inside the library's transmit or timer callback is otherwise only logged)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from conftest import message_of, run, settle

from iac.errors import CloseCode, ConfigError, ConnectionClosed, IacError
from iac.testing import eventually
from iac.transport.base import Connection, TransportConfig
from iac.transport.quic import (
    ClientTicketStore,
    QuicConn,
    ServerTicketStore,
    dial_quic,
    listen_quic,
    set_backend,
)
from iac.transport.quic import backend as _quic_backend
from iac.wire._pb.iac_pb2 import MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame

LOOPBACK = "quic://127.0.0.1:0"
INSTALLED = _quic_backend.available()

#: Why qh3 is not offered (docs/IMPLEMENTATION.md, "QUIC libraries"; last tried 2026-12-01 with qh3
#: 2.1.0, the newest release): its native core raises from ``datagrams_to_send`` (inside the
#: transmit and timer callbacks), as the reproductions in tools/qh3/ show without IAC code.
#: A qh3 server raises answering an aioquic client's first Initial, on every connection: strict,
#: so that a release that fixes it is noticed.
QH3_SERVER_AIOQUIC_CLIENT = pytest.mark.xfail(
    strict=True,
    reason="qh3 2.1.0: a qh3 server's datagrams_to_send raises 'packet builder capacity exhausted' "
    "answering an aioquic client's first Initial, on every connection "
    "(tools/qh3/repro_builder_capacity.py)",
)
#: With qh3 on both sides it raises once datagrams are reordered or lost while many short streams
#: come and go: load-dependent, not strict (the lighter cases pass, and at times the heavier).
#: The slow-reader case at times
#: times out in the sender's close() after the receiver closed with BUFFER_EXCEEDED (cause
#: not established).
QH3_BOTH_SIDES = pytest.mark.xfail(
    strict=False,
    reason="qh3 2.1.0 on both sides: datagrams_to_send raises 'reserved stream is missing' when "
    "datagrams are reordered or lost (tools/qh3/repro_reserved_stream.py); "
    "slow reader: at times the sender's close() times out",
)


def _pair_marks(client: str, server: str) -> list[pytest.MarkDecorator]:
    if server != "qh3":
        return []
    return [QH3_SERVER_AIOQUIC_CLIENT] if client == "aioquic" else [QH3_BOTH_SIDES]


#: (client backend, server backend) for the backends installed here: aioquic always; the qh3
#: pairs only where qh3 is installed (it is not a dependency, so CI runs the aioquic pair).
PAIRS = [
    pytest.param(c, s, id=f"{c}-to-{s}", marks=_pair_marks(c, s))
    for c, s in [("aioquic", "aioquic"), ("qh3", "qh3"), ("aioquic", "qh3"), ("qh3", "aioquic")]
    if {c, s} <= set(INSTALLED)
]


def message(identity: Identity, to: str, session: Session, payload: str) -> bytes:
    msg = build_message(
        sender=identity.agent_id,
        to=to,
        msg_type=MessageType.COMMAND,
        session=session,
        timestamp_us=time.time_ns() // 1000,
        payload_json=payload,
    )
    return encode_message_frame(identity, msg)


async def exchange(conn: Connection, me: Identity, n: int) -> list[int]:
    """Send ``n`` messages and receive ``n`` at the same time; the payloads received."""
    session = Session()

    async def send_all() -> None:
        for i in range(n):
            await conn.send(message(me, conn.peer.agent_id, session, str(i)))

    task = asyncio.create_task(send_all())
    got = []
    for _ in range(n):
        item = await conn.recv()
        assert message_of(item) is not None
        got.append(int(message_of(item).payload_json))
    await task
    return got


@pytest.mark.parametrize(("client_backend", "server_backend"), PAIRS)
def test_handshake_and_2000_each_way(client_backend: str, server_backend: str) -> None:
    n = 2000
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        server_got: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()

        async def on_conn(conn: Connection) -> None:
            await settle(server_got, exchange(conn, server, n))
            await conn.wait_closed()

        listener = await listen_quic(LOOPBACK, server, on_conn, backend=server_backend)
        assert listener.backend.name == server_backend
        async with listener:
            conn = await dial_quic(
                listener.addresses[0], client, expect=server.agent_id, backend=client_backend
            )
            assert conn.backend.name == client_backend
            assert conn.peer.agent_id == server.agent_id and conn.peer.transport == "quic"
            assert conn.peer.hello.peer_agent_id == client.agent_id
            client_got = await exchange(conn, client, n)
            got = await server_got
            accepted = listener.connections()[0]
            assert accepted.backend.name == server_backend
            for side in (conn, accepted):
                assert side.stats.max_blocked_streams == 0
                assert side.stats.frames_sent == n
            await conn.close()
        assert sorted(client_got) == list(range(n))
        assert sorted(got) == list(range(n))

    run(main(), timeout=60)


@pytest.mark.parametrize(("client_backend", "server_backend"), PAIRS)
def test_ten_thousand_within_stream_credit(client_backend: str, server_backend: str) -> None:
    """Stream credit is respected under load: the pump waits for it, never queues
    streams inside the library (whose own queue is quadratic or refuses them)."""
    n = 10_000
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        server_got: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()

        async def on_conn(conn: Connection) -> None:
            await settle(server_got, exchange(conn, server, n))
            await conn.wait_closed()

        listener = await listen_quic(LOOPBACK, server, on_conn, backend=server_backend)
        async with listener:
            conn = await dial_quic(listener.addresses[0], client, backend=client_backend)
            client_got = await exchange(conn, client, n)
            got = await server_got
            accepted = listener.connections()[0]
            for side in (conn, accepted):
                assert side.stats.max_blocked_streams == 0
                assert side.stats.frames_sent == n
                assert side.stats.streams_opened <= n
            assert conn.stats.credit_stalls > 0 or conn.stats.streams_opened < 100
            await conn.close()
        assert sorted(client_got) == list(range(n)) and sorted(got) == list(range(n))

    run(main(), timeout=120)


@pytest.mark.parametrize(("client_backend", "server_backend"), PAIRS)
def test_close_flushes_everything_queued(client_backend: str, server_backend: str) -> None:
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        got: list[int] = []
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_conn(conn: Connection) -> None:
            try:
                while True:
                    item = await conn.recv()
                    assert message_of(item) is not None
                    got.append(int(message_of(item).payload_json))
            except ConnectionClosed as exc:
                done.set_result(exc.code)

        listener = await listen_quic(LOOPBACK, server, on_conn, backend=server_backend)
        async with listener:
            conn = await dial_quic(listener.addresses[0], client, backend=client_backend)
            session = Session()
            for i in range(300):
                await conn.send(message(client, server.agent_id, session, str(i)))
            await conn.close()
            assert await done == 0
        assert sorted(got) == list(range(300))

    run(main(), timeout=60)


@pytest.mark.parametrize(("client_backend", "server_backend"), PAIRS)
def test_zero_rtt_across_backends(client_backend: str, server_backend: str, tmp_path: Path) -> None:
    """A ticket from the server's backend, stored by the client's (and read back from
    the file), resumes with HELLO and a message as early data; the ticket is used once."""
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        delivered: list[str] = []
        accepted: list[Connection] = []

        async def on_conn(conn: Connection) -> None:
            accepted.append(conn)
            try:
                while True:
                    item = await conn.recv()
                    assert message_of(item) is not None
                    delivered.append(message_of(item).payload_json)
            except IacError:
                return

        tickets = ServerTicketStore()
        listener = await listen_quic(LOOPBACK, server, on_conn, tickets=tickets, backend=server_backend)
        url = listener.addresses[0]
        async with listener:
            store = ClientTicketStore(tmp_path / "tickets.json")
            set_backend(client_backend)  # the class a ticket read back from the file gets
            try:
                first = await dial_quic(url, client, expect=server.agent_id, tickets=store)
                await eventually(lambda: url in store)
                await first.close()
                store2 = ClientTicketStore(tmp_path / "tickets.json")
                conn = await dial_quic(url, client, expect=server.agent_id, tickets=store2)
            finally:
                set_backend(None)
            assert conn.backend.name == client_backend
            assert conn.peer.resumed and conn.early_data
            await conn.send(message(client, server.agent_id, Session(), "early"))
            await eventually(lambda: delivered == ["early"])
            last = accepted[-1]
            assert isinstance(last, QuicConn) and last.peer.resumed
            assert last._quic.tls.early_data_accepted
            await eventually(lambda: conn.peer_hello_verified)
            assert tickets.resumed == 1
            await eventually(lambda: url in store2)
            await conn.close()

    run(main(), timeout=60)


@pytest.mark.parametrize(("client_backend", "server_backend"), PAIRS)
def test_slow_reader_pushes_back(client_backend: str, server_backend: str) -> None:
    """A receiver that does not read: on a backend that can withhold stream credit
    (aioquic) the sender's ``send`` waits and nothing is lost; on one that cannot (qh3)
    the receiver's ``recv_budget_bytes`` is what bounds it, and the connection closes
    with BUFFER_EXCEEDED instead of slowing the sender."""
    config = TransportConfig(
        recv_queue_frames=64, send_queue_frames=16, max_frame_size=64 * 1024, recv_budget_bytes=1 << 20
    )
    n = 4000
    server, client = Identity.generate(), Identity.generate()

    async def main() -> None:
        arrived: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()

        async def on_conn(conn: Connection) -> None:
            arrived.set_result(conn)
            await conn.wait_closed()

        listener = await listen_quic(LOOPBACK, server, on_conn, config=config, backend=server_backend)
        async with listener:
            conn = await dial_quic(listener.addresses[0], client, config=config, backend=client_backend)
            accepted = await arrived
            assert isinstance(accepted, QuicConn)
            session = Session()
            sent = 0

            async def send_all() -> None:
                nonlocal sent
                for i in range(n):
                    await conn.send(message(client, server.agent_id, session, "x" * 400 + str(i)))
                    sent += 1

            task = asyncio.create_task(send_all())
            if accepted.backend.credit_control:
                # nothing is read: past recv_queue_frames waiting, the receiver withholds stream
                # credit, and the sender's queue (sends returned, frames not in a stream) fills
                await eventually(
                    lambda: (
                        accepted.stats.frames_received >= config.recv_queue_frames
                        and sent - conn.stats.frames_sent >= config.send_queue_frames - 1
                    )
                )
                assert not task.done() and not accepted.closed
                got = [message_of(await accepted.recv()) for _ in range(n)]
                await task
                assert len({m.msg_id for m in got if m is not None}) == n
            else:
                await accepted.wait_closed()  # never read: the budget runs out
                error = accepted.close_error
                assert isinstance(error, ConnectionClosed) and error.code == CloseCode.BUFFER_EXCEEDED
                task.cancel()
            await conn.close()

    run(main(), timeout=60)


def test_backend_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(_quic_backend.ENV_VAR, raising=False)
    set_backend(None)
    assert _quic_backend.selected_name() == _quic_backend.AUTO_ORDER[0]
    monkeypatch.setenv(_quic_backend.ENV_VAR, "aioquic")
    assert _quic_backend.get_backend().name == "aioquic"
    monkeypatch.setenv(_quic_backend.ENV_VAR, "nope")
    with pytest.raises(ConfigError, match="unknown QUIC backend"):
        _quic_backend.get_backend()
    with pytest.raises(ConfigError):
        set_backend("nope")
    try:
        set_backend("aioquic")  # code wins over the environment
        assert _quic_backend.get_backend().name == "aioquic"
    finally:
        set_backend(None)


def test_missing_backend_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without qh3 installed (simulated): the module imports, aioquic is chosen
    automatically, asking for qh3 is a clear ConfigError saying how to install it."""
    import sys

    monkeypatch.setitem(sys.modules, "qh3", None)  # `import qh3` now raises ImportError
    monkeypatch.setattr(_quic_backend, "_cache", {})
    monkeypatch.delenv(_quic_backend.ENV_VAR, raising=False)
    assert _quic_backend.available() == ["aioquic"]
    assert _quic_backend.get_backend().name == "aioquic"
    monkeypatch.setenv(_quic_backend.ENV_VAR, "qh3")
    with pytest.raises(ConfigError, match="pip install qh3"):
        _quic_backend.get_backend()


def test_withheld_stream_credit_never_drops_below_what_was_advertised() -> None:
    """aioquic sets a limit's ``sent`` to 0 when the MAX_STREAMS frame carrying it is lost (to
    send it again). Withholding credit then must not lower the limit below what the peer was
    already granted: its next stream would be a STREAM_LIMIT_ERROR."""
    from types import SimpleNamespace

    from aioquic.quic.connection import Limit

    backend = _quic_backend.get_backend("aioquic")
    limit = Limit(frame_type=0x13, name="max_streams_uni", value=128)
    quic = SimpleNamespace(_local_max_streams_uni=limit)
    backend.withhold_credit(quic, False, 0)  # a transmit advertised 128
    limit.value = 130  # two streams finished: the library grants two more
    limit.sent = 0  # ... and the packet that carried 128 was lost
    withheld = backend.withhold_credit(quic, True, 0)
    assert limit.value == 128 and withheld == 2
    assert backend.withhold_credit(quic, False, withheld) == 0 and limit.value == 130
