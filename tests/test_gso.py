"""UDP segmentation offload (iac.transport.quic.gso): flushes grouped into trains, a train of
same-size datagrams leaving in one sendmsg with the UDP_SEGMENT control message and arriving
as separate datagrams, a failed setsockopt or sendmsg taking the plain path, and a QUIC
connection sending its flushes as trains."""

from __future__ import annotations

import asyncio
import errno
import importlib.util
import os
import socket
import struct
import sys
from typing import Any

import pytest
from conftest import run
from test_quic_pmtud import _frame

import iac.transport.quic.gso as gso
import iac.transport.quic.protocol as quic_protocol
from iac.testing import eventually
from iac.transport.base import TransportConfig
from iac.transport.quic import QuicConn, dial_quic, listen_quic
from iac.wire.identity import Identity

linux_only = pytest.mark.skipif(not gso.supported(), reason="the kernel has no UDP_SEGMENT")


def test_trains_group_same_size_runs_to_one_address() -> None:
    a, b = ("10.0.0.1", 1), ("10.0.0.2", 2)
    d = [(b"x" * 1200, a)] * 3 + [(b"y" * 500, a), (b"z" * 1200, a), (b"w" * 1200, b), (b"v" * 1300, b)]
    got = [([len(s) for s in segs], addr) for segs, addr in gso.trains(d)]
    # a shorter datagram ends a train; a new address or a larger datagram starts one
    assert got == [([1200, 1200, 1200, 500], a), ([1200], a), ([1200], b), ([1300], b)]
    many = [(b"x" * 1472, a)] * 100
    sizes = [len(segs) for segs, _ in gso.trains(many)]
    assert sum(sizes) == 100 and max(sizes) * 1472 <= gso.MAX_TRAIN_BYTES
    assert all(n <= gso.MAX_SEGMENTS for n in sizes)
    assert gso.trains([]) == []


def test_probe_says_no_when_setsockopt_fails() -> None:
    class Refusing:
        def __init__(self, *args: Any) -> None:
            pass

        def __enter__(self) -> Refusing:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def setsockopt(self, *args: Any) -> None:
            raise OSError(errno.ENOPROTOOPT, "Protocol not available")

    assert gso.probe(Refusing) is False
    if sys.platform.startswith("linux"):
        assert gso.probe(socket.socket) is gso.supported()


class CountingSocket:
    """The raw socket, with every sendmsg recorded (and, on request, refused)."""

    def __init__(self, sock: Any, fail: int | None = None) -> None:
        self.sock = sock
        self.fail = fail
        self.calls: list[tuple[int, list[Any]]] = []

    def sendmsg(self, buffers: list[bytes], ancdata: list[Any], flags: int, addr: Any) -> int:
        self.calls.append((sum(len(b) for b in buffers), ancdata))
        if self.fail is not None:
            raise OSError(self.fail, os.strerror(self.fail))
        return int(self.sock.sendmsg(buffers, ancdata, flags, addr))


async def _pair() -> tuple[socket.socket, asyncio.DatagramTransport, Any]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
    raw = transport.get_extra_info("socket")
    return rx, transport, socket.socket(fileno=os.dup(raw.fileno()))


async def _receive(rx: socket.socket, n: int) -> list[bytes]:
    loop = asyncio.get_running_loop()
    out: list[bytes] = []
    while len(out) < n:
        out.append(await asyncio.wait_for(loop.sock_recv(rx, 65536), 5))
    return out


@linux_only
def test_a_train_leaves_in_one_sendmsg_and_arrives_as_datagrams() -> None:
    async def main() -> None:
        rx, transport, sock = await _pair()
        try:
            counting = CountingSocket(sock)
            sender = gso.GsoSender(counting, transport)
            dest = rx.getsockname()
            datagrams = [bytes([i]) * 1200 for i in range(5)] + [b"t" * 333]
            for d in datagrams:
                sender.sendto(d, dest)
            sender.flush()
            assert len(counting.calls) == 1
            total, ancdata = counting.calls[0]
            assert total == 5 * 1200 + 333
            assert ancdata == [(socket.SOL_UDP, gso.UDP_SEGMENT, struct.pack("=H", 1200))]
            assert await _receive(rx, 6) == datagrams  # cut by the kernel, in order
            assert sender.stats.trains == 1 and sender.stats.segments == 6 and sender.stats.plain == 0
            sender.sendto(b"alone", dest)  # a single datagram: a plain send
            sender.flush()
            assert len(counting.calls) == 1 and sender.stats.plain == 1
            assert await _receive(rx, 1) == [b"alone"]
        finally:
            transport.close()
            sock.close()
            rx.close()

    run(main())


@linux_only
def test_a_failed_sendmsg_takes_the_plain_path_for_good() -> None:
    async def main() -> None:
        rx, transport, sock = await _pair()
        try:
            counting = CountingSocket(sock, fail=errno.EIO)  # a device without checksum offload
            sender = gso.GsoSender(counting, transport)
            dest = rx.getsockname()
            datagrams = [bytes([i]) * 1000 for i in range(4)]
            for d in datagrams:
                sender.sendto(d, dest)
            sender.flush()
            assert len(counting.calls) == 1 and sender.stats.failures == 1
            assert not sender.enabled and sender.error is not None and sender.error.errno == errno.EIO
            assert await _receive(rx, 4) == datagrams  # nothing lost: sent one by one
            for d in datagrams:
                sender.sendto(d, dest)
            sender.flush()
            assert len(counting.calls) == 1, "no sendmsg once GSO is off"
            assert sender.stats.plain == 8
            assert await _receive(rx, 4) == datagrams
        finally:
            transport.close()
            sock.close()
            rx.close()

    run(main())


async def _transfer(config: TransportConfig) -> QuicConn:
    accepted: list[QuicConn] = []

    async def on_conn(conn: Any) -> None:
        accepted.append(conn)

    listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn, config=config)
    conn = await dial_quic(listener.addresses[0], Identity.generate(), config=config)
    assert isinstance(conn, QuicConn)
    try:
        await eventually(lambda: accepted)
        await conn.send(_frame(conn, os.urandom(400_000)))
        await eventually(lambda: accepted[0].stats.frames_received >= 1, timeout=10)
    finally:
        await conn.close()
        await listener.close()
    return conn


@linux_only
def test_quic_flushes_leave_as_trains() -> None:
    conn = run(_transfer(TransportConfig()))
    sender = conn.gso
    assert sender is not None and sender.stats.trains > 0
    assert sender.stats.segments > 2 * sender.stats.trains  # trains of several datagrams
    assert sender.stats.failures == 0


def test_off_by_config_or_where_the_kernel_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(_transfer(TransportConfig(quic_gso=False))).gso is None
    monkeypatch.setattr(quic_protocol, "supported", lambda: False)
    assert run(_transfer(TransportConfig())).gso is None


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed")
def test_on_uvloop_the_plain_path_carries_the_flushes() -> None:
    """uvloop's transport offers a PseudoSocket whose ``sendmsg`` takes no arguments: a QUIC
    connection on uvloop sends datagram by datagram, and a transfer of many trains arrives."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        conn = runner.run(_transfer(TransportConfig()))
    assert conn.gso is None
