"""Protobuf wire-level helpers: varints and the signature-field scan.

Verification never re-serializes a message. :func:`excise_signature` walks the
*received* bytes, removes the signature field and returns what is left (the
exact bytes the sender signed). To leave no room for two parsers to disagree
about what was signed, the scan refuses a message where the signature field is
missing, repeated, not length-delimited or not 64 bytes, where any other
singular known field occurs more than once or with the wrong wire type, and
any group or invalid wire type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from iac.errors import IacError, ProtocolError

VARINT = 0
I64 = 1
LEN = 2
I32 = 5

SIGNATURE_SIZE = 64


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer below 2**64."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """Read a varint at ``pos``; return ``(value, new_pos)``.

    Raises ``truncated_frame`` when the input ends inside it and
    ``bad_varint`` when it runs past 10 bytes or 64 bits.
    """
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ProtocolError("input ends inside a varint", reason="truncated_frame")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if result >> 64:
                raise ProtocolError("varint overflows 64 bits", reason="bad_varint")
            return result, pos
        shift += 7
        if shift >= 70:
            raise ProtocolError("varint longer than 10 bytes", reason="bad_varint")


@dataclass(frozen=True, slots=True)
class Schema:
    """What the scan knows of a message type: wire type per field, and which repeat."""

    name: str
    wire_types: dict[int, tuple[int, ...]]
    repeated: frozenset[int]
    nested: dict[int, Schema]
    signature_field: int | None = None
    #: per field number: a bit per allowed wire type (0: unknown field); derived
    masks: tuple[int, ...] = field(init=False)
    #: a bit per field number that may repeat; derived
    repeat_bits: int = field(init=False)

    def __post_init__(self) -> None:
        masks = [0] * (max(self.wire_types) + 1)
        for number, wts in self.wire_types.items():
            for wt in wts:
                masks[number] |= 1 << wt
        object.__setattr__(self, "masks", tuple(masks))
        object.__setattr__(self, "repeat_bits", sum(1 << n for n in self.repeated))


TASK_STATE_SCHEMA = Schema(
    "TaskState",
    {1: (LEN,), 2: (VARINT,), 3: (VARINT,), 4: (VARINT,), 5: (LEN,)},
    frozenset(),
    {},
)

TRACE_CONTEXT_SCHEMA = Schema("TraceContext", {1: (LEN,), 2: (LEN,)}, frozenset(), {})

MESSAGE_SCHEMA = Schema(
    "Message",
    {
        1: (LEN,), 2: (LEN,), 3: (VARINT,), 4: (LEN,), 5: (VARINT,), 6: (VARINT,),
        7: (VARINT,), 8: (LEN,), 9: (LEN,), 10: (VARINT,), 11: (LEN,), 12: (VARINT,),
        13: (LEN,), 14: (VARINT,), 15: (VARINT,), 16: (LEN,), 17: (VARINT,), 18: (VARINT,),
        19: (LEN,),
    },
    frozenset(),
    {11: TASK_STATE_SCHEMA, 16: TRACE_CONTEXT_SCHEMA},
    signature_field=8,
)  # fmt: skip

#: ``iac.Forward``: fields 4 and 5 are the origin of a compact Forward (``elide-forward/1``).
FORWARD_SCHEMA = Schema(
    "Forward", {1: (VARINT,), 2: (LEN,), 3: (LEN,), 4: (LEN,), 5: (LEN,)}, frozenset({2}), {}
)

HELLO_SCHEMA = Schema(
    "Hello",
    {
        1: (VARINT,), 2: (LEN,), 3: (VARINT,), 4: (VARINT,), 5: (LEN,), 6: (LEN,),
        7: (VARINT, LEN), 8: (VARINT,), 9: (LEN,), 10: (LEN,), 11: (LEN,), 12: (LEN,),
        15: (LEN,),
    },
    frozenset({7, 9, 10}),
    {},
    signature_field=15,
)  # fmt: skip


def _scan(data: bytes | memoryview, start: int, end: int, schema: Schema) -> tuple[int, int] | None:
    """Validate fields in ``data[start:end]``; return the signature field's (start, end) span."""
    try:
        return _scan_fields(data, start, end, schema)
    except ProtocolError as exc:
        if exc.reason not in ("truncated_frame", "bad_varint"):
            raise
        raise ProtocolError(f"{schema.name}: {exc}", reason="malformed_message") from None


