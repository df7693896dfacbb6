"""The ACK Frequency extension's sans-IO core (iac.transport.quic.ackfreq) with an explicit clock:
the transport parameter and frame codec and their bounds, the receiver's ACK deadline (threshold,
delay, reordering, IMMEDIATE_ACK, stale frames) and the sender's choice of frame."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iac.transport.quic import ackfreq
from iac.transport.quic.ackfreq import (
    FRAME_ENCODING_ERROR,
    MAX_THRESHOLD,
    MIN_ACK_DELAY_US,
    PROTOCOL_VIOLATION,
    TP_MIN_ACK_DELAY,
    TRANSPORT_PARAMETER_ERROR,
    AckFrequencyFrame,
    AckFrequencyReceiver,
    AckFrequencySender,
    Refused,
    choose_threshold,
    decode_varint,
    encode_frame,
    encode_min_ack_delay,
    encode_varint,
    parse_min_ack_delay,
)


@pytest.mark.parametrize("value", [0, 63, 64, 16383, 16384, 2**30 - 1, 2**30, 2**62 - 1])
def test_varint_round_trip(value: int) -> None:
    data = encode_varint(value)
    assert len(data) in (1, 2, 4, 8)
    assert decode_varint(data + b"\xff", 0) == (value, len(data))
    with pytest.raises(ValueError):
        decode_varint(data[:-1], 0)  # ends inside the integer
    with pytest.raises(ValueError):
        encode_varint(2**62)


def _params(*pairs: tuple[int, bytes]) -> bytes:
    return b"".join(encode_varint(i) + encode_varint(len(v)) + v for i, v in pairs)


def test_min_ack_delay_parameter_is_found_among_others_and_bounded() -> None:
    other = (0x01, encode_varint(30000))  # max_idle_timeout, say
    ours = encode_min_ack_delay()
    assert ours.startswith(encode_varint(TP_MIN_ACK_DELAY))
    assert parse_min_ack_delay(_params(other) + ours, 0.025) == MIN_ACK_DELAY_US
    assert parse_min_ack_delay(_params(other), 0.025) is None  # a plain peer
    assert parse_min_ack_delay(encode_min_ack_delay(25000), 0.025) == 25000  # equal to max_ack_delay
    # above the peer's own max_ack_delay, at 2^24, a length that does not match, truncated
    bad = [
        encode_min_ack_delay(25001),
        _params((TP_MIN_ACK_DELAY, encode_varint(1 << 24))),
        _params((TP_MIN_ACK_DELAY, encode_varint(1000) + b"\x00")),
        ours[:-1],
    ]
    for params in bad:
        refused = parse_min_ack_delay(params, 0.025)
        assert isinstance(refused, Refused) and refused.code == TRANSPORT_PARAMETER_ERROR, params


def _frame(seq: int, threshold: int = 10, delay_us: int = 25000, reordering: int = 3) -> AckFrequencyFrame:
    return AckFrequencyFrame(seq, threshold, delay_us, reordering)


def test_frame_encoding_is_four_varints() -> None:
    frame = _frame(70, 64, 25000, 3)
    body = encode_frame(frame)
    fields, offset = [], 0
    for _ in range(4):
        value, offset = decode_varint(body, offset)
        fields.append(value)
    assert offset == len(body) and AckFrequencyFrame(*fields) == frame


def test_receiver_keeps_the_librarys_rule_until_a_frame_arrives() -> None:
    rx = AckFrequencyReceiver()
    rx.on_ack_eliciting(1.0)
    assert not rx.active and rx.ack_deadline(1.0) is None


def test_receiver_acknowledges_after_threshold_packets_or_the_delay() -> None:
    rx = AckFrequencyReceiver()
    assert rx.on_frame(_frame(0, threshold=10, delay_us=20000)) is None
    assert rx.ack_deadline(5.0) is None  # nothing to acknowledge
    for i in range(10):
        rx.on_ack_eliciting(5.0 + i * 0.001)
        rx.on_largest(i - 1, i, True)
        assert rx.ack_deadline(5.0 + i * 0.001) == pytest.approx(5.020)  # from the first one
    rx.on_ack_eliciting(5.011)  # the eleventh: more than the threshold
    rx.on_largest(9, 10, True)
    assert rx.ack_deadline(5.011) == 5.011
    rx.on_ack_sent(10)
    assert rx.ack_deadline(5.012) is None
    rx.on_ack_eliciting(6.0)
    rx.on_largest(10, 11, True)
    assert rx.ack_deadline(6.0) == pytest.approx(6.020)


def test_receiver_acknowledges_at_once_on_a_gap_of_the_reordering_threshold() -> None:
    rx = AckFrequencyReceiver()
    rx.on_frame(_frame(0, threshold=50, reordering=3))
    rx.on_ack_eliciting(1.0)
    rx.on_largest(9, 10, True)
    rx.on_ack_sent(10)
    rx.on_ack_eliciting(1.1)
    rx.on_largest(10, 12, True)  # 11 missing: one packet past it
    assert rx.ack_deadline(1.1) == pytest.approx(1.125)
    rx.on_ack_eliciting(1.2)
    rx.on_largest(12, 13, True)
    assert rx.ack_deadline(1.2) == pytest.approx(1.125)
    rx.on_ack_eliciting(1.3)
    rx.on_largest(13, 14, True)  # 14 - 11 = 3: the sender would declare 11 lost
    assert rx.ack_deadline(1.3) == 1.3
    # reordering threshold 1 (RFC 9000's rule): a packet older than the largest, at once
    rx.on_frame(_frame(1, threshold=50, reordering=1))
    rx.on_ack_sent(14)
    rx.on_ack_eliciting(2.0)
    rx.on_largest(14, 14, True)
    assert rx.ack_deadline(2.0) == 2.0
    # reordering threshold 0: gaps never hurry the ACK
    rx.on_frame(_frame(2, threshold=50, reordering=0))
    rx.on_ack_sent(14)
    rx.on_ack_eliciting(3.0)
    rx.on_largest(14, 30, True)
    assert rx.ack_deadline(3.0) == pytest.approx(3.025)


def test_immediate_ack_frame_hurries_the_ack() -> None:
    rx = AckFrequencyReceiver()
    rx.on_frame(_frame(0, threshold=50))
    rx.on_ack_eliciting(1.0)
    rx.on_immediate_ack()
    assert rx.ack_deadline(1.0) == 1.0 and rx.stats.immediate_acks_received == 1


def test_receiver_honours_the_latest_sequence_number_only() -> None:
    rx = AckFrequencyReceiver()
    assert rx.on_frame(_frame(5, threshold=20)) is None
    assert rx.on_frame(_frame(3, threshold=2)) is None  # older: stale, ignored
    assert rx.on_frame(_frame(5, threshold=2)) is None  # the same: stale too
    assert rx.threshold == 20 and rx.stats.stale_frames == 2 and rx.stats.frames_received == 1
    assert rx.on_frame(_frame(6, threshold=4, delay_us=5000, reordering=0)) is None
    assert (rx.threshold, rx.max_ack_delay, rx.reordering) == (4, 0.005, 0)


def test_receiver_refuses_frames_outside_the_bounds_and_counts_them() -> None:
    rx = AckFrequencyReceiver()
    before = ackfreq.TOTALS.refused_frames
    cases = [
        (_frame(0, delay_us=MIN_ACK_DELAY_US - 1), PROTOCOL_VIOLATION),
        (_frame(0, delay_us=(1 << 14) * 1000), FRAME_ENCODING_ERROR),
        (_frame(0, threshold=MAX_THRESHOLD + 1), FRAME_ENCODING_ERROR),
        (_frame(0, reordering=MAX_THRESHOLD + 1), FRAME_ENCODING_ERROR),
    ]
    for frame, code in cases:
        refused = rx.on_frame(frame)
        assert isinstance(refused, Refused) and refused.code == code, frame
    assert not rx.active, "a refused frame changes nothing"
    assert rx.stats.refused_frames == 4 and ackfreq.TOTALS.refused_frames == before + 4
    edge = _frame(0, threshold=MAX_THRESHOLD, delay_us=(1 << 14) * 1000 - 1, reordering=MAX_THRESHOLD)
    assert rx.on_frame(edge) is None and rx.active


def test_threshold_is_half_the_window_within_bounds() -> None:
    assert choose_threshold(12000, 1200) == 5  # the initial window: ten packets
    assert choose_threshold(1200, 1200) == 2
    assert choose_threshold(10_000_000, 1472) == 64
    assert choose_threshold(0, 1472) == 2


def test_sender_sends_only_to_a_peer_that_offered_the_extension() -> None:
    tx = AckFrequencySender()
    assert tx.poll(0.0, 100_000, 1200, 0.01) is None and tx.stats.frames_sent == 0
    tx.on_peer_parameters(None, 0.025)
    assert tx.poll(0.0, 100_000, 1200, 0.01) is None


def test_sender_updates_the_frame_as_the_window_changes_at_most_once_a_round_trip() -> None:
    tx = AckFrequencySender()
    tx.on_peer_parameters(1000, 0.1)  # a peer whose max_ack_delay leaves room for a quarter RTT
    first = tx.poll(0.0, 48_000, 1200, 0.1)
    assert first == AckFrequencyFrame(0, 20, 25000, 3)  # half the window, a quarter of the RTT
    assert tx.poll(0.001, 48_000, 1200, 0.1) is None  # nothing changed
    assert tx.poll(5.0, 50_400, 1200, 0.11) is None  # 21 packets, 27.5 ms: within a quarter
    assert tx.poll(0.05, 96_000, 1200, 0.1) is None  # doubled, but within a round trip
    second = tx.poll(0.2, 96_000, 1200, 0.1)
    assert second == AckFrequencyFrame(1, 40, 25000, 3)
    third = tx.poll(1.0, 96_000, 1200, 0.2)  # the same window, twice the RTT
    assert third == AckFrequencyFrame(2, 40, 50000, 3)
    tx.on_lost(1)  # an older frame lost: the newer one carries the values
    assert tx.poll(1.001, 96_000, 1200, 0.2) is None
    tx.on_lost(2)
    again = tx.poll(1.002, 96_000, 1200, 0.2)
    assert again == AckFrequencyFrame(3, 40, 50000, 3) and tx.stats.frames_sent == 4


def test_requested_delay_is_a_quarter_rtt_within_the_peers_bounds() -> None:
    tx = AckFrequencySender()
    tx.on_peer_parameters(1000, 0.025)
    assert tx.requested_delay_us(0.06) == 15000  # a quarter of the RTT
    assert tx.requested_delay_us(0.2) == 25000  # at most the peer's max_ack_delay
    assert tx.requested_delay_us(0.01) == 10000  # at least 10 ms (loopback: a quarter is ~1 ms)
    tx.on_peer_parameters(0, 0.025)
    assert tx.requested_delay_us(0.0) == 10000
    tx.on_peer_parameters(12000, 0.025)
    assert tx.requested_delay_us(0.004) == 12000  # at least the peer's min_ack_delay
    tx.on_peer_parameters(0, 0.005)
    assert tx.requested_delay_us(0.01) == 5000  # never above the peer's max_ack_delay


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.booleans(), st.booleans(), st.booleans()),
        max_size=40,
    ),
    st.integers(0, 3),
)
def test_the_receivers_one_call_per_datagram_is_its_four_calls_in_order(
    steps: list[tuple[int, bool, bool, bool, bool]], reordering: int
) -> None:
    """on_datagram (the hooks' call, after the datagram's frames) decides as on_ack_sent (when
    the ACK left, before the datagram), on_ack_eliciting, on_largest and ack_deadline: for any
    run of datagrams (forward jumps, repeats, ACKs sent, frames, IMMEDIATE_ACK)."""
    one, four = AckFrequencyReceiver(), AckFrequencyReceiver()
    largest, now, pending = -1, 1.0, False  # pending: the library holds an ACK to send
    for i, (jump, eliciting, acked, immediate, frame) in enumerate(steps):
        now += 0.001
        if acked and pending:  # the library wrote an ACK since the previous datagram
            four.on_ack_sent(largest)
            pending = False
        unpending = not pending
        eliciting = eliciting or immediate  # (IMMEDIATE_ACK is ack-eliciting)
        for rx in (one, four):  # the datagram's frames
            if frame:
                rx.on_frame(_frame(i, threshold=2 + i % 3, delay_us=5000, reordering=reordering))
            if immediate:
                rx.on_immediate_ack()
        after = largest + jump
        if eliciting:
            four.on_ack_eliciting(now)
        four.on_largest(largest, after, eliciting)
        expected = four.ack_deadline(now)
        assert one.on_datagram(now, largest, after, eliciting, unpending) == expected, (i, steps)
        largest, pending = after, pending or eliciting


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 200_000),
    st.sampled_from([1200, 1472, 9000]),
    st.floats(0.0, 0.3),
    st.integers(1, 400_000),
    st.floats(0.0, 0.3),
    st.sampled_from([(1000, 0.025), (0, 0.025), (5000, 0.025), (0, 0.0005), (2000, 0.1)]),
)
def test_within_the_senders_band_poll_sends_nothing(
    cwnd: int, mds: int, rtt: float, cwnd2: int, rtt2: float, peer: tuple[int, float]
) -> None:
    """The hooks ask the sender only when the window or the RTT left the latest frame's band:
    inside it, poll sends no frame however long after the last one."""
    tx = AckFrequencySender()
    tx.on_peer_parameters(*peer)
    assert tx.poll(0.0, cwnd, mds, rtt) is not None and tx.band is not None
    if tx.quiet(cwnd2, mds, rtt2):
        assert tx.poll(100.0, cwnd2, mds, rtt2) is None
    assert tx.quiet(cwnd, mds, rtt), "the values the frame was made from are in its band"
    tx.on_lost(0)
    assert not tx.quiet(cwnd, mds, rtt) and tx.poll(100.0, cwnd, mds, rtt) is not None
