"""The vectors a receiver must accept: signed messages, HELLOs, and non-canonical frames."""

from __future__ import annotations

import json
from typing import Any

import zstandard

import iac
from iac import Identity, Intent, MessageType, TaskState
from iac.wire import Dictionary, DictionarySet, Domain, FrameType, Session
from iac.wire._pb.iac_pb2 import Hello, Message
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE
from iac.wire.identity import signing_input
from iac.wire.message import FLAG_END, FLAG_STREAM
from tools.vectors import points
from tools.vectors.wire.common import (
    ALICE,
    BOB,
    CAROL,
    DICT_ID,
    T0,
    decodes_to,
    field,
    frame,
    keep_if_same,
    set_extension_fields,
    sign_raw,
    zstd_raw,
)


def _msg(ident: Identity, **kw: Any) -> Message:
    args: dict[str, Any] = {
        "sender": ident.agent_id,
        "to": BOB.agent_id,
        "msg_type": MessageType.PING,
        "session": Session(session_id=0x1234_5678_9ABC_DEF0),
        "timestamp_us": T0,
        "msg_id": 1,
    }
    args.update(kw)
    return iac.wire.build_message(**args)


def positive_messages() -> list[tuple[str, str, Identity, Message]]:
    """(name, description, signer, unsigned message) for every positive vector."""
    big_payload = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1042,
            "method": "tasks/send",
            "params": {
                "task": "summarize",
                "step": 2,
                "state": "working",
                "input": "summarize item 7 of the report",
            },
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    return [
        ("ping_minimal", "PING with no payload", ALICE, _msg(ALICE)),
        (
            "command",
            "COMMAND with a JSON payload, ACK_REQUESTED",
            ALICE,
            _msg(
                ALICE,
                msg_type=MessageType.COMMAND,
                msg_id=7,
                payload_json='{"args":[1,2],"name":"add"}',
                flags=iac.wire.FLAG_ACK_REQUESTED,
            ),
        ),
        (
            "delegate_task",
            "DELEGATE_TASK with a TaskState, both flags and a deadline",
            ALICE,
            _msg(
                ALICE,
                msg_type=MessageType.DELEGATE_TASK,
                msg_id=8,
                payload_json=big_payload,
                task=TaskState(
                    task_id="task-0007",
                    intent=Intent.ASSIGN_TASK,
                    step=1,
                    steps=3,
                    state_ref="redis://state/task-0007",
                ),
                flags=iac.wire.FLAG_ACK_REQUESTED | iac.wire.FLAG_ORDERED,
                deadline_us=T0 + 30_000_000,
            ),
        ),
        (
            "reply_unicode",
            "REPLY from Bob answering Alice's command: non-ASCII payload, reply_to and reply_session_id",
            BOB,
            _msg(
                BOB,
                to=ALICE.agent_id,
                msg_type=MessageType.REPLY,
                session=Session(session_id=0x0FED_CBA9_8765_4321),
                msg_id=3,
                timestamp_us=T0 + 1_500,
                payload_json=json.dumps(
                    {"result": "Grüße, 世界 — ünïcödé ✓ 🚀", "n": 3}, ensure_ascii=False, sort_keys=True
                ),
                reply_to=7,
                reply_session_id=0x1234_5678_9ABC_DEF0,
            ),
        ),
        (
            "error_reply",
            "ERROR answering the delegated task",
            BOB,
            _msg(
                BOB,
                to=ALICE.agent_id,
                msg_type=MessageType.ERROR,
                session=Session(session_id=0x0FED_CBA9_8765_4321),
                msg_id=4,
                timestamp_us=T0 + 2_000,
                payload_json='{"code":"busy","message":"queue full, retry later"}',
                reply_to=8,
                reply_session_id=0x1234_5678_9ABC_DEF0,
            ),
        ),
        (
            "file_transfer_chunk",
            "FILE_TRANSFER with binary extra_data (every byte value)",
            ALICE,
            _msg(
                ALICE,
                msg_type=MessageType.FILE_TRANSFER,
                msg_id=9,
                payload_json=(
                    '{"index":0,"name":"bytes.bin","sha256":'
                    '"40aff2e9d2d8922e47afd4648e6967497158785fbd1da870e7110266bf944880","size":256,'
                    '"total":1,"transfer_id":"t-1"}'
                ),
                extra_data=bytes(range(256)),
            ),
        ),
        (
            "broadcast",
            "BROADCAST: empty `to`",
            CAROL,
            _msg(
                CAROL,
                to="",
                msg_type=MessageType.BROADCAST,
                session=Session(session_id=0x0000_0000_0000_0001),
                msg_id=1,
                payload_json='{"capabilities":["search","summarize"],"status":"online"}',
            ),
        ),
        (
            "max_integers",
            "CANCEL with every integer at its maximum (10-byte varints)",
            ALICE,
            _msg(
                ALICE,
                msg_type=MessageType.CANCEL,
                session=Session(session_id=2**64 - 1),
                msg_id=2**64 - 1,
                timestamp_us=2**64 - 1,
                reply_to=2**64 - 1,
                reply_session_id=2**64 - 1,
                deadline_us=2**64 - 1,
                flags=2**32 - 1,
            ),
        ),
        (
            "stream_request_traced",
            "COMMAND asking for a streamed answer (flag STREAM, credit 4) with a trace context (field 16) "
            "and a principal (field 19)",
            ALICE,
            _with(
                _msg(
                    ALICE,
                    msg_type=MessageType.COMMAND,
                    msg_id=10,
                    payload_json='{"name":"tail","args":["log"]}',
                    flags=FLAG_STREAM,
                    deadline_us=T0 + 60_000_000,
                ),
                trace={"traceparent": TRACEPARENT, "tracestate": "congo=t61rcWkgMzE"},
                credit=4,
                principal="user:ana@example.com",
            ),
        ),
        (
            "stream_part",
            "REPLY part 1 of that stream (flag STREAM, stream_seq 1, field 17)",
            BOB,
            _with(
                _msg(
                    BOB,
                    to=ALICE.agent_id,
                    msg_type=MessageType.REPLY,
                    session=Session(session_id=0x0FED_CBA9_8765_4321),
                    msg_id=5,
                    timestamp_us=T0 + 2_500,
                    payload_json='{"line":"first"}',
                    reply_to=10,
                    reply_session_id=0x1234_5678_9ABC_DEF0,
                    flags=FLAG_STREAM,
                ),
                stream_seq=1,
            ),
        ),
        (
            "stream_end",
            "the END of that stream (flags STREAM|END, stream_seq 2, empty payload)",
            BOB,
            _with(
                _msg(
                    BOB,
                    to=ALICE.agent_id,
                    msg_type=MessageType.REPLY,
                    session=Session(session_id=0x0FED_CBA9_8765_4321),
                    msg_id=6,
                    timestamp_us=T0 + 3_000,
                    reply_to=10,
                    reply_session_id=0x1234_5678_9ABC_DEF0,
                    flags=FLAG_STREAM | FLAG_END,
                ),
                stream_seq=2,
            ),
        ),
        (
            "credit",
            "CREDIT (type 14) granting that stream 8 parts in all (field 18)",
            ALICE,
            _with(
                _msg(
                    ALICE,
                    msg_type=MessageType.CREDIT,
                    msg_id=11,
                    timestamp_us=T0 + 2_800,
                    reply_to=10,
                    reply_session_id=0x1234_5678_9ABC_DEF0,
                ),
                credit=8,
            ),
        ),
    ]


