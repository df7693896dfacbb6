"""Building blocks of v1.json: fixed identities, the vector dictionary, hand-made bytes.

Protobuf fields, frames and zstd frames (raw and RLE blocks) are built by hand here, so the
vectors that use them do not depend on any serializer or compressor.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import iac
from iac import Identity, TaskState
from iac.wire import Dictionary, DictionarySet, Domain, FrameType, Session
from iac.wire._pb.iac_pb2 import Message
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE
from iac.wire.scan import encode_varint

ROOT = Path(__file__).resolve().parents[3]
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
            trained = iac.wire.train(dictionary_samples(), DICT_SIZE, dict_id=DICT_ID)
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
    """The vector's ``message`` object (the design input's field names, plus the later ones)."""
    out: dict[str, Any] = {
        "from": iac.wire.sender_of(msg),
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
        "stream_seq": msg.stream_seq,
        "credit": msg.credit,
        "principal": msg.principal,
    }
    if msg.HasField("trace"):
        out["trace"] = {"traceparent": msg.trace.traceparent, "tracestate": msg.trace.tracestate}
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
    msg = iac.wire.build_message(
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
    set_extension_fields(msg, m)
    return msg


def set_extension_fields(msg: Message, m: dict[str, Any]) -> None:
    """Fields 16-19 (``trace``, ``stream_seq``, ``credit``, ``principal``) from a ``message`` object."""
    if "trace" in m:
        msg.trace.traceparent = m["trace"]["traceparent"]
        msg.trace.tracestate = m["trace"]["tracestate"]
    msg.stream_seq = m.get("stream_seq", 0)
    msg.credit = m.get("credit", 0)
    msg.principal = m.get("principal", "")


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
        f = iac.wire.decode_frame(data, dictionaries=dicts, max_frame_size=max_size)
        return f.type == FrameType.MESSAGE and f.body == body and f.dict_id is not None

    return check