def _scan_fields(data: bytes | memoryview, start: int, end: int, schema: Schema) -> tuple[int, int] | None:
    seen = 0  # bit per field number already seen
    sig_span: tuple[int, int] | None = None
    sig_field = schema.signature_field
    masks = schema.masks
    n_masks = len(masks)
    repeat_bits = schema.repeat_bits
    nested = schema.nested
    pos = start
    while pos < end:
        field_start = pos
        tag = data[pos]
        if tag < 0x80:
            pos += 1
        else:
            tag, pos = decode_varint(data, pos, end)
        number = tag >> 3
        wt = tag & 7
        if number == 0:
            raise ProtocolError(f"{schema.name}: field number 0", reason="malformed_message")
        value_start = pos
        if wt == VARINT:
            limit = pos + 10
            while True:
                if pos >= end:
                    raise ProtocolError(
                        f"{schema.name}: field {number} runs past the end", reason="malformed_message"
                    )
                if pos >= limit:
                    raise ProtocolError(
                        f"{schema.name}: varint longer than 10 bytes", reason="malformed_message"
                    )
                b = data[pos]
                pos += 1
                if b < 0x80:
                    break
        elif wt == LEN:
            if pos >= end:
                raise ProtocolError(
                    f"{schema.name}: field {number} runs past the end", reason="malformed_message"
                )
            length = data[pos]
            if length < 0x80:
                pos += 1
            else:
                length, pos = decode_varint(data, pos, end)
            value_start = pos
            pos += length
            if pos > end:
                raise ProtocolError(
                    f"{schema.name}: field {number} runs past the end", reason="malformed_message"
                )
            if nested:
                sub = nested.get(number)
                if sub is not None:
                    _scan_fields(data, value_start, pos, sub)
        elif wt == I64:
            pos += 8
        elif wt == I32:
            pos += 4
        else:
            raise ProtocolError(
                f"{schema.name}: field {number} has wire type {wt}", reason="malformed_message"
            )
        if pos > end:
            raise ProtocolError(
                f"{schema.name}: field {number} runs past the end", reason="malformed_message"
            )
        allowed = masks[number] if number < n_masks else 0
        if not allowed:
            continue  # unknown field: skipped by every parser alike
        if number == sig_field:
            if sig_span is not None:
                raise ProtocolError(
                    f"{schema.name}: signature field occurs twice", reason="signature_repeated"
                )
            if wt != LEN:
                raise ProtocolError(
                    f"{schema.name}: signature field is not bytes", reason="signature_invalid"
                )
            if pos - value_start != SIGNATURE_SIZE:
                raise ProtocolError(
                    f"{schema.name}: signature is {pos - value_start} bytes, not {SIGNATURE_SIZE}",
                    reason="signature_invalid",
                )
            sig_span = (field_start, pos)
            continue
        if not allowed >> wt & 1:
            raise ProtocolError(
                f"{schema.name}: field {number} has wire type {wt}", reason="malformed_message"
            )
        bit = 1 << number
        if seen & bit and not repeat_bits & bit:
            raise ProtocolError(
                f"{schema.name}: field {number} occurs more than once", reason="field_repeated"
            )
        seen |= bit
    return sig_span


def validate(data: bytes, schema: Schema) -> None:
    """Run the scan on a message that carries no signature field (nested or unsigned)."""
    _scan(data, 0, len(data), schema)


