import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iac
from iac.wire.scan import (
    HELLO_SCHEMA,
    MESSAGE_SCHEMA,
    decode_varint,
    encode_varint,
    excise_signature,
)


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_varint_round_trip(value):
    data = encode_varint(value)
    assert len(data) <= 10
    assert decode_varint(data, 0, len(data)) == (value, len(data))


def test_varint_faults():
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_varint(b"\x80\x80", 0, 2)
    assert exc_info.value.reason == "truncated_frame"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        decode_varint(b"\xff" * 11, 0, 11)
    assert exc_info.value.reason == "bad_varint"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:  # 10 bytes but above 2**64
        decode_varint(b"\xff" * 9 + b"\x7f", 0, 10)
    assert exc_info.value.reason == "bad_varint"


def _field(number: int, wire_type: int, value: bytes) -> bytes:
    return encode_varint(number << 3 | wire_type) + value


def _len_field(number: int, value: bytes) -> bytes:
    return _field(number, 2, encode_varint(len(value)) + value)


SIG = bytes(range(64))


def test_excise_returns_exactly_the_other_bytes():
    before = _len_field(1, b"a" * 64) + _field(5, 0, encode_varint(7))
    after = _len_field(9, b"xyz")
    unsigned, sig = excise_signature(before + _len_field(8, SIG) + after)
    assert unsigned == before + after
    assert sig == SIG


def test_signature_may_stand_anywhere_and_unknown_fields_survive():
    unknown = _len_field(99, b"future") + _field(98, 0, b"\x01") + _len_field(99, b"again")
    data = _len_field(8, SIG) + _len_field(4, b"{}") + unknown
    unsigned, _ = excise_signature(data)
    assert unsigned == _len_field(4, b"{}") + unknown


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (_len_field(4, b"{}"), "signature_missing"),
        (_len_field(8, SIG) + _len_field(8, SIG), "signature_repeated"),
        (_len_field(8, SIG[:63]), "signature_invalid"),
        (_len_field(8, SIG + b"x"), "signature_invalid"),
        (_field(8, 0, b"\x01"), "signature_invalid"),
        (_len_field(8, SIG) + _len_field(4, b"a") + _len_field(4, b"b"), "field_repeated"),
        (_len_field(8, SIG) + _field(6, 0, b"\x01") + _field(6, 0, b"\x02"), "field_repeated"),
        (_len_field(8, SIG) + _field(6, 2, b"\x01\x00"), "malformed_message"),  # wrong wire type
        (_len_field(8, SIG) + _field(4, 3, b""), "malformed_message"),  # group
        (_len_field(8, SIG) + _field(4, 7, b""), "malformed_message"),  # invalid wire type
        (_len_field(8, SIG) + b"\x22\x05ab", "malformed_message"),  # runs past the end
        (_len_field(8, SIG) + b"\x00\x00", "malformed_message"),  # field number 0
        # TaskState is checked too: step repeated inside field 11.
        (
            _len_field(8, SIG) + _len_field(11, _field(3, 0, b"\x01") + _field(3, 0, b"\x02")),
            "field_repeated",
        ),
    ],
)
def test_ambiguous_messages_are_refused(data, error):
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        excise_signature(data, MESSAGE_SCHEMA)
    assert exc_info.value.reason == error


def test_hello_repeated_fields_are_allowed_and_field_15_is_the_signature():
    data = (
        _len_field(2, b"x" * 64)
        + _field(7, 0, b"\x01")
        + _len_field(7, b"\x02\x03")  # packed
        + _len_field(9, b"quic://a")
        + _len_field(9, b"tls://b")
        + _len_field(15, SIG)
    )
    unsigned, sig = excise_signature(data, HELLO_SCHEMA)
    assert sig == SIG
    assert unsigned == data[: -len(_len_field(15, SIG))]
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        excise_signature(_len_field(2, b"y" * 64), HELLO_SCHEMA)
    assert exc_info.value.reason == "signature_missing"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:  # field 8 of a Hello is a varint
        excise_signature(_len_field(8, SIG), HELLO_SCHEMA)
    assert exc_info.value.reason == "malformed_message"


@given(st.binary(max_size=300))
def test_scan_never_raises_anything_but_iac_errors(data):
    with contextlib.suppress(iac.IacError):
        excise_signature(data)


# The canonical-layout fast path must give exactly the answer of the full scan, or defer to it.
_PARTS = [
    b"\x0a\x40" + b"a" * 64, b"\x12\x40" + b"b" * 64, b"\x18\x04", b"\x22\x03abc",
    b"\x22\x80\x01" + b"q" * 128,
    b"\x28\xff\x01", b"\x30\x01", b"\x38" + b"\xff" * 9 + b"\x01", b"\x38" + b"\xff" * 10 + b"\x01",
    b"\x42\x40" + b"s" * 64, b"\x42\x3f" + b"s" * 63, b"\x50\x01", b"\x60\x00", b"\x70\x05", b"\x78\x80\x01",
    b"\x4a\x00", b"\x5a\x02\x08\x01", b"\x80\x01\x01", b"\x22", b"\x0a\x41" + b"a" * 65, b"\x18\x80",
]  # fmt: skip


def _full_scan(data):
    from iac.wire.scan import _scan

    try:
        return ("ok", _scan(data, 0, len(data), MESSAGE_SCHEMA))
    except iac.IacError as exc:
        return ("err", exc.reason)


def _fast_agrees(data):
    from iac.wire.scan import _message_span_fast

    fast = _message_span_fast(data)
    if fast is not None:
        assert _full_scan(data) == ("ok", fast), data.hex()
    return fast is not None


@settings(max_examples=2000)
@given(st.lists(st.sampled_from(_PARTS), max_size=14), st.binary(max_size=3))
def test_fast_path_agrees_with_full_scan_on_field_soups(parts, junk):
    _fast_agrees(b"".join(parts) + junk)


def test_fast_path_agrees_on_real_messages_and_their_mutations():
    import random

    a = iac.Identity.from_seed(b"a" * 32)
    b = iac.Identity.from_seed(b"b" * 32)
    session = iac.wire.Session(2**64 - 5)
    hits = 0
    for i in range(200):
        msg = iac.wire.build_message(
            sender=a.agent_id, to=b.agent_id if i % 3 else "", msg_type=i % 14, session=session,
            timestamp_us=i * 10**12, payload_json='{"k":"' + "v" * (i * 7) + '"}' if i % 5 else "",
            reply_to=i % 2 * 7, flags=i % 4, deadline_us=i * 999 * (i % 3),
            reply_session_id=(i % 2) * 2**63, extra_data=b"x" if i % 7 == 0 else b"",
        )  # fmt: skip
        signed = iac.wire.sign_message(a, msg)
        hits += _fast_agrees(signed)
        rnd = random.Random(i)
        for _ in range(20):
            x = bytearray(signed)
            j = rnd.randrange(len(x))
            kind = rnd.randrange(3)
            if kind == 0:
                x[j] = rnd.randrange(256)
            elif kind == 1:
                del x[j : j + rnd.randrange(1, 5)]
            else:
                x[j:j] = signed[rnd.randrange(len(signed)) :][: rnd.randrange(1, 80)]
            _fast_agrees(bytes(x))
    assert hits > 150  # the fast path is really taken for canonical messages
