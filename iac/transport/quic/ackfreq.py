"""The QUIC ACK Frequency extension (draft-ietf-quic-ack-frequency) for one connection, sans-IO.

RFC 9000 has a receiver acknowledge at least every second ack-eliciting packet; for bulk data
that is an ACK frame the sender must process for every two packets it sends. With this
extension the *sender* of the data tells the receiver how often it wants acknowledgements:

* Negotiation: each side that can act on the frames sends the transport parameter
  ``min_ack_delay`` (:data:`TP_MIN_ACK_DELAY`, the smallest ACK delay it can keep, in
  microseconds). A side sends ACK_FREQUENCY frames only to a peer that sent the parameter, so a
  peer without the extension never sees one and is acknowledged as RFC 9000 says.
* ACK_FREQUENCY (:data:`ACK_FREQUENCY`): sequence number, ack-eliciting threshold, requested max
  ack delay (microseconds), reordering threshold. The receiver honours the frame with the
  highest sequence number (older ones are stale) and from then on acknowledges once more than
  *threshold* ack-eliciting packets are unacknowledged, or *requested max ack delay* after the
  first of them arrived, whichever comes first; and at once when a gap in the packet numbers
  reaches the reordering threshold (the sender would declare a packet lost: RFC 9002's packet
  threshold), so that loss is still reported without delay.
* IMMEDIATE_ACK (:data:`IMMEDIATE_ACK`): acknowledge the packet carrying it at once (path MTU
  probes carry it: a probe's fate is known one round trip after it left).

The sender's choice (:class:`AckFrequencySender`): a threshold of half the congestion window in
packets (:data:`ACKS_PER_WINDOW`; at least :data:`MIN_THRESHOLD`, at most
:data:`MAX_SENT_THRESHOLD`) and a requested max ack delay of a quarter of the smoothed RTT
(:data:`RTT_FRACTION`; at least 10 ms, :data:`MIN_REQUESTED_DELAY`, and the peer's
``min_ack_delay``; at most the peer's own ``max_ack_delay``, which its probe timeout already
allows for): at least two ACKs per window, or a full window would wait out the delay, and four
per round trip on paths of 40 ms and more. Measured (docs/IMPLEMENTATION.md, "ACK
frequency"): on loopback an eighth of the window acknowledged no less often than the library's
own 1 ms ACK timer did, and the peer's 25 ms ``max_ack_delay`` as the delay made a file transfer
over a 20 ms, 1 %-loss path a fifth slower than without the extension, a quarter RTT did not;
on loopback the delay timer of a quarter RTT (a few milliseconds) sent 53 of the 62 ACK frames
per MB, and the 10 ms floor leaves them to the threshold. The
reordering threshold is :data:`SENT_REORDERING_THRESHOLD`. A new frame goes when the window or
the RTT asks for a threshold or a delay a quarter off the last one and that one is at least a
round trip old, and again when the packet carrying it is lost.

Bounds (what a receiver refuses, :meth:`AckFrequencyReceiver.on_frame`): a requested max ack
delay below the receiver's ``min_ack_delay`` closes the connection with PROTOCOL_VIOLATION (as
the draft says); a threshold or a reordering threshold above :data:`MAX_THRESHOLD`, or a delay
of 2^14 ms or more (RFC 9000's bound on ``max_ack_delay``), with FRAME_ENCODING_ERROR. A
``min_ack_delay`` parameter of 2^24 or more, larger than the peer's ``max_ack_delay``, or of a
length that does not match its value, closes it with TRANSPORT_PARAMETER_ERROR
(:func:`parse_min_ack_delay`). Each refusal is counted (:class:`AckFrequencyStats`).

Time is an argument everywhere; nothing here reads a clock. The library's hooks are in
:mod:`iac.transport.quic.backend` (:class:`~iac.transport.quic.backend.AckFrequencyHooks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

#: The transport parameter ``min_ack_delay`` (microseconds).
TP_MIN_ACK_DELAY = 0xFF04DE1B
#: The ACK_FREQUENCY frame type.
ACK_FREQUENCY = 0xAF
#: The IMMEDIATE_ACK frame type.
IMMEDIATE_ACK = 0x1F
#: The ``min_ack_delay`` this side sends: one millisecond, the granularity of its timers.
MIN_ACK_DELAY_US = 1000
#: ``min_ack_delay`` values from here on are invalid (the draft).
MIN_ACK_DELAY_LIMIT = 1 << 24
#: The largest requested max ack delay a receiver takes, exclusive (RFC 9000's ``max_ack_delay`` bound).
MAX_ACK_DELAY_LIMIT_US = (1 << 14) * 1000
#: The largest ack-eliciting threshold and reordering threshold a receiver takes.
MAX_THRESHOLD = 1024
#: The range of ack-eliciting thresholds a sender asks for.
MIN_THRESHOLD = 2
MAX_SENT_THRESHOLD = 64
#: The ACKs per congestion window a sender asks for (the threshold is the window's packets over it).
ACKS_PER_WINDOW = 2
#: The requested max ack delay as a fraction of the smoothed RTT (at least four ACKs a round trip).
RTT_FRACTION = 0.25
#: The smallest requested max ack delay, seconds (when the peer's ``max_ack_delay`` allows it):
#: on loopback a quarter RTT is a millisecond or two, and that timer, not the threshold, sent
#: nearly every ACK.
MIN_REQUESTED_DELAY = 0.010
#: The reordering threshold a sender asks for (RFC 9002's kPacketThreshold).
SENT_REORDERING_THRESHOLD = 3
#: The requested max ack delay when the peer sent no ``max_ack_delay`` (RFC 9000's default).
DEFAULT_MAX_ACK_DELAY = 0.025

#: QUIC transport error codes of the refusals (RFC 9000 section 20.1).
FRAME_ENCODING_ERROR = 0x07
TRANSPORT_PARAMETER_ERROR = 0x08
PROTOCOL_VIOLATION = 0x0A


@dataclass(frozen=True)
class AckFrequencySettings:
    """A connection's ACK frequency settings (from ``TransportConfig.quic_ack_frequency``)."""

    enabled: bool = True


