import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import iac
from iac import Identity, MessageType
from iac.wire import Session
from iac.wire.scan import encode_varint

ALICE = Identity.from_seed(b"\x01" * 32)
BOB = Identity.from_seed(b"\x02" * 32)
T0 = 1_790_000_000_000_000


def _msg(**kw):
    args = dict(
        sender=ALICE.agent_id,
        to=BOB.agent_id,
        msg_type=MessageType.COMMAND,
        session=Session(session_id=42),
        timestamp_us=T0,
        payload_json='{"name":"add","args":[1,2]}',
    )
    args.update(kw)
    return iac.wire.build_message(**args)


def test_session_counts_up_and_wraps():
    s = Session(session_id=7, first_msg_id=2**64 - 2)
    assert [s.next_msg_id() for _ in range(3)] == [2**64 - 2, 2**64 - 1, 0]
    assert Session().session_id != Session().session_id


def test_sign_and_open():
    msg = _msg()
    data = iac.wire.sign_message(ALICE, msg)
    out = iac.wire.open_message(data)
    assert iac.wire.sender_of(out) == ALICE.agent_id
    assert out.payload_json == msg.payload_json
    assert out.msg_id == 1 and out.session_id == 42


def test_signature_covers_exactly_the_unsigned_serialization():
    msg = _msg()
    data = iac.wire.sign_message(ALICE, msg)
    iac.wire.verify(ALICE.agent_id, iac.wire.Domain.MESSAGE, iac.wire.unsigned_bytes(msg), msg.signature)
    assert len(data) == len(iac.wire.unsigned_bytes(msg)) + 2 + 64


def test_any_changed_byte_is_refused():
    data = iac.wire.sign_message(ALICE, _msg())
    for i in range(len(data)):
        tampered = bytearray(data)
        tampered[i] ^= 0x01
        with pytest.raises(iac.IacError):
            iac.wire.open_message(bytes(tampered))


def test_unknown_fields_are_signed_and_verified_from_the_received_bytes():
    # A newer sender adds field 40; the verifier never re-serializes, so it still verifies.
    unsigned = iac.wire.unsigned_bytes(_msg()) + encode_varint(40 << 3 | 2) + b"\x03new"
    sig = ALICE.sign(iac.wire.Domain.MESSAGE, unsigned)
    data = unsigned + b"\x42\x40" + sig
    assert iac.wire.open_message(data).payload_json


def test_signer_must_be_the_sender():
    with pytest.raises(iac.ConfigError):
        iac.wire.sign_message(BOB, _msg())


def test_resigned_by_another_key_fails():
    msg = _msg()
    iac.wire.sign_message(ALICE, msg)
    msg.signature = BOB.sign(iac.wire.Domain.MESSAGE, iac.wire.unsigned_bytes(msg))
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.open_message(msg.SerializeToString())
    assert exc_info.value.reason == "bad_signature"


def test_bad_sender_id_refused_before_signature():
    msg = _msg()
    iac.wire.sign_message(ALICE, msg)
    setattr(msg, "from", ALICE.agent_id.upper())
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.open_message(msg.SerializeToString())
    assert exc_info.value.reason == "invalid_agent_id"
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        _msg(sender="alice")
    assert exc_info.value.reason == "invalid_agent_id"


def test_frame_round_trip_with_dictionary():
    d = iac.wire.train([b'{"name":"add","args":[%d,2]}' % i for i in range(300)], 2048, dict_id=40001)
    data = iac.wire.encode_message_frame(ALICE, _msg(), compress_with=d)
    out = iac.wire.decode_message_frame(data, dictionaries=iac.wire.DictionarySet([d]))
    assert out.payload_json == '{"name":"add","args":[1,2]}'
    with pytest.raises(iac.errors.ProtocolError) as exc_info:
        iac.wire.decode_message_frame(iac.wire.encode_frame(iac.wire.FrameType.HELLO, b""))
    assert exc_info.value.reason == "malformed_message"


def test_hello_domains_cannot_be_swapped():
    hello = iac.wire.Hello(version=1, agent_id=ALICE.agent_id, nonce=b"n" * 16, timestamp=T0)
    data = iac.wire.sign_hello(ALICE, hello, iac.wire.Domain.HELLO_CLIENT)
    assert iac.wire.open_hello(data, iac.wire.Domain.HELLO_CLIENT).agent_id == ALICE.agent_id
    with pytest.raises(iac.errors.MessageRejected) as exc_info:
        iac.wire.open_hello(data, iac.wire.Domain.HELLO_SERVER)
    assert exc_info.value.reason == "bad_signature"


u64 = st.integers(min_value=0, max_value=2**64 - 1)
u32 = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=200)
@given(
    to=st.one_of(st.just(""), st.just(BOB.agent_id)),
    msg_type=st.sampled_from(list(MessageType)),
    payload=st.text(max_size=300),
    ts=u64,
    msg_id=u64,
    session_id=u64,
    extra=st.binary(max_size=200),
    reply_to=u64,
    reply_session_id=u64,
    flags=u32,
    sealed=st.binary(max_size=100),
    deadline=u64,
    task=st.one_of(
        st.none(),
        st.builds(
            iac.TaskState,
            task_id=st.text(max_size=40),
            intent=st.sampled_from(list(iac.Intent)),
            step=u32,
            steps=u32,
            state_ref=st.text(max_size=40),
        ),
    ),
    compress=st.booleans(),
)
def test_any_message_round_trips(
    to, msg_type, payload, ts, msg_id, session_id, extra, reply_to, reply_session_id, flags, sealed, deadline,
    task, compress,
):  # fmt: skip
    msg = iac.wire.build_message(
        sender=ALICE.agent_id, to=to, msg_type=msg_type, session=Session(session_id), timestamp_us=ts,
        payload_json=payload, extra_data=extra, reply_to=reply_to, reply_session_id=reply_session_id,
        task=task, flags=flags, sealed=sealed, deadline_us=deadline, msg_id=msg_id,
    )  # fmt: skip
    expected = iac.wire.Message()
    expected.CopyFrom(msg)
    frame = iac.wire.encode_frame(
        iac.wire.FrameType.MESSAGE, iac.wire.sign_message(ALICE, msg), plain_zstd=compress
    )
    out = iac.wire.decode_message_frame(frame)
    out.signature = b""
    assert out == expected


@settings(max_examples=300)
@given(st.data())
def test_mutated_valid_frames_give_messages_or_iac_errors(data):
    msg = _msg(payload_json='{"text":"' + "agent " * 40 + '"}')
    frame = bytearray(
        iac.wire.encode_frame(iac.wire.FrameType.MESSAGE, iac.wire.sign_message(ALICE, msg), plain_zstd=True)
    )
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        i = data.draw(st.integers(min_value=0, max_value=len(frame) - 1))
        frame[i] = data.draw(st.integers(min_value=0, max_value=255))
    cut = data.draw(st.integers(min_value=0, max_value=len(frame)))
    with contextlib.suppress(iac.IacError):
        iac.wire.decode_message_frame(bytes(frame[:cut]) if cut else bytes(frame))
