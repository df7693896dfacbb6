"""The ACK Frequency extension on real QUIC connections over UDP loopback: two nodes negotiate it
and the file's sender processes fewer ACK frames than without it; a bare aioquic peer (which
knows nothing of it) is never sent a frame; a frame or a transport parameter outside the bounds
closes the connection with the documented QUIC error and is counted; and a peer that never
acknowledges path MTU probes leaves the path at 1,200 bytes while the other direction grows."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import run
from test_quic_pmtud import BareServer, _frame, _relayed_pair

from iac.errors import IacError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.testing import Impairment, UdpRelay, eventually
from iac.transport.base import TransportConfig
from iac.transport.quic import QuicConn, backend, dial_quic, listen_quic
from iac.transport.quic.ackfreq import (
    FRAME_ENCODING_ERROR,
    MAX_THRESHOLD,
    TOTALS,
    AckFrequencyFrame,
    encode_min_ack_delay,
)
from iac.transport.quic.backend import get_backend
from iac.transport.quic.configuration import client_configuration
from iac.transport.quic.pmtud import BASE_PLPMTU, MAX_PROBES
from iac.transport.quic.protocol import protocol_class
from iac.wire.identity import Identity


async def _send_file(size: int, config: TransportConfig) -> tuple[int, QuicConn, QuicConn]:
    """ACK frames the sender processed during one ``send_file`` of ``size`` bytes over a path of
    10 ms each way (the relay), and both ends' connections (the file arrived intact)."""
    d = Path(tempfile.mkdtemp(prefix="iacaf-"))
    try:
        data = os.urandom(size)
        src = d / "f.bin"
        src.write_bytes(data)
        rx_cfg = NodeConfig(inbox_dir=d / "in", transport=config)
        async with (
            Node(listen=["quic://127.0.0.1:0"], config=rx_cfg) as rx,
            Node(config=NodeConfig(transport=config)) as tx,
        ):
            port = int(rx.addresses[0].rsplit(":", 1)[1])
            relay = UdpRelay(("127.0.0.1", port), seed=17)
            relay.set_impairment(Impairment(delay=0.01), Impairment(delay=0.01))
            host, rport = await relay.start()
            try:
                tx.add_peer(rx.agent_id, f"quic://{host}:{rport}")
                await tx.connect(rx.agent_id)
                conn, peer = tx.connection(rx.agent_id), rx.connection(tx.agent_id)
                assert isinstance(conn, QuicConn) and isinstance(peer, QuicConn)
                hook = conn.backend.ack_counter
                assert hook is not None
                acks = hook(conn.quic)
                res = await tx.send_file(rx.agent_id, src, timeout=30)
                assert res.sha256 == hashlib.sha256(data).hexdigest()
                assert (d / "in" / "f.bin").read_bytes() == data
                return acks(), conn, peer
            finally:
                await relay.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_two_nodes_negotiate_and_the_sender_processes_fewer_acks() -> None:
    size = 3 << 20

    async def main() -> None:
        # at 1,472-byte packets (a 1,500-byte path): with 16,384-byte ones the whole file is ~200
        # packets, and the library's own rule already sends few ACKs
        sized = TransportConfig(quic_max_datagram_size=1472)
        on, conn, peer = await _send_file(size, sized)
        sender, receiver = conn.ack_frequency, peer.ack_frequency
        assert sender is not None and receiver is not None
        assert sender.negotiated and receiver.negotiated
        assert sender.stats.frames_sent >= 1 and receiver.receiver.active
        assert receiver.stats.frames_received >= 1 and receiver.stats.refused_frames == 0
        current = sender.sender.current
        assert current is not None and current.threshold >= 2
        assert 10000 <= current.max_ack_delay_us <= 25000  # a quarter RTT (5 ms here) or 10 ms
        off, conn_off, _ = await _send_file(size, replace(sized, quic_ack_frequency=False))
        assert conn_off.ack_frequency is None
        # over this 20 ms path about a quarter of the ACK frames (the library's own rule
        # acknowledges 1 ms after a packet); a wide margin. (0.7 to 0.95 while a datagram whose
        # STREAM data the library held back without an event was acknowledged at once.)
        assert on < 0.45 * off, (on, off)

    run(main(), timeout=60)


