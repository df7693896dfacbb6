"""Write proto/testvectors/v1.json: the byte-level contract with other implementations.

    .venv/bin/python tools/make_testvectors.py [--out DIR] [--check]

Everything comes from fixed seeds and fixed message fields, so the output is
deterministic. Two things depend on the zstd library version and are kept
stable on purpose:

* the vector dictionary (``dict-<id>.zdict`` beside ``v1.json``): trained once
  on a fixed sample set and then reused from the output folder (or from the
  committed copy) rather than retrained;
* ``frame_zstd_hex`` and the other zstd-compressed frames: an existing value in
  the output folder's ``v1.json`` is kept when it still decodes to the same
  bytes, so regenerating with another zstd version changes nothing.

Every other negative zstd frame is built by hand (raw and RLE blocks), so it
does not depend on any compressor. ``--check`` regenerates into memory and
exits 1 if the files on disk differ.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nacl.signing
import zstandard

import iac
from iac import (
    Dictionary,
    DictionarySet,
    Domain,
    FrameType,
    Identity,
    Intent,
    MessageType,
    Session,
    TaskState,
)
from iac.wire._pb.iac_pb2 import Hello, Message
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE
from iac.wire.scan import encode_varint, excise_signature

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "proto" / "testvectors"
VECTOR_FILE = "v1.json"
DICT_ID = 48879  # 0xBEEF, inside the range IAC picks ids from (32768..65535)
DICT_FILE = f"dict-{DICT_ID}.zdict"
DICT_SIZE = 4096
WRONG_DICT_ID = DICT_ID + 1
SMALL_MAX = 256  # max_frame_size used by the limit vectors

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def seed(n: int) -> bytes:
    """A fixed, recognisable 32-byte seed."""
    return bytes((n * 0x11 + i) & 0xFF for i in range(32))


ALICE = Identity.from_seed(seed(1))
BOB = Identity.from_seed(seed(2))
CAROL = Identity.from_seed(seed(3))


# --- the vector dictionary ------------------------------------------------------------------


def dictionary_samples() -> list[bytes]:
    """A fixed sample set shaped like agent payloads (no randomness, no external corpus)."""
    verbs = ["plan", "search", "summarize", "review", "compile", "deploy", "translate", "index"]
    states = ["submitted", "working", "completed", "failed", "input-required"]
    out: list[bytes] = []
    for i in range(240):
        v = verbs[i % len(verbs)]
        s = states[i % len(states)]
        kind = i % 4
        if kind == 0:
            obj: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": 1000 + i,
                "method": "tasks/send",
                "params": {"task": v, "step": i % 7 + 1, "state": s, "input": f"{v} item {i} of the report"},
            }
        elif kind == 1:
            obj = {"name": v, "args": [i, i * 3 % 11, f"doc-{i % 13}.md"], "timeout_ms": 1000 * (i % 5 + 1)}
        elif kind == 2:
            obj = {
                "task_id": f"task-{i % 17:04d}",
                "status": s,
                "result": {"summary": f"{v} finished for section {i % 9}", "tokens": 100 + i},
            }
        else:
            obj = {"code": ["bad_request", "timeout", "busy", "no_handler"][i % 4], "message": f"{v} {s}"}
        out.append(json.dumps(obj, separators=(",", ":"), sort_keys=True).encode())
    return out


def load_or_train_dictionary(out_dir: Path) -> Dictionary:
    """The dictionary beside v1.json; copied from the committed one or trained when absent."""
    target = out_dir / DICT_FILE
    if not target.exists():
        committed = DEFAULT_OUT / DICT_FILE
        if committed.exists() and committed.resolve() != target.resolve():
            shutil.copyfile(committed, target)
        else:
            trained = iac.train(dictionary_samples(), DICT_SIZE, dict_id=DICT_ID)
            target.write_bytes(trained.content)
    d = Dictionary.load(target)
    if d.dict_id != DICT_ID:
        raise SystemExit(f"{target}: dict_id {d.dict_id}, expected {DICT_ID}")
    return d


# --- byte helpers ---------------------------------------------------------------------------


def field(number: int, wire_type: int, value: bytes | int) -> bytes:
    """One protobuf field: tag, then the varint or the length-delimited value."""
    tag = encode_varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(value, int)
        return tag + encode_varint(value)
    assert isinstance(value, bytes)
    return tag + encode_varint(len(value)) + value


def frame(ftype: int, flags: int, body: bytes) -> bytes:
    return bytes((ftype, flags)) + encode_varint(len(body)) + body


def zstd_header(dict_id: int, content_size: int | None) -> bytes:
    """A zstd frame header: 2-byte dict id (or none), 4-byte or absent content size."""
    did_flag = 2 if dict_id else 0
    if content_size is None:
        # no content size: not single-segment, so a window descriptor follows (1 MiB window)
        fhd = did_flag
        out = ZSTD_MAGIC + bytes((fhd, 0x50))
    else:
        fhd = (2 << 6) | (1 << 5) | did_flag  # 4-byte content size, single segment
        out = ZSTD_MAGIC + bytes((fhd,))
    if dict_id:
        out += dict_id.to_bytes(2, "little")
    if content_size is not None:
        out += content_size.to_bytes(4, "little")
    return out


def zstd_raw(data: bytes, dict_id: int = 0, *, declare_size: bool = True) -> bytes:
    """A hand-built zstd frame holding ``data`` in one raw block (no compressor involved)."""
    return zstd_header(dict_id, len(data) if declare_size else None) + raw_block(data)


def raw_block(data: bytes) -> bytes:
    """One last zstd block of type raw."""
    assert len(data) < 128 * 1024
    return (len(data) << 3 | 0 << 1 | 1).to_bytes(3, "little") + data


def zstd_rle_bomb(size: int) -> bytes:
    """A hand-built zstd frame of ``size`` zero bytes as RLE blocks: a few hundred bytes on the wire."""
    out = bytearray(zstd_header(0, size))
    left = size
    while left:
        n = min(left, 128 * 1024)
        left -= n
        out += (n << 3 | 1 << 1 | (0 if left else 1)).to_bytes(3, "little") + b"\x00"
    return bytes(out)


# --- messages -------------------------------------------------------------------------------


def message_json(msg: Message) -> dict[str, Any]:
    """The vector's ``message`` object (SPEC section 9 names, plus the later fields)."""
    out: dict[str, Any] = {
        "from": iac.sender_of(msg),
        "to": msg.to,
        "msg_type": int(msg.msg_type),
        "payload_json": msg.payload_json,
        "timestamp": msg.timestamp,
        "msg_id": msg.msg_id,
        "session_id": msg.session_id,
        "extra_data_hex": msg.extra_data.hex(),
        "reply_to": msg.reply_to,
        "flags": msg.flags,
        "sealed_hex": msg.sealed.hex(),
        "reply_session_id": msg.reply_session_id,
        "deadline": msg.deadline,
    }
    if msg.HasField("task"):
        t = msg.task
        out["task"] = {
            "task_id": t.task_id,
            "intent": int(t.intent),
            "step": t.step,
            "steps": t.steps,
            "state_ref": t.state_ref,
        }
    return out


