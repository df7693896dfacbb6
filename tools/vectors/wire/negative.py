"""The frames every receiver must refuse, each with the error name it must map to."""

from __future__ import annotations

from typing import Any

import nacl.signing

import iac
from iac import MessageType
from iac.wire import Dictionary, Domain, FrameType
from iac.wire._pb.iac_pb2 import Message
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE
from iac.wire.identity import signing_input
from iac.wire.scan import encode_varint
from tools.vectors import points
from tools.vectors.wire.common import (
    ALICE,
    BOB,
    DICT_ID,
    SMALL_MAX,
    T0,
    WRONG_DICT_ID,
    ZSTD_MAGIC,
    field,
    frame,
    raw_block,
    seed,
    sign_raw,
    zstd_header,
    zstd_raw,
    zstd_rle_bomb,
)
from tools.vectors.wire.positive import positive_messages


def _ping_from(key: str, msg_id: int) -> Message:
    """The PING of the key vectors: from ``key`` to Bob."""
    m = Message(to=BOB.agent_id, msg_type=MessageType.PING, timestamp=T0, msg_id=msg_id, session_id=1)  # type: ignore[arg-type]
    setattr(m, "from", key)
    return m


def negative_vectors(d: Dictionary, signed_of: dict[str, bytes]) -> list[dict[str, Any]]:
    """Frames every receiver must refuse, each with the error name it must map to."""
    ping = positive_messages()[0][3]
    unsigned = iac.wire.unsigned_bytes(ping)
    signed = signed_of["ping_minimal"]
    good_sig = signed[-64:]
    cmd = signed_of["command"]
    out: list[dict[str, Any]] = []

    def add(
        name: str, description: str, fr: bytes, error: str, max_size: int = DEFAULT_MAX_FRAME_SIZE
    ) -> None:
        out.append(
            {
                "name": name,
                "description": description,
                "frame_hex": fr.hex(),
                "max_frame_size": max_size,
                "error": error,
            }
        )

    def msg_frame(body: bytes) -> bytes:
        return frame(FrameType.MESSAGE, 0, body)

    # signatures
    bad = bytearray(signed)
    bad[-1] ^= 0x01
    add("bad_signature", "last signature byte flipped", msg_frame(bytes(bad)), "bad_signature")
    tampered = signed_of["command"].replace(b'"add"', b'"sub"')
    add("tampered_payload", "payload changed after signing", msg_frame(tampered), "bad_signature")
    _, other = sign_raw(BOB, unsigned)
    add("wrong_signer", "signed by Bob, `from` is Alice", msg_frame(other), "bad_signature")
    _, hello_domain = sign_raw(ALICE, unsigned, Domain.HELLO_CLIENT)
    add(
        "wrong_domain",
        "signed in the iac-hello-client-v1 domain instead of iac-msg-v1",
        msg_frame(hello_domain),
        "bad_signature",
    )
    no_domain = unsigned + field(8, 2, nacl.signing.SigningKey(seed(1)).sign(unsigned).signature)
    add(
        "no_domain",
        "signed over the bare bytes, without the domain prefix",
        msg_frame(no_domain),
        "bad_signature",
    )
    # S + L: the same signature with a non-canonical scalar (libsodium and RFC 8032 refuse it)
    ell = 2**252 + 27742317777372353535851937790883648493
    s = int.from_bytes(good_sig[32:], "little") + ell
    if s < 2**256:
        noncanon = unsigned + field(8, 2, good_sig[:32] + s.to_bytes(32, "little"))
        add("non_canonical_s", "signature scalar S replaced by S + L", msg_frame(noncanon), "bad_signature")

    # R of small order (libsodium's list of 7 encodings, compared with bit 255 cleared), valid key
    alice_input = signing_input(Domain.MESSAGE, unsigned)
    identity_r = points.sign_identity_r(ALICE.seed(), alice_input)
    assert points.plain_verify(bytes.fromhex(ALICE.agent_id), alice_input, identity_r)
    add(
        "small_order_r",
        "Alice's valid key; R = the identity (01 00 ... 00), S = h a: a plain cofactorless check accepts it, "
        "the R rule refuses it",
        msg_frame(unsigned + field(8, 2, identity_r)),
        "bad_signature",
    )
    signed_bit = points.encode(points.IDENTITY)[:31] + b"\x80"
    add(
        "small_order_r_sign_bit",
        "R = the identity with bit 255 set (01 00 ... 80), S = h a: on the list once bit 255 is cleared",
        msg_frame(unsigned + field(8, 2, points.sign_identity_r(ALICE.seed(), alice_input, signed_bit))),
        "bad_signature",
    )

    # keys that are not AgentIds: refused as `from` before the signature is looked at
    def ping_input(key: str, msg_id: int) -> bytes:
        return signing_input(Domain.MESSAGE, _ping_from(key, msg_id).SerializeToString(deterministic=True))

    def key_frame(key: str, msg_id: int, signature: bytes) -> bytes:
        return msg_frame(
            _ping_from(key, msg_id).SerializeToString(deterministic=True) + field(8, 2, signature)
        )

    def forged(key: str) -> bytes:
        """A frame from a small-order ``key`` whose signature (R = identity, S = 0) a plain check accepts."""
        _, sig, i = points.forge_small_order(bytes.fromhex(key), lambda i: ping_input(key, i))
        return key_frame(key, i, sig)

    no_signature = points.encode(points.IDENTITY) + bytes(32)

    add(
        "small_order_key",
        "`from` is the identity point; signature R = identity, S = 0 (a plain cofactorless check accepts "
        "it for every message)",
        key_frame("01" + "00" * 31, 1, no_signature),
        "invalid_agent_id",
    )
    order_8 = points.encode(points.ORDER_8).hex()
    add(
        "small_order_key_order_8",
        "`from` is a point of order 8; signature R = identity, S = 0 over a message whose h is a multiple "
        "of 8 (a plain cofactorless check accepts it)",
        forged(order_8),
        "invalid_agent_id",
    )
    add(
        "identity_key_sign_bit",
        "`from` is the identity point with the sign bit set (x = 0 cannot be negative: not canonical)",
        key_frame("01" + "00" * 30 + "80", 1, no_signature),
        "invalid_agent_id",
    )
    add(
        "non_canonical_key",
        "`from` is y = p + 3, a non-canonical encoding of the curve point with y = 3",
        key_frame(points.non_canonical(3).hex(), 1, no_signature),
        "invalid_agent_id",
    )
    mixed, _, mixed_sig, mixed_id = points.sign_mixed_order(ALICE.seed(), lambda i, key: ping_input(key, i))
    add(
        "mixed_order_key",
        "`from` is Alice's key plus a point of order 8 (outside the prime-order subgroup); the signature "
        "by Alice's scalar verifies under libsodium's and OpenSSL's signature checks",
        key_frame(mixed, mixed_id, mixed_sig),
        "invalid_agent_id",
    )

    # the field-8 scan
    add("signature_missing", "no field 8", msg_frame(unsigned), "signature_missing")
    add(
        "signature_twice",
        "field 8 twice (same signature)",
        msg_frame(signed + field(8, 2, good_sig)),
        "signature_repeated",
    )
    add(
        "signature_short",
        "field 8 of 63 bytes",
        msg_frame(unsigned + field(8, 2, good_sig[:63])),
        "signature_invalid",
    )
    add(
        "signature_long",
        "field 8 of 65 bytes",
        msg_frame(unsigned + field(8, 2, good_sig + b"\x00")),
        "signature_invalid",
    )
    add(
        "signature_empty",
        "field 8 present with length 0",
        msg_frame(unsigned + field(8, 2, b"")),
        "signature_invalid",
    )
    add(
        "signature_varint",
        "field 8 with wire type 0 (varint)",
        msg_frame(unsigned + field(8, 0, 1)),
        "signature_invalid",
    )
    # a singular field repeated, signature valid over the bytes as sent
    for name, description, extra in (
        (
            "from_repeated",
            "field 1 (`from`) twice: parsers would disagree on the sender",
            field(1, 2, BOB.agent_id.encode()),
        ),
        ("msg_id_repeated", "field 6 (msg_id) twice", field(6, 0, 2)),
    ):
        _, rep = sign_raw(ALICE, unsigned + extra)
        add(name, description, msg_frame(rep), "field_repeated")
    dt = positive_messages()[2][3]
    dt_unsigned = iac.wire.unsigned_bytes(dt)
    task_bytes = dt.task.SerializeToString(deterministic=True)
    task_field = field(11, 2, task_bytes)
    assert task_field in dt_unsigned
    bad_task = field(11, 2, task_bytes + field(3, 0, 2))
    _, rep = sign_raw(ALICE, dt_unsigned.replace(task_field, bad_task))
    add("task_step_repeated", "TaskState.step (nested field 3) twice", msg_frame(rep), "field_repeated")
    _, rep = sign_raw(ALICE, dt_unsigned + task_field)
    add("task_repeated", "field 11 (task) twice", msg_frame(rep), "field_repeated")
    # fields 16-19 are known and singular: a repeat is field_repeated, another wire type malformed
    sr = positive_messages()[8][3]
    sr_unsigned = iac.wire.unsigned_bytes(sr)
    trace_bytes = sr.trace.SerializeToString(deterministic=True)
    trace_field = field(16, 2, trace_bytes)
    assert trace_field in sr_unsigned
    for name, description, body, error in (
        ("trace_repeated", "field 16 (trace) twice", sr_unsigned + trace_field, "field_repeated"),
        (
            "traceparent_repeated",
            "TraceContext.traceparent (nested field 1) twice",
            sr_unsigned.replace(
                trace_field, field(16, 2, trace_bytes + field(1, 2, sr.trace.traceparent.encode()))
            ),
            "field_repeated",
        ),
        (
            "stream_seq_repeated",
            "field 17 (stream_seq) twice",
            unsigned + field(17, 0, 1) + field(17, 0, 2),
            "field_repeated",
        ),
        ("credit_repeated", "field 18 (credit) twice", sr_unsigned + field(18, 0, 5), "field_repeated"),
        (
            "principal_repeated",
            "field 19 (principal) twice",
            sr_unsigned + field(19, 2, b"user:eve@example.com"),
            "field_repeated",
        ),
        (
            "trace_wrong_wire_type",
            "field 16 (trace, a message) sent as a varint",
            unsigned + field(16, 0, 1),
            "malformed_message",
        ),
        (
            "credit_wrong_wire_type",
            "field 18 (credit, uint64) sent length-delimited",
            unsigned + field(18, 2, b"\x04"),
            "malformed_message",
        ),
        (
            "principal_wrong_wire_type",
            "field 19 (principal, a string) sent as a varint",
            unsigned + field(19, 0, 1),
            "malformed_message",
        ),
    ):
        _, rep = sign_raw(ALICE, body)
        add(name, description, msg_frame(rep), error)
    # other malformed messages
    _, wt = sign_raw(ALICE, unsigned + field(12, 2, b"\x01"))
    add(
        "wrong_wire_type",
        "field 12 (flags, uint32) sent length-delimited",
        msg_frame(wt),
        "malformed_message",
    )
    _, grp = sign_raw(ALICE, unsigned + encode_varint(30 << 3 | 3) + encode_varint(30 << 3 | 4))
    add(
        "group_wire_type", "an unknown field as a group (wire types 3/4)", msg_frame(grp), "malformed_message"
    )
    _, zero = sign_raw(ALICE, unsigned + b"\x00\x00")
    add("field_number_zero", "a field with number 0", msg_frame(zero), "malformed_message")
    add(
        "field_past_end",
        "field 9 declares more bytes than the body has",
        msg_frame(signed + field(9, 2, b"abcd")[:-2]),
        "malformed_message",
    )
    add(
        "body_truncated_varint",
        "the message body ends inside a tag varint (the frame is complete: a malformed message)",
        msg_frame(signed + b"\x80"),
        "malformed_message",
    )
    add(
        "body_varint_too_long",
        "unknown field 40 with an 11-byte varint value inside the message body",
        msg_frame(signed + encode_varint(40 << 3) + b"\xff" * 10 + b"\x01"),
        "malformed_message",
    )
    _, utf = sign_raw(ALICE, unsigned + field(4, 2, b'{"x":"\xff"}'))
    add(
        "invalid_utf8",
        "payload_json (a proto3 string) is not valid UTF-8",
        msg_frame(utf),
        "malformed_message",
    )

    # AgentIds
    upper = Message()
    upper.CopyFrom(ping)
    setattr(upper, "from", ALICE.agent_id.upper())
    _, up = sign_raw(ALICE, upper.SerializeToString(deterministic=True))
    add(
        "agent_id_uppercase",
        "`from` in uppercase hex (signature valid for the key)",
        msg_frame(up),
        "invalid_agent_id",
    )
    short = Message()
    short.CopyFrom(ping)
    setattr(short, "from", ALICE.agent_id[:62])
    _, sh = sign_raw(ALICE, short.SerializeToString(deterministic=True))
    add("agent_id_short", "`from` of 62 hex characters", msg_frame(sh), "invalid_agent_id")
    empty = Message()
    empty.CopyFrom(ping)
    setattr(empty, "from", "")
    _, em = sign_raw(ALICE, empty.SerializeToString(deterministic=True))
    add("agent_id_empty", "no `from`", msg_frame(em), "invalid_agent_id")

    # frames
    add("unknown_frame_type", "frame type 0x07", frame(0x07, 0, signed), "unknown_frame_type")
    add("frame_type_zero", "frame type 0x00", frame(0x00, 0, signed), "unknown_frame_type")
    add("unknown_flag", "flag bit 1 set", frame(FrameType.MESSAGE, 0x02, signed), "unknown_frame_flag")
    add(
        "unknown_flag_high",
        "flag bit 7 set with bit 0",
        frame(FrameType.MESSAGE, 0x81, signed),
        "unknown_frame_flag",
    )
    big = signed_of["delegate_task"]
    assert len(big) > SMALL_MAX
    add(
        "frame_too_large",
        f"body of {len(big)} bytes, max_frame_size {SMALL_MAX}",
        msg_frame(big),
        "frame_too_large",
        SMALL_MAX,
    )
    add(
        "length_too_large_no_body",
        "declares 2**32 bytes and stops: refused before any body arrives",
        bytes((FrameType.MESSAGE, 0)) + encode_varint(2**32),
        "frame_too_large",
    )
    add(
        "truncated_varint",
        "length varint with its continuation bit set, then the end",
        bytes((FrameType.MESSAGE, 0, 0x80)),
        "truncated_frame",
    )
    add("truncated_header", "only the type byte", bytes((FrameType.MESSAGE,)), "truncated_frame")
    add("truncated_body", "body shorter than its declared length", msg_frame(signed)[:-10], "truncated_frame")
    add(
        "varint_too_long",
        "length varint of 11 bytes",
        bytes((FrameType.MESSAGE, 0)) + b"\x80" * 10 + b"\x00",
        "bad_varint",
    )
    add(
        "varint_overflow",
        "10-byte length varint above 2**64 - 1",
        bytes((FrameType.MESSAGE, 0)) + b"\xff" * 9 + b"\x02",
        "bad_varint",
    )

    # zstd bodies (hand-built: raw and RLE blocks, no compressor involved)
    add(
        "zstd_no_content_size",
        "zstd frame header without a content size",
        frame(FrameType.MESSAGE, 1, zstd_raw(cmd, DICT_ID, declare_size=False)),
        "missing_content_size",
    )
    add(
        "zstd_bomb",
        "zstd frame declaring 4 MiB + 1 zero bytes in RLE blocks (about 130 bytes on the wire)",
        frame(FrameType.MESSAGE, 1, zstd_rle_bomb(DEFAULT_MAX_FRAME_SIZE + 1)),
        "decompression_bomb",
    )
    add(
        "zstd_declared_over_limit",
        f"zstd frame declaring {SMALL_MAX + 1} bytes, max_frame_size {SMALL_MAX}",
        frame(FrameType.MESSAGE, 1, zstd_rle_bomb(SMALL_MAX + 1)),
        "decompression_bomb",
        SMALL_MAX,
    )
    add(
        "zstd_trailing_data",
        "two bytes after the zstd frame",
        frame(FrameType.MESSAGE, 1, zstd_raw(cmd, DICT_ID) + b"\x00\x00"),
        "trailing_data",
    )
    add(
        "zstd_two_frames",
        "two zstd frames in one body",
        frame(FrameType.MESSAGE, 1, zstd_raw(cmd[:100]) + zstd_raw(cmd[100:])),
        "trailing_data",
    )
    add(
        "zstd_wrong_dictionary",
        f"zstd frame naming dictionary {WRONG_DICT_ID}, not in `dictionaries`",
        frame(FrameType.MESSAGE, 1, zstd_raw(cmd, WRONG_DICT_ID)),
        "unknown_dictionary",
    )
    add(
        "zstd_not_zstd",
        "flag 0 set on a body that is not zstd",
        frame(FrameType.MESSAGE, 1, cmd),
        "compression_error",
    )
    add(
        "zstd_truncated_block",
        "zstd raw block shorter than its header says",
        frame(FrameType.MESSAGE, 1, zstd_raw(cmd, DICT_ID)[:-5]),
        "compression_error",
    )
    add(
        "zstd_size_mismatch",
        "zstd frame declaring one byte more than its raw block holds",
        frame(FrameType.MESSAGE, 1, zstd_header(DICT_ID, len(cmd) + 1) + raw_block(cmd)),
        "compression_error",
    )
    # Block_Size is the 21-bit field of the block header; for an RLE block it is the size it
    # regenerates, so a 3-byte header and one byte say 128 KiB + 1
    add(
        "zstd_block_too_large",
        "an RLE block whose Block_Size field is 131 073 (128 KiB + 1), inside a frame declaring that size",
        frame(
            FrameType.MESSAGE,
            1,
            zstd_header(0, 131_073) + (131_073 << 3 | 1 << 1 | 1).to_bytes(3, "little") + b"\0",
        ),
        "compression_error",
    )
    # A declared content size of 0: a zstd library may return b"" without reading what follows.
    add(
        "zstd_zero_content_size",
        "zstd frame declaring 0 bytes (4-byte field), then a raw block holding the signed message",
        frame(FrameType.MESSAGE, 1, zstd_header(DICT_ID, 0) + raw_block(cmd)),
        "zero_content_size",
    )
    add(
        "zstd_zero_content_size_empty",
        "the zstd frame a compressor writes for an empty body: 1-byte content size 0, one empty raw block",
        frame(FrameType.MESSAGE, 1, ZSTD_MAGIC + bytes((0x20, 0)) + raw_block(b"")),
        "zero_content_size",
    )
    return out