@dataclass(frozen=True)
class Refused:
    """Why a frame or transport parameter is refused: the QUIC error code and a reason phrase."""

    code: int
    phrase: str


@dataclass(frozen=True)
class AckFrequencyFrame:
    """One ACK_FREQUENCY frame's fields (the delay in microseconds)."""

    sequence: int
    threshold: int
    max_ack_delay_us: int
    reordering: int


@dataclass
class AckFrequencyStats:
    """What the extension did on one connection."""

    frames_sent: int = 0
    frames_received: int = 0
    stale_frames: int = 0
    immediate_acks_received: int = 0
    #: Loss probes that carried IMMEDIATE_ACK instead of PING.
    probes_immediate: int = 0
    #: Frames and transport parameters refused (the connection closed).
    refused_frames: int = 0
    refused_parameters: int = 0


#: The refusals of every connection in this process (a refused transport parameter ends the
#: connection in its handshake, before the application sees it).
TOTALS = AckFrequencyStats()


# --- codec ---------------------------------------------------------------------------------------


def encode_varint(value: int) -> bytes:
    """A QUIC variable-length integer (RFC 9000 section 16)."""
    if value < 0x40:
        return value.to_bytes(1, "big")
    if value < 0x4000:
        return (value | 0x4000).to_bytes(2, "big")
    if value < 0x40000000:
        return (value | 0x80000000).to_bytes(4, "big")
    if value < 0x4000000000000000:
        return (value | 0xC000000000000000).to_bytes(8, "big")
    raise ValueError(f"{value} does not fit a QUIC varint")