def test_a_bare_aioquic_peer_is_never_sent_a_frame() -> None:
    """IAC's adapter against a plain aioquic server: the server ignores the unknown transport
    parameter and sends none, so no ACK_FREQUENCY or IMMEDIATE_ACK frame is sent (it would be
    an unknown frame to the server: FRAME_ENCODING_ERROR) and every byte arrives."""

    async def main() -> None:
        be = get_backend("aioquic")
        server = await BareServer.start(be)
        port, received, done = server.port, server.received, server.done
        loop = asyncio.get_running_loop()
        qc = client_configuration(TransportConfig(), "127.0.0.1", be)
        proto_cls = protocol_class(be)
        transport, proto = await loop.create_datagram_endpoint(
            lambda: proto_cls(be.QuicConnection(configuration=qc)), remote_addr=("127.0.0.1", port)
        )
        try:
            proto.connect(("127.0.0.1", port))
            await proto.wait_connected()
            af = proto.ackfreq
            assert af is not None and not af.negotiated
            payload = os.urandom(400_000)
            sid = proto.quic.get_next_available_stream_id()
            proto.quic.send_stream_data(sid, payload, end_stream=True)
            proto.transmit()
            await asyncio.wait_for(done.wait(), 10)
            assert bytes(received) == payload
            pmtu = proto.pmtu
            assert pmtu is not None
            await eventually(lambda: pmtu.path.stats.probes_acked >= 1, timeout=5)  # PING probes
            assert af.stats.frames_sent == 0 and not af.receiver.active
        finally:
            proto.quic.close()
            proto.transmit()
            transport.close()
            server.close()

    run(main())


async def _pair(config: TransportConfig) -> tuple[Any, QuicConn, QuicConn]:
    accepted: list[QuicConn] = []

    async def on_conn(conn: Any) -> None:
        accepted.append(conn)

    listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn, config=config)
    conn = await dial_quic(listener.addresses[0], Identity.generate(), config=config)
    assert isinstance(conn, QuicConn)
    await eventually(lambda: accepted)
    return listener, conn, accepted[0]


@pytest.mark.parametrize(
    "frame",
    [
        AckFrequencyFrame(100, MAX_THRESHOLD + 1, 25000, 3),
        AckFrequencyFrame(100, 10, 25000, MAX_THRESHOLD + 1),
        AckFrequencyFrame(100, 10, (1 << 14) * 1000, 3),
    ],
)
def test_a_frame_out_of_bounds_closes_with_frame_encoding_error(frame: AckFrequencyFrame) -> None:
    async def main() -> None:
        listener, conn, peer = await _pair(TransportConfig())
        try:
            af, peer_af = conn.ack_frequency, peer.ack_frequency
            assert af is not None and peer_af is not None and af.negotiated
            before = TOTALS.refused_frames
            once = [frame]  # a peer that ignores the bounds, once
            af.sender.poll = lambda *args: once.pop() if once else None  # type: ignore[method-assign]
            af.look()  # at the next packet built, not only once the window or the RTT moved
            await conn.send(_frame(conn, b"x" * 2000))
            await asyncio.wait_for(peer.wait_closed(), 5)
            await asyncio.wait_for(conn.wait_closed(), 5)
            assert peer_af.stats.refused_frames == 1 and TOTALS.refused_frames == before + 1
            assert peer_af.receiver.sequence != frame.sequence, "the refused frame was not applied"
            err = conn.close_error
            assert isinstance(err, IacError) and f"0x{FRAME_ENCODING_ERROR:x}" in str(err), err
        finally:
            await conn.close()
            await listener.close()

    run(main())


def test_a_min_ack_delay_above_max_ack_delay_fails_the_handshake(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async def on_conn(conn: Any) -> None:
            raise AssertionError("the handshake must fail")

        listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn)
        try:
            before = TOTALS.refused_parameters
            # what the dialer sends: 30 ms, above its own max_ack_delay (25 ms)
            monkeypatch.setattr(backend, "encode_min_ack_delay", lambda: encode_min_ack_delay(30000))
            config = TransportConfig(handshake_timeout=3.0)
            with pytest.raises(IacError) as caught:
                await dial_quic(listener.addresses[0], Identity.generate(), config=config)
            assert TOTALS.refused_parameters == before + 1
            assert "0x8" in str(caught.value) or "TRANSPORT_PARAMETER" in str(caught.value), caught.value
        finally:
            await listener.close()

    run(main(), timeout=20)