def message_from_json(m: dict[str, Any]) -> Message:
    """Rebuild an unsigned Message from a vector's ``message`` object (used by the tests too)."""
    task = None
    if "task" in m:
        t = m["task"]
        task = TaskState(
            task_id=t["task_id"],
            intent=t["intent"],
            step=t["step"],
            steps=t["steps"],
            state_ref=t["state_ref"],
        )
    return iac.build_message(
        sender=m["from"],
        to=m["to"],
        msg_type=m["msg_type"],
        session=Session(session_id=m["session_id"]),
        msg_id=m["msg_id"],
        timestamp_us=m["timestamp"],
        payload_json=m["payload_json"],
        extra_data=bytes.fromhex(m["extra_data_hex"]),
        reply_to=m["reply_to"],
        reply_session_id=m.get("reply_session_id", 0),
        flags=m.get("flags", 0),
        sealed=bytes.fromhex(m.get("sealed_hex", "")),
        deadline_us=m.get("deadline", 0),
        task=task,
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
    return iac.build_message(**args)


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
                flags=iac.FLAG_ACK_REQUESTED,
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
                flags=iac.FLAG_ACK_REQUESTED | iac.FLAG_ORDERED,
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
    ]


def sign_raw(ident: Identity, unsigned: bytes, domain: Domain = Domain.MESSAGE) -> tuple[bytes, bytes]:
    """Sign unsigned bytes; return (signature, signed bytes with field 8 appended)."""
    sig = ident.sign(domain, unsigned)
    return sig, unsigned + field(8, 2, sig)


def dict_frame(d: Dictionary, body: bytes) -> bytes:
    """A MESSAGE frame with the body zstd-compressed by ``d`` (even when that does not shrink it)."""
    return frame(FrameType.MESSAGE, 1, d.compress(body))


def keep_if_same(old: str | None, check: Callable[[bytes], bool], new: bytes) -> str:
    """Keep a previously written compressed frame when it still decodes as required."""
    if old:
        try:
            if check(bytes.fromhex(old)):
                return old
        except iac.IacError:
            pass
    return new.hex()


def decodes_to(
    dicts: DictionarySet, body: bytes, max_size: int = DEFAULT_MAX_FRAME_SIZE
) -> Callable[[bytes], bool]:
    def check(data: bytes) -> bool:
        f = iac.decode_frame(data, dictionaries=dicts, max_frame_size=max_size)
        return f.type == FrameType.MESSAGE and f.body == body and f.dict_id is not None

    return check


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
        signed = iac.sign_hello(ident, h, domain)
        assert signed == unsigned + field(15, 2, h.signature)
        iac.open_hello(signed, domain)
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
    ]
    return out, negative


# --- the whole file -------------------------------------------------------------------------