_V = rb"[\x80-\xff]{0,9}[\x00-\x7f]"  # one varint, 1-10 bytes
#: Fields 1-4 of a Message as a canonical serializer writes them (in order, each at most once,
#: AgentIds of 64 bytes), up to and including the length of payload_json.
_MSG_HEAD = re.compile(
    rb"(?:\x0a\x40.{64})?(?:\x12\x40.{64})?(?:\x18" + _V + rb")?(?:\x22([\x80-\xff]{0,4}[\x00-\x7f]))?",
    re.DOTALL,
).match
#: Then: varint fields 5-7, the 64-byte signature (field 8), varint fields 10, 12, 14, 15, and
#: the length of field 16 (the trace context; two-byte tag) when it is there.
_MSG_TAIL = re.compile(
    rb"(?:\x28" + _V + rb")?(?:\x30" + _V + rb")?(?:\x38" + _V + rb")?\x42\x40(.{64})"
    rb"(?:\x50" + _V + rb")?(?:\x60" + _V + rb")?(?:\x70" + _V + rb")?(?:\x78" + _V + rb")?"
    rb"(?:\x82\x01([\x80-\xff]?[\x00-\x7f]))?",
    re.DOTALL,
).match
#: The end: varint fields 17 and 18, and the length of field 19 (the principal), two-byte tags.
_END = rb"(?:\x88\x01" + _V + rb")?(?:\x90\x01" + _V + rb")?(?:\x9a\x01([\x80-\xff]?[\x00-\x7f]))?"
_MSG_END = re.compile(_END, re.DOTALL).match
#: The tail and the end in one pattern, for a message without a trace context (the common case:
#: field 16 stops it short of the end, and the two patterns above decide).
_MSG_REST = re.compile(
    rb"(?:\x28" + _V + rb")?(?:\x30" + _V + rb")?(?:\x38" + _V + rb")?\x42\x40(.{64})"
    rb"(?:\x50" + _V + rb")?(?:\x60" + _V + rb")?(?:\x70" + _V + rb")?(?:\x78" + _V + rb")?" + _END,
    re.DOTALL,
).match


def _message_span_fast(data: bytes) -> tuple[int, int] | None:
    """The signature span of a Message in canonical layout, or None (then the full scan decides).

    Accepts only what :func:`_scan` accepts with the same span: known fields in increasing
    order (so none repeats), right wire types, a 64-byte signature, no field 9, 11 or 13; a
    trace context (field 16) whose own fields the full scan accepts; a principal (field 19) last.
    """
    size = len(data)
    head = _MSG_HEAD(data)
    pos = head.end()  # type: ignore[union-attr]  # the pattern matches the empty string
    n = head.group(1)  # type: ignore[union-attr]
    if n is not None:
        pos += _short_varint(n)
        if pos > size:
            return None
    rest = _MSG_REST(data, pos)
    if rest is None:
        return None
    n = rest.group(2)
    if rest.end() + (0 if n is None else _short_varint(n)) == size:
        s, e = rest.span(1)
        return s - 2, e
    tail = _MSG_TAIL(data, pos)
    if tail is None:  # pragma: no cover - _MSG_REST matched the same fields
        return None
    pos = tail.end()
    n = tail.group(2)
    if n is not None:  # the trace context: its fields are checked as the full scan does
        start, pos = pos, pos + _short_varint(n)
        if pos > len(data):
            return None
        try:
            _scan_fields(data, start, pos, TRACE_CONTEXT_SCHEMA)
        except IacError:
            return None  # the full scan says why
    end = _MSG_END(data, pos)
    pos = end.end()  # type: ignore[union-attr]  # the pattern matches the empty string
    n = end.group(1)  # type: ignore[union-attr]
    if n is not None:  # the principal: a string, its bytes are not scanned
        pos += _short_varint(n)
    if pos != len(data):
        return None
    return tail.start(1) - 2, tail.end(1)


def _short_varint(n: bytes) -> int:
    """The value of a varint the patterns above matched (at most 5 bytes)."""
    length = 0
    for i, b in enumerate(n):
        length |= (b & 0x7F) << (7 * i)
    return length


def signature_span(data: bytes, schema: Schema = MESSAGE_SCHEMA) -> tuple[int, int]:
    """Scan signed message bytes; return the ``(start, end)`` of the signature field."""
    if schema is MESSAGE_SCHEMA:
        fast = _message_span_fast(data)
        if fast is not None:
            return fast
    span = _scan(data, 0, len(data), schema)
    if span is None:
        raise ProtocolError(f"{schema.name}: no signature field", reason="signature_missing")
    return span


def excise_signature(data: bytes, schema: Schema = MESSAGE_SCHEMA) -> tuple[bytes, bytes]:
    """Split signed message bytes into ``(unsigned_bytes, signature)`` without re-serializing."""
    span = _scan(data, 0, len(data), schema)
    if span is None:
        raise ProtocolError(f"{schema.name}: no signature field", reason="signature_missing")
    s, e = span
    return data[:s] + data[e:], data[e - SIGNATURE_SIZE : e]