#: the W3C Trace Context specification's example traceparent (55 characters, version 00)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _with(msg: Message, **fields: Any) -> Message:
    """``msg`` with fields 16-19 set as in a vector's ``message`` object."""
    set_extension_fields(msg, fields)
    return msg


# --- HELLO ----------------------------------------------------------------------------------


def hello_json(h: Hello) -> dict[str, Any]:
    return {
        "version": h.version,
        "agent_id": h.agent_id,
        "session_id": h.session_id,
        "timestamp": h.timestamp,
        "nonce_hex": h.nonce.hex(),
        "peer_nonce_hex": h.peer_nonce.hex(),
        "dict_ids": list(h.dict_ids),
        "max_frame_size": h.max_frame_size,
        "listen_addrs": list(h.listen_addrs),
        "capabilities": list(h.capabilities),
        "channel_binding_hex": h.channel_binding.hex(),
        "peer_agent_id": h.peer_agent_id,
    }


def hello_from_json(h: dict[str, Any]) -> Hello:
    return Hello(
        version=h["version"],
        agent_id=h["agent_id"],
        session_id=h["session_id"],
        timestamp=h["timestamp"],
        nonce=bytes.fromhex(h["nonce_hex"]),
        peer_nonce=bytes.fromhex(h["peer_nonce_hex"]),
        dict_ids=h["dict_ids"],
        max_frame_size=h["max_frame_size"],
        listen_addrs=h["listen_addrs"],
        capabilities=h["capabilities"],
        channel_binding=bytes.fromhex(h["channel_binding_hex"]),
        peer_agent_id=h["peer_agent_id"],
    )


