"""Message field 19, the principal a gateway authenticated: signed like every field, singular, and
taken by the canonical-layout fast path of the field-8 scan exactly when the full scan takes it."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iac
from iac.errors import IacError, ProtocolError
from iac.wire import Session, build_message, sign_message
from iac.wire._pb.iac_pb2 import Message
from iac.wire.message import open_message
from iac.wire.scan import MESSAGE_SCHEMA, _message_span_fast, _scan, encode_varint, excise_signature

A = iac.Identity.from_seed(b"a" * 32)
B = iac.Identity.from_seed(b"b" * 32)


def message(principal: str = "", *, stream: bool = False, traceparent: str = "") -> Message:
    msg = build_message(
        sender=A.agent_id, to=B.agent_id, msg_type=iac.MessageType.RUN, session=Session(7),
        timestamp_us=1_700_000_000_000_000, payload_json='{"method": "SendMessage"}', deadline_us=9,
    )  # fmt: skip
    if principal:
        msg.principal = principal
    if stream:
        msg.credit = 16
    if traceparent:
        msg.trace.traceparent = traceparent
    return msg


def _len_field(number: int, value: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value


def _full(data: bytes) -> tuple[str, object]:
    try:
        return ("ok", _scan(data, 0, len(data), MESSAGE_SCHEMA))
    except IacError as exc:
        return ("err", exc.reason)


def test_field_19_is_signed_and_survives_the_round_trip():
    data = sign_message(A, message("alice@example.org"))
    assert b"\x9a\x01\x11alice@example.org" in data  # field 19, length-delimited, last
    assert open_message(data).principal == "alice@example.org"
    with pytest.raises(iac.errors.MessageRejected) as exc_info:  # nobody on the way can change who it was for
        open_message(data.replace(b"alice@", b"mallo@"))
    assert exc_info.value.reason == "bad_signature"
    assert open_message(sign_message(A, message())).principal == ""


def test_a_repeated_principal_is_refused_and_it_is_length_delimited():
    data = sign_message(A, message("alice"))
    with pytest.raises(ProtocolError) as exc_info:
        excise_signature(data + _len_field(19, b"mallory"))
    assert exc_info.value.reason == "field_repeated"
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        excise_signature(sign_message(A, message()) + b"\x98\x01\x05")  # field 19 as a varint
    assert exc_info.value.reason == "malformed_message"


def test_the_fast_path_takes_a_principal_and_agrees_with_the_full_scan():
    rnd = random.Random(19)
    for i in range(60):
        name = "p" * [1, 5, 127, 128, 300, 20_000][i % 6]
        data = sign_message(A, message(name, stream=i % 2 == 1, traceparent="t" * (i % 3)))
        fast = _message_span_fast(data)
        assert _full(data) == ("ok", fast if fast is not None else _full(data)[1])
        if len(name) < 16_384:
            assert fast is not None  # canonical layout: the fast path answers
        for _ in range(10):  # and defers, or agrees, on anything else
            x = bytearray(data)
            x[rnd.randrange(len(x))] = rnd.randrange(256)
            got = _message_span_fast(bytes(x))
            if got is not None:
                assert _full(bytes(x)) == ("ok", got)


_PARTS = [
    _len_field(19, b"alice"),
    _len_field(19, b""),
    _len_field(19, b"x" * 200),
    b"\x9a\x01\x05ab",  # runs past the end
    b"\x98\x01\x01",
    b"\x88\x01\x02",
    b"\x90\x01\x03",
    _len_field(20, b"z"),
]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(_PARTS), max_size=4))
def test_the_fast_path_agrees_with_the_full_scan_on_principal_soups(parts):
    data = sign_message(A, message()) + b"".join(parts)
    fast = _message_span_fast(data)
    if fast is not None:
        assert _full(data) == ("ok", fast), data.hex()
