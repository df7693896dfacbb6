"""Cases of the QUIC mapping beyond the happy path: the control stream after the handshake,
other bidirectional streams, a FIN on the control stream, a stream reset inside a frame,
stateless resets (answered, and a forged one ignored), an ACK_FREQUENCY frame out of bounds."""

from __future__ import annotations

import asyncio
import os
import time

from iac.conformance.cases import closed_with
from iac.conformance.link import QuicLink
from iac.conformance.peer import NoAnswer, Peer, answers
from iac.conformance.target import Failed, Outcome, Target, case, check, describe
from iac.errors import CloseCode
from iac.transport.base import parse_address
from iac.transport.quic.ackfreq import (
    ACK_FREQUENCY,
    FRAME_ENCODING_ERROR,
    MAX_THRESHOLD,
    AckFrequencyFrame,
)
from iac.transport.quic.ackfreq import encode_frame as encode_ack_frequency
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.message import sign_message


def _quic(peer: Peer) -> QuicLink:
    if not isinstance(peer.link, QuicLink):
        raise Failed("a QUIC case on a connection that is not QUIC")
    return peer.link


async def _quic_then_ping(t: Target, peer: Peer) -> Outcome:
    _, got = await peer.request(t.to, MessageType.PING, t.deadline())
    return check(
        "REPLY to a PING on a new stream", describe(got).split(" ")[0] + " to a PING on a new stream"
    )