def decode_varint(data: bytes, offset: int) -> tuple[int, int]:
    """``(value, next offset)``; ValueError when ``data`` ends inside the integer."""
    if offset >= len(data):
        raise ValueError("truncated varint")
    length = 1 << (data[offset] >> 6)
    if offset + length > len(data):
        raise ValueError("truncated varint")
    value = int.from_bytes(data[offset : offset + length], "big") & ((1 << (8 * length - 2)) - 1)
    return value, offset + length


def encode_min_ack_delay(delay_us: int = MIN_ACK_DELAY_US) -> bytes:
    """The ``min_ack_delay`` transport parameter: id, length, value."""
    value = encode_varint(delay_us)
    return encode_varint(TP_MIN_ACK_DELAY) + encode_varint(len(value)) + value


def parse_min_ack_delay(params: bytes, peer_max_ack_delay: float) -> int | Refused | None:
    """The peer's ``min_ack_delay`` (microseconds) in its encoded transport parameters
    ``params``; None when it sent none; :class:`Refused` when the value is invalid (see the
    module docstring). ``peer_max_ack_delay``: its ``max_ack_delay``, seconds."""
    offset, found = 0, None
    try:
        while offset < len(params):
            ident, offset = decode_varint(params, offset)
            length, offset = decode_varint(params, offset)
            if offset + length > len(params):
                raise ValueError("truncated parameter")
            if ident == TP_MIN_ACK_DELAY:
                value, end = decode_varint(params, offset)
                if end != offset + length:
                    raise ValueError("min_ack_delay length does not match its value")
                found = value
            offset += length
    except ValueError as exc:
        return Refused(TRANSPORT_PARAMETER_ERROR, f"min_ack_delay: {exc}")
    if found is None:
        return None
    if found >= MIN_ACK_DELAY_LIMIT or found > round(peer_max_ack_delay * 1e6):
        return Refused(TRANSPORT_PARAMETER_ERROR, "min_ack_delay is invalid or above max_ack_delay")
    return found


def encode_frame(frame: AckFrequencyFrame) -> bytes:
    """An ACK_FREQUENCY frame's body (after its type)."""
    fields = (frame.sequence, frame.threshold, frame.max_ack_delay_us, frame.reordering)
    return b"".join(encode_varint(v) for v in fields)


# --- receiver ------------------------------------------------------------------------------------


