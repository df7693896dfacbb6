"""Canonical JSON: the signed payloads of records and of rotation and revocation statements.

Every payload is one JSON object encoded as RFC 8785 (JCS) would encode it:
keys sorted, no whitespace, UTF-8. The schemas keep to a subset on which every
JSON library agrees: every string is printable ASCII (0x20–0x7E, where only
``"`` and ``\\`` are escaped, as ``\\"`` and ``\\\\``), every number is an
integer in ``[0, 2**53 - 1]`` written as plain digits (no strings for u64, no
floats, no exponents), absent optional fields are left out (never ``null``),
and sets (aliases, capabilities) are sorted arrays without repeats. On that
subset ``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` is JCS. The
signature covers those exact bytes; a verifier parses them, re-encodes and
refuses the payload unless it gets the same bytes back, so duplicate keys,
whitespace, unsorted keys or another spelling of a number never verify.

Besides the encoding and its strict parser, this module holds the schema checks the
payloads share and the JSON envelope that carries payload bytes with their signatures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from iac.errors import MessageRejected

#: Largest integer in any payload (2**53 - 1: exact in every JSON implementation).
MAX_SAFE_INT = (1 << 53) - 1

PRINTABLE_RE = re.compile(r"[\x20-\x7e]*")
#: A SHA-256 digest as payloads write it: 64 lowercase hex characters.
HEX64_RE = re.compile(r"[0-9a-f]{64}")
_SIG_HEX_RE = re.compile(r"[0-9a-f]{128}")


def check_int(name: str, value: object, exc: Callable[[str], Exception]) -> int:
    """``value`` if it is an integer in ``[0, MAX_SAFE_INT]``, else raise ``exc`` naming ``name``."""
    if type(value) is not int or not 0 <= value <= MAX_SAFE_INT:
        raise exc(f"{name} must be an integer in [0, 2**53 - 1], got {value!r:.40}")
    return value


def canonical_json(obj: dict[str, Any]) -> bytes:
    """The canonical bytes of a payload object (see the module docstring)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise MessageRejected(f"duplicate key {key!r:.40}", reason="bad_record")
        out[key] = value
    return out


def _reject_constant(value: str) -> Any:
    raise MessageRejected(f"{value} is not allowed", reason="bad_record")


def _reject_float(value: str) -> Any:
    raise MessageRejected(f"only integers are allowed, got {value!r:.40}", reason="bad_record")


def parse_canonical(data: bytes, max_size: int) -> dict[str, Any]:
    """Parse a payload and insist that it is exactly its own canonical encoding.

    Raises ``bad_record`` for anything else: too large, not UTF-8 ASCII JSON,
    not an object, duplicate keys, floats, NaN, non-ASCII or control characters,
    whitespace, unsorted keys.
    """
    if len(data) > max_size:
        raise MessageRejected(
            f"payload is {len(data)} bytes, over the limit of {max_size}", reason="bad_record"
        )
    try:
        text = bytes(data).decode("ascii")
        obj = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_reject_constant,
            parse_float=_reject_float,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        if isinstance(exc, MessageRejected):
            raise
        raise MessageRejected(f"payload is not ASCII JSON: {exc}", reason="bad_record") from None
    if not isinstance(obj, dict):
        raise MessageRejected("payload is not a JSON object", reason="bad_record")
    if not _strings_printable(obj):
        raise MessageRejected("payload strings must be printable ASCII (0x20-0x7E)", reason="bad_record")
    if canonical_json(obj) != bytes(data):
        raise MessageRejected(
            "payload is not in canonical form (sorted keys, no whitespace, minimal escapes)",
            reason="bad_record",
        )
    return obj


def _strings_printable(value: object, depth: int = 0) -> bool:
    if depth > 4:
        return False
    if isinstance(value, str):
        return PRINTABLE_RE.fullmatch(value) is not None
    if isinstance(value, dict):
        return all(
            _strings_printable(k, depth + 1) and _strings_printable(v, depth + 1) for k, v in value.items()
        )
    if isinstance(value, list):
        return all(_strings_printable(v, depth + 1) for v in value)
    return True


def check_fields(obj: dict[str, Any], required: frozenset[str], optional: frozenset[str], what: str) -> None:
    """Raise ``bad_record`` when ``obj`` lacks a required key or has one not in either set."""
    keys = set(obj)
    missing = required - keys
    if missing:
        raise MessageRejected(f"{what} is missing {sorted(missing)}", reason="bad_record")
    unknown = keys - required - optional
    if unknown:
        raise MessageRejected(f"{what} has unknown fields {sorted(unknown)[:4]}", reason="bad_record")


def str_field(obj: dict[str, Any], key: str) -> str:
    """``obj[key]``, which must be a string."""
    value = obj[key]
    if not isinstance(value, str):
        raise MessageRejected(f"{key} must be a string", reason="bad_record")
    return value


def signature_bytes(signature: bytes, what: str) -> bytes:
    """A 64-byte Ed25519 signature as ``bytes`` (``bad_record`` for anything else)."""
    if not isinstance(signature, bytes | bytearray) or len(signature) != 64:
        raise MessageRejected(f"{what} must be 64 bytes", reason="bad_record")
    return bytes(signature)


def bad_record(message: str) -> MessageRejected:
    """A refused record, statement or registry payload (reason ``bad_record``)."""
    return MessageRejected(message, reason="bad_record")


def as_bad_record(exc: Exception) -> MessageRejected:
    """A local validation error met while decoding received bytes: the peer's fault."""
    return MessageRejected(str(exc), reason="bad_record")


def read_envelope(obj: object, body_key: str, sig_keys: tuple[str, ...]) -> tuple[bytes, list[bytes]]:
    """Read ``{body_key: "<payload>", <sig_key>: "<128 hex>", ...}``: the payload bytes and signatures."""
    if not isinstance(obj, dict) or set(obj) != {body_key, *sig_keys}:
        raise MessageRejected(
            f"envelope must have exactly the keys {sorted({body_key, *sig_keys})}", reason="bad_record"
        )
    body = obj[body_key]
    if not isinstance(body, str) or not body.isascii():
        raise MessageRejected(f"envelope {body_key} must be an ASCII string", reason="bad_record")
    sigs: list[bytes] = []
    for key in sig_keys:
        value = obj[key]
        if not isinstance(value, str) or _SIG_HEX_RE.fullmatch(value) is None:
            raise MessageRejected(f"envelope {key} must be 128 lowercase hex characters", reason="bad_record")
        sigs.append(bytes.fromhex(value))
    return body.encode("ascii"), sigs


@dataclass(frozen=True, slots=True)
class SignedPayload:
    """Canonical payload bytes and the one 64-byte signature over them.

    In a JSON payload it travels as the envelope ``{KEY: "<the payload bytes as a string>",
    "signature": "<128 lowercase hex>"}``, where a subclass names ``KEY``.
    """

    KEY: ClassVar[str]

    data: bytes
    signature: bytes

    def to_json_obj(self) -> dict[str, str]:
        """The envelope: the payload as a string (its exact bytes) and the signature in hex."""
        return {self.KEY: self.data.decode("ascii"), "signature": self.signature.hex()}

    @classmethod
    def from_json_obj(cls, obj: object) -> Self:
        """Read the envelope of :meth:`to_json_obj`; ``bad_record`` if malformed."""
        data, signature = read_envelope(obj, cls.KEY, ("signature",))
        return cls(data, signature[0])