@case(
    "quic.control_message",
    "7 QUIC mapping",
    "A MESSAGE on the control stream after the handshake is taken like one on a unidirectional stream",
    ("quic",),
)
async def _quic_control_message(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    await peer.send_raw(encode_frame(FrameType.MESSAGE, sign_message(peer.identity, msg)), control=True)
    got = await peer.message(t.deadline(), lambda m: answers(m, msg))
    return check("REPLY", describe(got).split(" ")[0])


@case(
    "quic.bidi_stream",
    "7 QUIC mapping",
    "A bidirectional stream other than 0 is a protocol error: the receiver MUST close with "
    "`0x01 PROTOCOL_ERROR`",
    ("quic",),
)
async def _quic_bidi(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    await _quic(peer).send_on_new_bidi(encode_frame(FrameType.MESSAGE, sign_message(peer.identity, msg)))
    return await closed_with(t, peer, CloseCode.PROTOCOL_ERROR)


@case(
    "quic.control_fin",
    "7 QUIC mapping",
    "A FIN on the control stream between frames ends only that direction of the stream, not the connection",
    ("quic",),
)
async def _quic_control_fin(t: Target) -> Outcome:
    peer = await t.session()
    peer.link.end_sending()
    return await _quic_then_ping(t, peer)


@case(
    "quic.reset_stream",
    "7 QUIC mapping",
    "A unidirectional stream reset (RESET_STREAM) inside a frame loses that frame only: the receiver "
    "discards it and MUST keep the connection",
    ("quic",),
)
async def _quic_reset(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    await _quic(peer).send_and_reset(encode_frame(FrameType.MESSAGE, sign_message(peer.identity, msg))[:20])
    return await _quic_then_ping(t, peer)


class _FirstDatagram(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: object) -> None:
        if not self.got.done():
            self.got.set_result(data)


#: The packet the reset cases send: a short header (0b01...) and 59 random bytes.
_TRIGGER = 60


@case(
    "quic.stateless_reset",
    "7 Stateless reset",
    "a listener MUST answer a short-header packet of at least 22 bytes for a connection ID it does "
    "not know with a stateless reset shorter than that packet",
    ("quic",),
)
async def _quic_stateless_reset(t: Target) -> Outcome:
    addr = parse_address(t.url)
    loop = asyncio.get_running_loop()
    udp, proto = await loop.create_datagram_endpoint(_FirstDatagram, remote_addr=(addr.host, addr.port))
    try:
        udp.sendto(bytes([0x40 | (os.urandom(1)[0] & 0x3F)]) + os.urandom(_TRIGGER - 1))
        try:
            got = await asyncio.wait_for(proto.got, max(t.deadline() - time.monotonic(), 0.01))
        except TimeoutError:
            return check("a stateless reset", "no answer")
    finally:
        udp.close()
    ok = 21 <= len(got) < _TRIGGER and got[0] & 0xC0 == 0x40
    seen = "a stateless reset" if ok else f"{len(got)} bytes, first byte 0x{got[0]:02x}"
    return check("a stateless reset", seen)


@case(
    "quic.forged_reset",
    "7 Stateless reset",
    "An endpoint MUST treat a datagram as a stateless reset only when it cannot be a packet of the "
    "connection",
    ("quic",),
)
async def _quic_forged_reset(t: Target) -> Outcome:
    peer = await t.session()
    link = _quic(peer)
    if link.udp is None:
        raise Failed("a dialed QUIC link without a socket of its own")
    addr = parse_address(t.url)
    # from the connection's own socket: shaped like a reset, with a token nobody issued
    forged = bytes([0x40 | (os.urandom(1)[0] & 0x3F)]) + os.urandom(_TRIGGER - 1)
    link.udp.sendto(forged, (addr.host, addr.port))  # type: ignore[attr-defined]
    return await _quic_then_ping(t, peer)


@case(
    "quic.ack_frequency_bounds",
    "7 ACK frequency (this implementation)",
    "a threshold or reordering threshold above 1,024, or a requested max ack delay of 2^14 ms or "
    "more (RFC 9000's bound on `max_ack_delay`), with FRAME_ENCODING_ERROR",
    ("quic",),
)
async def _quic_ack_frequency_bounds(t: Target) -> Outcome:
    """An ACK_FREQUENCY frame whose ack-eliciting threshold is above 1,024. An implementation
    without the extension closes with FRAME_ENCODING_ERROR too (RFC 9000 section 12.4: an
    unknown frame type), so the expectation is the same either way."""
    peer = await t.session()
    link = _quic(peer)
    frame = AckFrequencyFrame(0, MAX_THRESHOLD + 1, 25000, 3)
    await link.send_quic_frame(ACK_FREQUENCY, encode_ack_frequency(frame))
    want = f"QUIC close 0x{FRAME_ENCODING_ERROR:02x} FRAME_ENCODING_ERROR"
    try:
        closed = await peer.close_seen(t.deadline())
    except NoAnswer:
        link.close()
        return Outcome(False, want, f"no close in {t.timeout:g} s")
    link.close()
    code = link.transport_error
    if code is None:
        return Outcome(False, want, closed.describe())
    return Outcome(code == FRAME_ENCODING_ERROR, want, f"QUIC close 0x{code:02x} ({closed.reason[:80]})")


__all__: list[str] = []


@case(
    "quic.control_reset",
    "7 QUIC versions, streams and parameters",
    "A reset of the control stream (RESET_STREAM on stream 0) loses the frame it cut and ends that "
    "direction of the control stream only: the receiver MUST keep taking messages on unidirectional "
    "streams",
    ("quic",),
)
async def _quic_control_reset(t: Target) -> Outcome:
    peer = await t.session()
    msg = peer.build(t.to, MessageType.PING, deadline_s=t.timeout)
    frame = encode_frame(FrameType.MESSAGE, sign_message(peer.identity, msg))
    await _quic(peer).send_and_reset_control(frame[:20])
    return await _quic_then_ping(t, peer)


@case(
    "quic.parameters",
    "7 QUIC versions, streams and parameters",
    "A server MUST announce `initial_max_streams_bidi` of at least 1 (the control stream) and each "
    "side MUST announce `initial_max_streams_uni` of at least 1 … QUIC version 1",
    ("quic",),
)
async def _quic_parameters(t: Target) -> Outcome:
    d = await t.dial()
    if d.closed is not None:
        raise Failed(f"the handshake was refused: {d.closed.describe()}")
    p = _quic(d.peer).announced
    idle = p.get("max_idle_timeout")
    seen = (
        f"QUIC version 0x{int(p.get('version') or 0):x}, initial_max_streams_bidi "
        f"{p.get('initial_max_streams_bidi')}, initial_max_streams_uni {p.get('initial_max_streams_uni')} "
        f"(max_idle_timeout {'none' if not idle else f'{idle:g} s'}, "
        f"initial_max_data {p.get('initial_max_data')})"
    )
    ok = (
        p.get("version") in (1, 0x6B3343CF)  # version 1, or version 2 negotiated compatibly
        and int(p.get("initial_max_streams_bidi") or 0) >= 1
        and int(p.get("initial_max_streams_uni") or 0) >= 1
    )
    return Outcome(ok, "QUIC version 1 (or 2), at least 1 bidirectional and 1 unidirectional stream", seen)