class AckFrequencyReceiver:
    """When this side acknowledges, once the peer asked with ACK_FREQUENCY (until then the
    library's own rule holds: :meth:`ack_deadline` says None)."""

    def __init__(self, min_ack_delay_us: int = MIN_ACK_DELAY_US) -> None:
        self.min_ack_delay_us = min_ack_delay_us
        self.stats = AckFrequencyStats()
        self.sequence: int | None = None  # the latest frame's
        self.threshold = 1
        self.max_ack_delay = DEFAULT_MAX_ACK_DELAY
        self.reordering = 1
        self._unacked = 0  # ack-eliciting packets since the last ACK
        self._first_at: float | None = None
        self._immediate = False
        self._hurried = False  # IMMEDIATE_ACK in the datagram being taken (on_datagram keeps it)
        self._reported = -1  # the largest packet number the last ACK covered
        self._gap_from: int | None = None  # the smallest missing packet number above it

    @property
    def active(self) -> bool:
        """Whether a frame was received (the peer's rule applies)."""
        return self.sequence is not None

    def on_frame(self, frame: AckFrequencyFrame) -> Refused | None:
        """An ACK_FREQUENCY frame arrived: applied, ignored (stale), or refused."""
        refused = None
        if frame.max_ack_delay_us < self.min_ack_delay_us:
            refused = Refused(PROTOCOL_VIOLATION, "requested max ack delay below min_ack_delay")
        elif (
            frame.max_ack_delay_us >= MAX_ACK_DELAY_LIMIT_US
            or frame.threshold > MAX_THRESHOLD
            or frame.reordering > MAX_THRESHOLD
        ):
            refused = Refused(FRAME_ENCODING_ERROR, "ACK_FREQUENCY field out of bounds")
        if refused is not None:
            self.stats.refused_frames += 1
            TOTALS.refused_frames += 1
            return refused
        if self.sequence is not None and frame.sequence <= self.sequence:
            self.stats.stale_frames += 1
            return None
        self.stats.frames_received += 1
        self.sequence = frame.sequence
        self.threshold = frame.threshold
        self.max_ack_delay = frame.max_ack_delay_us / 1e6
        self.reordering = frame.reordering
        return None

    def on_immediate_ack(self) -> None:
        """An IMMEDIATE_ACK frame arrived."""
        self.stats.immediate_acks_received += 1
        self._immediate = self._hurried = True

    def on_ack_eliciting(self, now: float) -> None:
        """An ack-eliciting 1-RTT packet arrived."""
        self._unacked += 1
        if self._first_at is None:
            self._first_at = now

    def on_largest(self, before: int, after: int, eliciting: bool) -> None:
        """A datagram moved the largest received packet number from ``before`` to ``after``
        (equal: its packet was older, reordered); ``eliciting``: it was ack-eliciting."""
        if after > before + 1 and before >= self._reported and self._gap_from is None:
            self._gap_from = before + 1
        if eliciting and after == before and self.reordering == 1:
            self._immediate = True  # RFC 9000 13.2.1: a packet older than the largest
        if self._gap_from is not None and self.reordering and after - self._gap_from >= self.reordering:
            self._immediate = True

    def ack_deadline(self, now: float) -> float | None:
        """When the pending ACK is due (None: the library's own rule, or nothing to acknowledge)."""
        if self.sequence is None or self._first_at is None:
            return None
        if self._immediate or self._unacked > self.threshold:
            return now
        return self._first_at + self.max_ack_delay

    def on_ack_sent(self, largest: int) -> None:
        """An ACK frame covering packets up to ``largest`` left."""
        self._unacked = 0
        self._first_at = None
        self._immediate = self._hurried = False
        self._reported = max(self._reported, largest)
        self._gap_from = None

    def on_datagram(
        self, now: float, before: int, after: int, eliciting: bool, unpending: bool
    ) -> float | None:
        """The hooks' one call per datagram taken, for a library that holds an ACK pending
        from an ack-eliciting packet until it sends one: :meth:`on_ack_sent` (``unpending``: the
        library had no ACK pending before the datagram, so one covering up to ``before`` left
        if an ack-eliciting packet waited), :meth:`on_ack_eliciting` (``eliciting``),
        :meth:`on_largest` and :meth:`ack_deadline`, in that order, written out (a datagram
        would cost four calls). The ACK left before the datagram's frames were taken: an
        IMMEDIATE_ACK among them still holds."""
        if unpending and self._first_at is not None:
            self._unacked = 0
            self._first_at = None
            self._immediate = self._hurried
            if before > self._reported:
                self._reported = before
            self._gap_from = None
        self._hurried = False
        if eliciting:
            self._unacked += 1
            if self._first_at is None:
                self._first_at = now
        gap = self._gap_from
        if gap is None and after > before + 1 and before >= self._reported:
            gap = self._gap_from = before + 1
        reordering = self.reordering
        if eliciting and after == before and reordering == 1:
            self._immediate = True  # RFC 9000 13.2.1: a packet older than the largest
        if gap is not None and reordering and after - gap >= reordering:
            self._immediate = True
        if self.sequence is None or self._first_at is None:
            return None
        if self._immediate or self._unacked > self.threshold:
            return now
        return self._first_at + self.max_ack_delay


# --- sender --------------------------------------------------------------------------------------


def choose_threshold(cwnd_bytes: int, datagram_size: int) -> int:
    """The ack-eliciting threshold a congestion window of ``cwnd_bytes`` asks for."""
    packets = cwnd_bytes // max(datagram_size, 1)
    return max(MIN_THRESHOLD, min(MAX_SENT_THRESHOLD, int(packets / ACKS_PER_WINDOW)))