def hello_vectors() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    binding = bytes.fromhex("5f" * 32)
    client = Hello(
        version=1,
        agent_id=ALICE.agent_id,
        session_id=0x1234_5678_9ABC_DEF0,
        timestamp=T0,
        nonce=bytes(range(16)),
        dict_ids=[DICT_ID],
        max_frame_size=DEFAULT_MAX_FRAME_SIZE,
        listen_addrs=["quic://127.0.0.1:7700", "tls://127.0.0.1:7700"],
        capabilities=["search", "summarize"],
        channel_binding=binding,
        peer_agent_id=BOB.agent_id,
    )
    server = Hello(
        version=1,
        agent_id=BOB.agent_id,
        session_id=0x0FED_CBA9_8765_4321,
        timestamp=T0 + 800,
        nonce=bytes(range(16, 32)),
        peer_nonce=bytes(range(16)),
        dict_ids=[DICT_ID],
        max_frame_size=DEFAULT_MAX_FRAME_SIZE,
        channel_binding=binding,
        peer_agent_id=ALICE.agent_id,
    )
    out: list[dict[str, Any]] = []
    signed_by_name: dict[str, bytes] = {}
    unsigned_by_name: dict[str, bytes] = {}
    for name, ident, h, domain in (
        ("hello_client", ALICE, client, Domain.HELLO_CLIENT),
        ("hello_server", BOB, server, Domain.HELLO_SERVER),
    ):
        unsigned = h.SerializeToString(deterministic=True)
        signed = iac.wire.sign_hello(ident, h, domain)
        assert signed == unsigned + field(15, 2, h.signature)
        iac.wire.open_hello(signed, domain)
        signed_by_name[name] = signed
        unsigned_by_name[name] = unsigned
        out.append(
            {
                "name": name,
                "seed_hex": ident.seed().hex(),
                "agent_id": ident.agent_id,
                "domain": domain.value.decode(),
                "hello": hello_json(h),
                "unsigned_hex": unsigned.hex(),
                "signature_hex": h.signature.hex(),
                "signed_hex": signed.hex(),
                "frame_raw_hex": frame(FrameType.HELLO, 0, signed).hex(),
            }
        )
    negative = [
        {
            "name": "hello_reflected",
            "description": "the client's HELLO checked in the server domain (a reflected HELLO)",
            "domain": Domain.HELLO_SERVER.value.decode(),
            "frame_hex": frame(FrameType.HELLO, 0, signed_by_name["hello_client"]).hex(),
            "error": "bad_signature",
        },
        {
            "name": "hello_signature_missing",
            "description": "field 15 absent",
            "domain": Domain.HELLO_CLIENT.value.decode(),
            "frame_hex": frame(FrameType.HELLO, 0, unsigned_by_name["hello_client"]).hex(),
            "error": "signature_missing",
        },
        {
            "name": "hello_small_order_key",
            "description": "agent_id is a point of order 8; signature R = identity, S = 0 over a HELLO "
            "whose h is a multiple of 8 (a plain cofactorless check accepts it)",
            "domain": Domain.HELLO_CLIENT.value.decode(),
            "frame_hex": frame(FrameType.HELLO, 0, _small_order_hello(client)).hex(),
            "error": "invalid_agent_id",
        },
    ]
    return out, negative


def _small_order_hello(template: Hello) -> bytes:
    """``template`` from a key of order 8, with the first session_id that lets R = identity, S = 0 pass
    a plain check."""
    key = points.encode(points.ORDER_8)
    h = Hello()
    h.CopyFrom(template)
    h.agent_id = key.hex()
    h.ClearField("signature")

    def make(i: int) -> bytes:
        h.session_id = i
        return signing_input(Domain.HELLO_CLIENT, h.SerializeToString(deterministic=True))

    data, sig, _ = points.forge_small_order(key, make)
    return data[len(Domain.HELLO_CLIENT.value) + 1 :] + field(15, 2, sig)