def test_a_peer_that_never_acknowledges_probes_leaves_the_path_at_1200() -> None:
    """Upstream (dialer to listener) the path drops every datagram over 1,200 bytes of payload, so
    the listener never acknowledges the dialer's probes; downstream it carries 1,472 (an emulated
    1,500-byte path). The dialer's
    packets stay at 1,200 bytes, the listener's grow, and data moves both ways."""

    async def main() -> None:
        accepted: list[QuicConn] = []

        async def on_conn(conn: Any) -> None:
            accepted.append(conn)

        listener = await listen_quic("quic://127.0.0.1:0", Identity.generate(), on_conn)
        port = int(listener.addresses[0].rsplit(":", 1)[1])
        relay = UdpRelay(("127.0.0.1", port), seed=13)
        relay.set_impairment(Impairment(mtu=BASE_PLPMTU + 28), Impairment(mtu=1500))
        host, rport = await relay.start()
        conn = await dial_quic(f"quic://{host}:{rport}", Identity.generate())
        assert isinstance(conn, QuicConn)
        try:
            await eventually(lambda: accepted)
            peer = accepted[0]
            pmtu, peer_pmtu = conn.path_mtu, peer.path_mtu
            assert pmtu is not None and peer_pmtu is not None
            af = conn.ack_frequency
            assert af is not None and af.negotiated
            await eventually(lambda: pmtu.path.state == "complete", timeout=10)
            await eventually(lambda: peer_pmtu.mtu == 1472, timeout=10)
            assert pmtu.mtu == BASE_PLPMTU and pmtu.path.stats.probes_acked == 0
            assert pmtu.path.stats.probes_lost >= MAX_PROBES
            await conn.send(_frame(conn, os.urandom(60_000)))
            got = await asyncio.wait_for(peer.recv(), 10)
            assert got is not None
            await peer.send(_frame(peer, os.urandom(60_000)))
            assert await asyncio.wait_for(conn.recv(), 10) is not None
            assert relay.stats.dropped_mtu >= MAX_PROBES
        finally:
            await conn.close()
            await listener.close()
            await relay.close()

    run(main(), timeout=40)


def test_a_loss_probe_carries_immediate_ack_to_a_peer_that_negotiated() -> None:
    """The dialer's ACKs stop coming back (the relay drops everything downstream): its probe
    timeout fires and the probe it sends carries IMMEDIATE_ACK, not PING; the listener counts
    it. Path MTU discovery is off, so no PMTU probe (which carries IMMEDIATE_ACK too) counts."""

    async def main() -> None:
        listener, relay, conn, accepted = await _relayed_pair(TransportConfig(quic_pmtud=False))
        try:
            await eventually(lambda: accepted)
            af, peer_af = conn.ack_frequency, accepted[0].ack_frequency
            assert af is not None and peer_af is not None and af.negotiated
            assert af.stats.probes_immediate == 0
            before = peer_af.stats.immediate_acks_received
            relay.set_impairment(Impairment(), Impairment(loss=1.0))  # no ACK reaches the dialer
            await conn.send(_frame(conn, b"x" * 100))
            await eventually(lambda: af.stats.probes_immediate >= 1, timeout=5)
            relay.set_impairment(Impairment(), Impairment())
            await eventually(lambda: peer_af.stats.immediate_acks_received > before, timeout=5)
            await conn.close()
        finally:
            await relay.close()
            await listener.close()

    run(main(), timeout=30)


def test_the_command_line_turns_ack_frequency_off() -> None:
    import argparse

    from iac.cli.options import add_transport_options, transport_config

    p = argparse.ArgumentParser()
    add_transport_options(p)
    assert transport_config(p.parse_args([])).quic_ack_frequency is True
    assert transport_config(p.parse_args(["--no-quic-ack-frequency"])).quic_ack_frequency is False