class AckFrequencySender:
    """When this side sends ACK_FREQUENCY frames to a peer that sent ``min_ack_delay``."""

    def __init__(self) -> None:
        self.stats = AckFrequencyStats()
        self.peer_min_ack_delay_us: int | None = None
        self.peer_max_ack_delay = DEFAULT_MAX_ACK_DELAY
        self._next_sequence = 0
        self._sent: AckFrequencyFrame | None = None  # the latest frame sent
        self._sent_at = 0.0
        self._resend = False
        #: ``(lo, hi, rtt_lo, rtt_hi)``: while the congestion window in packets is in
        #: ``[lo, hi)`` and the smoothed RTT in ``[rtt_lo, rtt_hi]``, :meth:`poll` finds the
        #: latest frame close enough and sends none (:meth:`quiet`); None: it must look (no
        #: frame yet, or the latest was lost).
        self.band: tuple[float, float, float, float] | None = None

    @property
    def negotiated(self) -> bool:
        """Whether the peer takes ACK_FREQUENCY and IMMEDIATE_ACK frames."""
        return self.peer_min_ack_delay_us is not None

    @property
    def current(self) -> AckFrequencyFrame | None:
        """The latest frame sent (None: none yet)."""
        return self._sent

    def on_peer_parameters(self, min_ack_delay_us: int | None, max_ack_delay: float) -> None:
        """The peer's transport parameters arrived."""
        self.peer_min_ack_delay_us = min_ack_delay_us
        self.peer_max_ack_delay = max_ack_delay
        self.band = None  # the delay's bounds moved

    def requested_delay_us(self, rtt: float) -> int:
        """The max ack delay to ask for at smoothed RTT ``rtt``: a quarter of it, at least
        :data:`MIN_REQUESTED_DELAY` (10 ms) and the peer's ``min_ack_delay``, at most the peer's
        own ``max_ack_delay`` (which wins over both)."""
        floor, ceiling = self._delay_bounds_us()
        return max(floor, min(ceiling, round(rtt * RTT_FRACTION * 1e6)))

    def _delay_bounds_us(self) -> tuple[int, int]:
        """The least and the most delay to ask for (µs); the most wins where they cross."""
        ceiling = round(self.peer_max_ack_delay * 1e6)
        floor = max(self.peer_min_ack_delay_us or 0, MIN_ACK_DELAY_US, round(MIN_REQUESTED_DELAY * 1e6))
        return min(floor, ceiling), ceiling

    def poll(self, now: float, cwnd_bytes: int, datagram_size: int, rtt: float) -> AckFrequencyFrame | None:
        """The frame to send now, if one is due (it is then taken as sent)."""
        if self.peer_min_ack_delay_us is None:  # not negotiated
            return None
        threshold = choose_threshold(cwnd_bytes, datagram_size)
        delay = self.requested_delay_us(rtt)
        sent = self._sent
        if sent is not None and not self._resend:
            # a new frame once the window or the RTT asks for a threshold or a delay a quarter
            # off the last one, at most once a round trip
            close = 4 * abs(threshold - sent.threshold) < sent.threshold
            close = close and 4 * abs(delay - sent.max_ack_delay_us) < sent.max_ack_delay_us
            if close or now - self._sent_at < rtt:
                return None
        frame = AckFrequencyFrame(self._next_sequence, threshold, delay, SENT_REORDERING_THRESHOLD)
        self._next_sequence += 1
        self._sent, self._sent_at, self._resend = frame, now, False
        self.band = self._band(frame)
        self.stats.frames_sent += 1
        return frame

    def quiet(self, cwnd_bytes: int, datagram_size: int, rtt: float) -> bool:
        """Whether :meth:`poll` would send no frame for this window and RTT, whatever the time
        (they are in :attr:`band`): the hooks look no further (they test the band written out)."""
        band = self.band
        return (
            band is not None
            and band[0] <= cwnd_bytes // max(datagram_size, 1) < band[1]
            and (band[2] <= rtt <= band[3])
        )

    def _band(self, sent: AckFrequencyFrame) -> tuple[float, float, float, float]:
        """The windows (packets) and RTTs whose threshold and delay are within a quarter of
        ``sent``'s (:meth:`poll`'s test), bounds taken inwards where rounding is near."""
        s, d = sent.threshold, sent.max_ack_delay_us
        t_lo, t_hi = 3 * s // 4 + 1, (5 * s - 1) // 4  # the thresholds 4|t - s| < s lets by
        lo = 0.0 if t_lo <= MIN_THRESHOLD else float(ACKS_PER_WINDOW * t_lo)
        hi = math.inf if t_hi >= MAX_SENT_THRESHOLD else float(ACKS_PER_WINDOW * (t_hi + 1))
        d_lo, d_hi = 3 * d // 4 + 1, (5 * d - 1) // 4  # the delays (µs) the same test lets by
        floor, ceiling = self._delay_bounds_us()
        per_us = RTT_FRACTION * 1e6
        rtt_lo = -math.inf if d_lo <= floor else (d_lo + 0.5) / per_us * (1 + 1e-9)
        rtt_hi = math.inf if d_hi >= ceiling else (d_hi - 0.5) / per_us * (1 - 1e-9)
        return lo, hi, rtt_lo, rtt_hi

    def on_lost(self, sequence: int) -> None:
        """The packet carrying frame ``sequence`` was lost: send the latest values again."""
        if self._sent is not None and sequence == self._sent.sequence:
            self._resend = True
            self.band = None


