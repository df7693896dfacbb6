"""Opening a message: the field-8 scan, the protobuf parse, the ``from`` check and the signature.

Input: the last byte picks the entry point -- 0: :func:`~iac.wire.message.decode_message_frame`
(a MESSAGE frame, zstd with the vectors' dictionaries, 64 KiB ``max_frame_size``), 1:
:func:`~iac.wire.message.open_message` on message bytes -- and the rest is the frame or message.

Checked besides the bounds: where the scan's fast path for canonical messages finds a signature
span, the full scan accepts the bytes with the same span (the fast path may only decide what the
full scan would decide the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

from iac.errors import IacError
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, decode_frame_body
from iac.wire.message import decode_message_frame, open_message
from iac.wire.scan import MESSAGE_SCHEMA, _message_span_fast, _scan
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import MAX_FRAME, FuzzedDataProvider, Layout, vectors
from tests.fuzz.targets.frames import dictionaries

FRAME, MESSAGE = 0, 1


@dataclass(frozen=True)
class Plan:
    entry: int
    data: bytes


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    entry = fdp.ConsumeIntInRange(0, 1)
    return Plan(entry, fdp.ConsumeBytes(fdp.remaining_bytes()))


def layout(plan: Plan) -> bytes:
    return Layout().int(plan.entry, 0, 1).bytes(plan.data).build()


def check_scan(data: bytes) -> None:
    fast = _message_span_fast(data)
    if fast is None:
        return
    try:
        full = _scan(data, 0, len(data), MESSAGE_SCHEMA)
    except IacError as exc:
        check_error(exc)
        raise Finding(f"the scan's fast path takes bytes that the full scan refuses ({exc.reason})") from exc
    if full != fast:
        raise Finding(f"the scan's fast path finds the signature at {fast}, the full scan at {full}")


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    if plan.entry == FRAME:
        decode_message_frame(plan.data, dictionaries=dictionaries(), max_frame_size=MAX_FRAME)
    else:
        check_scan(plan.data)
        open_message(plan.data)


def seeds() -> dict[str, bytes]:
    """The vectors' frames (raw and zstd) and their signed message bytes, good and bad."""
    v1 = vectors("v1")
    out: dict[str, bytes] = {}
    for vec in v1["vectors"]:
        out[f"{vec['name']}-raw"] = layout(Plan(FRAME, bytes.fromhex(vec["frame_raw_hex"])))
        out[f"{vec['name']}-zstd"] = layout(Plan(FRAME, bytes.fromhex(vec["frame_zstd_hex"])))
        out[f"{vec['name']}-signed"] = layout(Plan(MESSAGE, bytes.fromhex(vec["signed_hex"])))
    for vec in v1["accept"]:
        out[vec["name"]] = layout(Plan(FRAME, bytes.fromhex(vec["frame_hex"])))
        out[f"{vec['name']}-signed"] = layout(Plan(MESSAGE, bytes.fromhex(vec["signed_hex"])))
    for vec in v1["negative"]:
        frame = bytes.fromhex(vec["frame_hex"])
        out[vec["name"]] = layout(Plan(FRAME, frame))
        try:
            _type, body = decode_frame_body(frame, dictionaries(), DEFAULT_MAX_FRAME_SIZE)
        except IacError:
            continue  # the fault is in the frame, not in the message
        out[f"{vec['name']}-signed"] = layout(Plan(MESSAGE, body))
    return out