def build(out_dir: Path, previous: dict[str, Any] | None) -> dict[str, Any]:
    d = load_or_train_dictionary(out_dir)
    dicts = DictionarySet([d])
    prev_zstd: dict[str, str] = {}
    if previous:
        for v in previous.get("vectors", []):
            prev_zstd["vector:" + v["name"]] = v.get("frame_zstd_hex", "")
        for v in previous.get("accept", []):
            prev_zstd["accept:" + v["name"]] = v.get("frame_hex", "")

    vectors: list[dict[str, Any]] = []
    signed_of: dict[str, bytes] = {}
    for name, description, ident, msg in positive_messages():
        unsigned = iac.unsigned_bytes(msg)
        signed = iac.sign_message(ident, msg)
        signature = bytes(msg.signature)
        assert excise_signature(signed) == (unsigned, signature)
        iac.open_message(signed)
        signed_of[name] = signed
        zstd_hex = keep_if_same(
            prev_zstd.get("vector:" + name), decodes_to(dicts, signed), dict_frame(d, signed)
        )
        vectors.append(
            {
                "name": name,
                "description": description,
                "seed_hex": ident.seed().hex(),
                "agent_id": ident.agent_id,
                "message": message_json(msg),
                "unsigned_hex": unsigned.hex(),
                "signature_hex": signature.hex(),
                "signed_hex": signed.hex(),
                "frame_raw_hex": frame(FrameType.MESSAGE, 0, signed).hex(),
                "frame_zstd_hex": zstd_hex,
                "dict_id": DICT_ID,
            }
        )

    accept = accept_vectors(d, dicts, signed_of, prev_zstd)
    hello, hello_negative = hello_vectors()
    negative = negative_vectors(d, signed_of)
    return {
        "version": 1,
        "dictionaries": {str(DICT_ID): DICT_FILE},
        "vectors": vectors,
        "accept": accept,
        "hello": hello,
        "hello_negative": hello_negative,
        "negative": negative,
    }


def accept_vectors(
    d: Dictionary, dicts: DictionarySet, signed_of: dict[str, bytes], prev: dict[str, str]
) -> list[dict[str, Any]]:
    """Frames a receiver must accept although a canonical serializer would never produce them."""
    ping_unsigned = bytes.fromhex(iac.unsigned_bytes(positive_messages()[0][3]).hex())
    out: list[dict[str, Any]] = []

    def add(name: str, description: str, ident: Identity, unsigned: bytes, signed: bytes, fr: bytes) -> None:
        iac.open_message(signed)
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
        bytes.fromhex(iac.unsigned_bytes(positive_messages()[1][3]).hex()),
        signed,
        frame(FrameType.MESSAGE, 1, zstd_raw(signed, DICT_ID)),
    )

    # zstd without a dictionary (dict id 0), and with a checksum
    signed = signed_of["delegate_task"]
    unsigned_dt = iac.unsigned_bytes(positive_messages()[2][3])
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


def negative_vectors(d: Dictionary, signed_of: dict[str, bytes]) -> list[dict[str, Any]]:
    """Frames every receiver must refuse, each with the error name it must map to."""
    ping = positive_messages()[0][3]
    unsigned = iac.unsigned_bytes(ping)
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
    # a small-order public key (the identity point) with R = identity, S = 0: a plain
    # cofactorless check accepts it for every message; libsodium refuses small-order keys
    ident_point = "01" + "00" * 31
    small = Message(to=BOB.agent_id, msg_type=MessageType.PING, timestamp=T0, msg_id=1, session_id=1)
    setattr(small, "from", ident_point)
    small_unsigned = small.SerializeToString(deterministic=True)
    forged = bytes.fromhex(ident_point) + bytes(32)
    add(
        "small_order_key",
        "`from` is the identity point; signature R = identity, S = 0",
        msg_frame(small_unsigned + field(8, 2, forged)),
        "bad_signature",
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
    dt_unsigned = iac.unsigned_bytes(dt)
    task_bytes = dt.task.SerializeToString(deterministic=True)
    task_field = field(11, 2, task_bytes)
    assert task_field in dt_unsigned
    bad_task = field(11, 2, task_bytes + field(3, 0, 2))
    _, rep = sign_raw(ALICE, dt_unsigned.replace(task_field, bad_task))
    add("task_step_repeated", "TaskState.step (nested field 3) twice", msg_frame(rep), "field_repeated")
    _, rep = sign_raw(ALICE, dt_unsigned + task_field)
    add("task_repeated", "field 11 (task) twice", msg_frame(rep), "field_repeated")
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
    return out


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default proto/testvectors)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the files on disk are not up to date")
    args = ap.parse_args(argv)
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / VECTOR_FILE
    previous = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    text = dumps(build(out_dir, previous))
    if args.check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            print(f"{path}: out of date; run tools/make_testvectors.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    doc = json.loads(text)
    print(
        f"{path}: {len(doc['vectors'])} vectors, {len(doc['accept'])} accept, {len(doc['hello'])} hello, "
        f"{len(doc['negative'])} negative; dictionary {DICT_FILE}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