def _nothing() -> None:
    return None


class AckFrequency:
    """The extension on one connection: its sender's and its receiver's side."""

    def __init__(self) -> None:
        self.sender = AckFrequencySender()
        self.receiver = AckFrequencyReceiver()
        #: Transport parameters refused (the connection closed with TRANSPORT_PARAMETER_ERROR).
        self.refused_parameters = 0
        #: Have the sender look at its frame (:meth:`AckFrequencySender.poll`) at the next packet
        #: built, even within its band: set by the library's hooks, which otherwise look only
        #: after a datagram or a loss moved the window or the RTT (nothing without hooks).
        self.look: Callable[[], None] = _nothing

    def parameter_refused(self) -> None:
        """The peer's ``min_ack_delay`` was refused: counted here and in :data:`TOTALS`."""
        self.refused_parameters += 1
        TOTALS.refused_parameters += 1

    @property
    def negotiated(self) -> bool:
        """Whether the peer sent ``min_ack_delay`` (it takes the frames)."""
        return self.sender.negotiated

    @property
    def stats(self) -> AckFrequencyStats:
        """Both sides' counts together."""
        sent, got = self.sender.stats, self.receiver.stats
        return AckFrequencyStats(
            frames_sent=sent.frames_sent,
            frames_received=got.frames_received,
            stale_frames=got.stale_frames,
            immediate_acks_received=got.immediate_acks_received,
            probes_immediate=sent.probes_immediate,
            refused_frames=got.refused_frames,
            refused_parameters=self.refused_parameters,
        )


__all__ = [
    "ACK_FREQUENCY",
    "IMMEDIATE_ACK",
    "MAX_THRESHOLD",
    "MIN_ACK_DELAY_US",
    "TOTALS",
    "TP_MIN_ACK_DELAY",
    "AckFrequency",
    "AckFrequencyFrame",
    "AckFrequencyReceiver",
    "AckFrequencySender",
    "AckFrequencySettings",
    "AckFrequencyStats",
    "Refused",
    "choose_threshold",
    "decode_varint",
    "encode_frame",
    "encode_min_ack_delay",
    "encode_varint",
    "parse_min_ack_delay",
]