def accept_vectors(
    d: Dictionary, dicts: DictionarySet, signed_of: dict[str, bytes], prev: dict[str, str]
) -> list[dict[str, Any]]:
    """Frames a receiver must accept although a canonical serializer would never produce them."""
    ping_unsigned = bytes.fromhex(iac.wire.unsigned_bytes(positive_messages()[0][3]).hex())
    out: list[dict[str, Any]] = []

    def add(name: str, description: str, ident: Identity, unsigned: bytes, signed: bytes, fr: bytes) -> None:
        iac.wire.open_message(signed)
        out.append(
            {
                "name": name,
                "description": description,
                "agent_id": ident.agent_id,
                "frame_hex": fr.hex(),
                "max_frame_size": DEFAULT_MAX_FRAME_SIZE,
                "signed_hex": signed.hex(),
                "unsigned_hex": unsigned.hex(),
            }
        )

    # unknown fields (a newer sender) are signed and must stay in the verified bytes
    unsigned = ping_unsigned + field(40, 0, 12345) + field(41, 2, b"future")
    sig, signed = sign_raw(ALICE, unsigned)
    add(
        "unknown_fields",
        "fields 40 and 41 unknown to v1: kept, signed, verified",
        ALICE,
        unsigned,
        signed,
        frame(FrameType.MESSAGE, 0, signed),
    )

    # field 20 is the first number v1 does not know: skipped, and it may repeat
    unsigned = ping_unsigned + field(20, 0, 1) + field(20, 2, b"again")
    sig, signed = sign_raw(ALICE, unsigned)
    add(
        "unknown_field_20_repeated",
        "field 20 (above the known 1-19) twice, with two wire types: kept, signed, verified",
        ALICE,
        unsigned,
        signed,
        frame(FrameType.MESSAGE, 0, signed),
    )

    # field 8 first: the verifier removes it wherever it is
    unsigned = ping_unsigned
    sig = ALICE.sign(Domain.MESSAGE, unsigned)
    signed = field(8, 2, sig) + unsigned
    add(
        "signature_first",
        "field 8 before every other field",
        ALICE,
        unsigned,
        signed,
        frame(FrameType.MESSAGE, 0, signed),
    )

    # fields out of order and a non-minimal varint: verified over the bytes as received
    m = positive_messages()[1][3]
    unsigned = (
        field(6, 0, 7)[:-1]
        + b"\x87\x00"  # msg_id 7 as a two-byte varint
        + field(4, 2, m.payload_json.encode())
        + field(1, 2, ALICE.agent_id.encode())
        + field(2, 2, BOB.agent_id.encode())
        + field(3, 0, int(MessageType.COMMAND))
        + field(5, 0, T0)
        + field(7, 0, m.session_id)
    )
    sig, signed = sign_raw(ALICE, unsigned)
    add(
        "non_canonical_order",
        "fields out of order, msg_id as a non-minimal varint",
        ALICE,
        unsigned,
        signed,
        frame(FrameType.MESSAGE, 0, signed),
    )

    # a zstd body in raw blocks (any compressor may emit them) with the vector dictionary's id
    signed = signed_of["command"]
    add(
        "zstd_raw_block",
        "zstd frame of one raw block naming the dictionary",
        ALICE,
        bytes.fromhex(iac.wire.unsigned_bytes(positive_messages()[1][3]).hex()),
        signed,
        frame(FrameType.MESSAGE, 1, zstd_raw(signed, DICT_ID)),
    )

    # zstd without a dictionary (dict id 0), and with a checksum
    signed = signed_of["delegate_task"]
    unsigned_dt = iac.wire.unsigned_bytes(positive_messages()[2][3])
    plain = zstandard.ZstdCompressor(level=3, write_content_size=True, write_dict_id=False).compress(signed)
    fr_hex = keep_if_same(
        prev.get("accept:zstd_no_dictionary"), decodes_to(dicts, signed), frame(FrameType.MESSAGE, 1, plain)
    )
    add(
        "zstd_no_dictionary",
        "zstd frame with dictionary id 0",
        ALICE,
        unsigned_dt,
        signed,
        bytes.fromhex(fr_hex),
    )
    zd = zstandard.ZstdCompressionDict(d.content, dict_type=zstandard.DICT_TYPE_FULLDICT)
    checked = zstandard.ZstdCompressor(
        level=3, dict_data=zd, write_checksum=True, write_content_size=True, write_dict_id=True
    ).compress(signed)
    fr_hex = keep_if_same(
        prev.get("accept:zstd_checksum"), decodes_to(dicts, signed), frame(FrameType.MESSAGE, 1, checked)
    )
    add(
        "zstd_checksum",
        "zstd frame with the dictionary and a content checksum",
        ALICE,
        unsigned_dt,
        signed,
        bytes.fromhex(fr_hex),
    )
    return out
