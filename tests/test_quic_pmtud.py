"""Path MTU discovery on real QUIC connections over UDP loopback, through the seeded relay
(iac.testing.UdpRelay) whose ``mtu`` drops larger datagrams silently: with the default ceiling
a loopback path settles at 16,384 bytes and a file arrives, an emulated 1,500-byte path at
1,472 (packets grow after the probe), packets stay at 1,200 bytes when probing is off or the
path carries no more, fall back to 1,200 when the path's MTU drops in the middle of a file
transfer (the file still arrives), a bare aioquic peer (which never probes) takes the probes
and the larger packets, and a ceiling above what aioquic can fill is held to 16,384."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from conftest import run

from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.protocol.handshake import ALPN
from iac.testing import Impairment, UdpRelay, eventually
from iac.transport.base import TransportConfig
from iac.transport.certs import node_certificate
from iac.transport.quic import QuicConn, dial_quic, listen_quic
from iac.transport.quic.backend import AIOQUIC_LARGEST_DATAGRAM, get_backend
from iac.transport.quic.configuration import client_configuration
from iac.transport.quic.pmtud import BASE_PLPMTU, DEFAULT_MAX_PLPMTU, MAX_PROBES
from iac.transport.quic.protocol import protocol_class
from iac.wire.identity import Identity

LOOPBACK = "quic://127.0.0.1:0"


async def _relayed_pair(
    config: TransportConfig, impairment: Impairment | None = None
) -> tuple[Any, UdpRelay, QuicConn, list[QuicConn]]:
    accepted: list[QuicConn] = []

    async def on_conn(conn: Any) -> None:
        accepted.append(conn)

    listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn, config=config)
    port = int(listener.addresses[0].rsplit(":", 1)[1])
    relay = UdpRelay(("127.0.0.1", port), impairment or Impairment(), seed=3)
    host, rport = await relay.start()
    conn = await dial_quic(f"quic://{host}:{rport}", Identity.generate(), config=config)
    assert isinstance(conn, QuicConn)
    return listener, relay, conn, accepted


class BareServer:
    """A plain aioquic server (no IAC adapter) that reads the first stream to its end."""

    def __init__(self, server: Any, received: bytearray, done: asyncio.Event) -> None:
        self.server, self.received, self.done = server, received, done
        self.port: int = server._transport.get_extra_info("sockname")[1]

    @classmethod
    async def start(cls, backend: Any) -> BareServer:
        from aioquic.asyncio import serve
        from aioquic.quic.configuration import QuicConfiguration

        node = node_certificate(Identity.generate().agent_id, None, None)
        qc = QuicConfiguration(is_client=False, alpn_protocols=[ALPN])
        qc.certificate, qc.private_key, qc.certificate_chain = backend.load_certificates(
            node.chain_pem or node.cert_pem, node.key_pem
        )
        received = bytearray()
        done = asyncio.Event()
        readers: list[asyncio.Future[None]] = []

        def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def read() -> None:
                received.extend(await reader.read())
                done.set()

            readers.append(asyncio.ensure_future(read()))

        server = await serve("127.0.0.1", 0, configuration=qc, stream_handler=handler)
        return cls(server, received, done)

    def close(self) -> None:
        self.server.close()


def test_packets_grow_to_what_the_probe_confirmed() -> None:
    """The default ceiling over an emulated 1,500-byte path: the larger probes are lost
    silently, the 1,472-byte one is acknowledged, and the packets grow to it, no further."""

    async def main() -> None:
        listener, relay, conn, accepted = await _relayed_pair(TransportConfig(), Impairment(mtu=1500))
        try:
            pmtu = conn.path_mtu
            assert pmtu is not None
            await eventually(lambda: pmtu.mtu == 1472, timeout=5)
            await eventually(lambda: accepted and accepted[0].path_mtu and accepted[0].path_mtu.mtu == 1472)
            large_before = relay.stats.forwarded_large
            payload = os.urandom(300_000)
            await conn.send(_frame(conn, payload))
            await eventually(lambda: relay.stats.forwarded_large >= large_before + 150, timeout=5)
            assert relay.stats.largest_forwarded == 1472
            # a loss on the loaded loopback may be confirmed again (a probe acknowledged), never fall back
            assert pmtu.path.stats.probes_acked >= 1 and pmtu.path.stats.fallbacks == 0 and pmtu.mtu == 1472
        finally:
            await conn.close()
            await listener.close()
            await relay.close()

    run(main())


def test_probing_off_or_a_smaller_path_keeps_1200() -> None:
    async def main() -> None:
        off = TransportConfig(quic_pmtud=False)
        listener, relay, conn, _ = await _relayed_pair(off)
        try:
            assert conn.path_mtu is None
            await conn.send(_frame(conn, os.urandom(100_000)))
            await eventually(lambda: relay.stats.forwarded > 80)
            assert relay.stats.largest_forwarded <= BASE_PLPMTU
        finally:
            await conn.close()
            await listener.close()
            await relay.close()
        # the path carries 1,200 bytes of payload and no more: every probe is lost, silently
        listener, relay, conn, _ = await _relayed_pair_with_mtu(BASE_PLPMTU + 28)
        try:
            pmtu = conn.path_mtu
            assert pmtu is not None
            await eventually(lambda: pmtu.path.state == "complete", timeout=10)
            assert pmtu.mtu == BASE_PLPMTU
            assert pmtu.path.stats.probes_lost >= MAX_PROBES and pmtu.path.stats.probes_acked == 0
            await conn.send(_frame(conn, os.urandom(50_000)))  # the connection still works
            await eventually(lambda: relay.stats.forwarded > 50)
            assert relay.stats.largest_forwarded <= BASE_PLPMTU
        finally:
            await conn.close()
            await listener.close()
            await relay.close()

    run(main(), timeout=40)


async def _relayed_pair_with_mtu(mtu: int) -> tuple[Any, UdpRelay, QuicConn, list[QuicConn]]:
    accepted: list[QuicConn] = []

    async def on_conn(conn: Any) -> None:
        accepted.append(conn)

    config = TransportConfig()
    listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn, config=config)
    port = int(listener.addresses[0].rsplit(":", 1)[1])
    relay = UdpRelay(("127.0.0.1", port), Impairment(mtu=mtu), seed=5)
    host, rport = await relay.start()
    conn = await dial_quic(f"quic://{host}:{rport}", Identity.generate(), config=config)
    assert isinstance(conn, QuicConn)
    return listener, relay, conn, accepted


def _frame(conn: QuicConn, payload: bytes) -> bytes:
    from iac.wire._pb.iac_pb2 import MessageType
    from iac.wire.message import Session, build_message, encode_message_frame

    peer = conn.peer.agent_id if conn.peer is not None else ""
    msg = build_message(
        sender=conn.identity.agent_id,
        to=peer,
        msg_type=MessageType.COMMAND,
        session=Session(),
        timestamp_us=0,
        payload_json="",
        extra_data=payload,
    )
    return encode_message_frame(conn.identity, msg)


def test_mtu_drop_mid_transfer_falls_back_and_the_file_arrives() -> None:
    size = 6 << 20

    async def main() -> None:
        d = Path(tempfile.mkdtemp(prefix="iacp-"))
        try:
            data = os.urandom(size)
            src = d / "f.bin"
            src.write_bytes(data)
            cfg = TransportConfig(quic_max_datagram_size=1472)  # the path's MTU starts at 1,500
            async with (
                Node(
                    listen=["quic://127.0.0.1:0"], config=NodeConfig(inbox_dir=d / "in", transport=cfg)
                ) as rx,
                Node(config=NodeConfig(transport=cfg)) as tx,
            ):
                port = int(rx.addresses[0].rsplit(":", 1)[1])
                relay = UdpRelay(("127.0.0.1", port), seed=9)
                host, rport = await relay.start()
                try:
                    tx.add_peer(rx.agent_id, f"quic://{host}:{rport}")
                    await tx.connect(rx.agent_id)
                    conn = tx.connection(rx.agent_id)
                    assert isinstance(conn, QuicConn) and conn.path_mtu is not None
                    pmtu = conn.path_mtu
                    await eventually(lambda: pmtu.mtu == 1472, timeout=5)
                    loop = asyncio.get_running_loop()
                    sending = asyncio.ensure_future(tx.send_file(rx.agent_id, src, timeout=20))
                    # a fifth of the file went through in large packets: the path's MTU drops
                    await eventually(lambda: relay.stats.forwarded_large * 1400 >= size // 5, interval=0.001)
                    assert not sending.done()
                    relay.set_impairment(Impairment(mtu=1280))  # 1,252 bytes of UDP payload
                    lowered = [loop.time()]
                    res = await sending
                    assert res.sha256 == hashlib.sha256(data).hexdigest()
                    assert (d / "in" / "f.bin").read_bytes() == data
                    st = pmtu.path.stats
                    assert relay.stats.dropped_mtu > 0
                    assert st.fallbacks == 1, (lowered, st, pmtu.changes, relay.stats, sending)
                    assert st.fallbacks == 1 and st.suspected_at is not None and st.fell_back_at is not None
                    assert pmtu.changes[-1][1] == BASE_PLPMTU and pmtu.mtu == BASE_PLPMTU
                    # the first large loss is noticed soon after the drop, and the fall back
                    # takes at most MAX_PROBES probe timeouts from there
                    assert 0 < st.suspected_at - lowered[0] < 2.0
                    assert st.fell_back_at - st.suspected_at <= MAX_PROBES * st.longest_timeout + 0.05
                    assert conn is tx.connection(rx.agent_id), "the same connection throughout"
                finally:
                    await relay.close()
        finally:
            shutil.rmtree(d, ignore_errors=True)

    run(main(), timeout=60)


def test_bare_aioquic_peer_takes_probes_and_large_packets() -> None:
    """IAC's QUIC adapter (its asyncio protocol, with path MTU discovery) against a plain
    aioquic server that never probes and advertises no max_udp_payload_size: the adapter's
    probe is acknowledged, its packets grow, and the server gets every byte."""

    async def main() -> None:
        backend = get_backend("aioquic")
        server = await BareServer.start(backend)
        port, received, done = server.port, server.received, server.done
        relay = UdpRelay(("127.0.0.1", port), seed=11)
        host, rport = await relay.start()
        loop = asyncio.get_running_loop()
        qc = client_configuration(TransportConfig(), host, backend)
        proto_cls = protocol_class(backend)
        transport, proto = await loop.create_datagram_endpoint(
            lambda: proto_cls(backend.QuicConnection(configuration=qc)), remote_addr=(host, rport)
        )
        try:
            proto.connect((host, rport))
            await proto.wait_connected()
            pmtu = proto.pmtu
            assert pmtu is not None
            proto.transmit()
            await eventually(lambda: pmtu.mtu == DEFAULT_MAX_PLPMTU, timeout=5)
            payload = os.urandom(500_000)
            sid = proto.quic.get_next_available_stream_id()
            proto.quic.send_stream_data(sid, payload, end_stream=True)
            proto.transmit()
            await asyncio.wait_for(done.wait(), 10)
            assert bytes(received) == payload
            assert relay.stats.largest_forwarded == DEFAULT_MAX_PLPMTU
            assert relay.stats.forwarded_large >= len(payload) // DEFAULT_MAX_PLPMTU
        finally:
            proto.quic.close()
            proto.transmit()
            transport.close()
            server.close()
            await relay.close()

    run(main())


def test_loopback_settles_at_the_default_ceiling_and_a_file_arrives() -> None:
    """Two nodes on loopback with the default configuration: one probe, 16,384-byte packets
    both ways, and a file sent over them arrives whole; a ceiling above what aioquic can fill
    (65,527) is held to 16,384 (larger packets would carry corrupt STREAM frames)."""
    size = 2 << 20

    async def main(ceiling: int | None) -> None:
        d = Path(tempfile.mkdtemp(prefix="iacp-"))
        try:
            data = os.urandom(size)
            (d / "f.bin").write_bytes(data)
            cfg = TransportConfig() if ceiling is None else TransportConfig(quic_max_datagram_size=ceiling)
            async with (
                Node(listen=[LOOPBACK], config=NodeConfig(inbox_dir=d / "in", transport=cfg)) as rx,
                Node(config=NodeConfig(transport=cfg)) as tx,
            ):
                tx.add_peer(rx.agent_id, *rx.addresses)
                await tx.connect(rx.agent_id)
                conn = tx.connection(rx.agent_id)
                assert isinstance(conn, QuicConn) and conn.path_mtu is not None
                pmtu = conn.path_mtu
                await eventually(lambda: pmtu.path.state == "complete", timeout=5)
                assert pmtu.mtu == AIOQUIC_LARGEST_DATAGRAM == DEFAULT_MAX_PLPMTU
                assert pmtu.path.stats.probes_sent == 1 and pmtu.path.stats.probes_lost == 0
                res = await tx.send_file(rx.agent_id, d / "f.bin", timeout=20)
                assert res.sha256 == hashlib.sha256(data).hexdigest()
                assert (d / "in" / "f.bin").read_bytes() == data
                assert pmtu.mtu == DEFAULT_MAX_PLPMTU and pmtu.path.stats.fallbacks == 0
        finally:
            shutil.rmtree(d, ignore_errors=True)

    run(main(None), timeout=30)
    run(main(65527), timeout=30)


def test_padding_runs_are_skipped_where_the_library_stops() -> None:
    """The adapter's PADDING handler (one step for a probe's 16 KB of zeros) leaves the buffer
    where aioquic's own byte-by-byte handler does, for runs that end in a frame or the packet."""
    from aioquic._buffer import Buffer

    backend = get_backend("aioquic")
    assert backend.fast_padding is not None
    quic = backend.QuicConnection(configuration=backend.QuicConfiguration(is_client=True))
    library = quic._handle_padding_frame
    backend.fast_padding(quic)
    ours = quic._QuicConnection__frame_handlers[0x00][0]
    assert ours is not library
    for data in (bytes(16383), bytes(10) + b"\x01" + bytes(5), b"\x01", b"", bytes(3) + b"\x08\x00"):
        ends = []
        for handler in (library, ours):
            buf = Buffer(data=b"\x00" + data)
            buf.seek(1)  # the frame type, read by the library before it calls the handler
            handler(None, 0x00, buf)
            ends.append(buf.tell())
        assert ends[0] == ends[1], (data[:12], ends)


def test_a_larger_datagram_size_recalculates_the_initial_window() -> None:
    """RFC 9002 section 7.2: once packets may grow to 16,384 bytes the congestion window is at
    least the initial window for that size (2 packets, 32,768 bytes), not aioquic's ten
    1,200-byte packets (less than one packet); a window already larger and a smaller size
    leave it alone."""
    backend = get_backend("aioquic")
    hooks = backend.pmtu
    assert hooks is not None
    quic = backend.QuicConnection(configuration=backend.QuicConfiguration(is_client=True))
    cc = quic._loss._cc
    assert cc.congestion_window == 12000
    hooks.set_datagram_size(quic, 16384)
    assert cc.congestion_window == 32768 and quic._max_datagram_size == 16384
    hooks.set_datagram_size(quic, 1200)  # a fall back: the controller's own reaction to the loss holds
    assert cc.congestion_window == 32768
    cc.congestion_window = 500_000
    hooks.set_datagram_size(quic, 16384)
    assert cc.congestion_window == 500_000
