"""The FILE_TRANSFER payloads: chunk headers, acknowledgements and state queries.

Payloads (``payload_json`` of FILE_TRANSFER messages; keys may come in any
order, unknown keys are ignored)::

    chunk  (sender → receiver, chunk bytes in extra_data)
      {"transfer_id": "7f3a…", "name": "report.pdf", "index": 0, "total": 80,
       "size": 20971520, "chunk_size": 262144, "sha256": "<64 hex, whole file>",
       "chunk_sha256": "<64 hex, this chunk>"}
    ack    (receiver → sender)
      {"transfer_id": "7f3a…", "ack": [[0, 41], [43, 44]], "status": "partial"}
      {"transfer_id": "7f3a…", "ack": [[0, 80]], "status": "complete"}
      {"transfer_id": "7f3a…", "ack": [], "status": "failed",
       "error": "file_hash_mismatch", "message": "…"}
    query  (sender → receiver: "what do you hold?")
      {"transfer_id": "7f3a…", "query": true}                  after a reconnect
      {"transfer_id": "7f3a…", "query": true, "start": true}   before the first chunk

* ``transfer_id``: 1–64 characters of ``[A-Za-z0-9._~-]``, chosen by the sender.
  The receiver keys a transfer by ``(origin AgentId, transfer_id)``, so two
  senders never share one. :func:`transfer_id_for` derives it from the sender,
  the receiver and the file (name, size, chunk size, SHA-256): a sender that
  starts again after it was stopped, even in another process, names the same
  transfer and continues from what the receiver holds. :func:`new_transfer_id`
  makes a random one.
* A query with ``"start": true`` opens an attempt: the receiver forgets the
  verdict (``complete`` or ``failed``) it may remember for that transfer, so a
  file sent again after its first copy was moved away, or after a refusal whose
  cause is gone, is received again; what it holds of a partial transfer stays.
* ``index`` counts from 0; ``total`` is ``max(1, ceil(size / chunk_size))`` (an
  empty file is one empty chunk); chunk ``i`` covers bytes
  ``[i * chunk_size, min(size, (i + 1) * chunk_size))``. Every chunk carries
  ``chunk_size``: without it a receiver could not place a chunk that arrives
  before chunk 0.
* ``sha256`` (whole file) and ``chunk_sha256`` are lowercase hex. ``chunk_sha256``
  is optional; when present the receiver checks it before writing, so a
  tampered chunk is refused at once and sent again, instead of failing the
  whole file at the end. The whole-file hash is always checked.
* ``ack`` lists the chunks the receiver holds as sorted, disjoint, half-open
  ranges ``[start, end)`` (at most :data:`MAX_ACK_RANGES`; with more, the
  lowest ranges are sent and ``"truncated": true`` is added). Every ack states
  the receiver's full state, so a lost ack costs nothing. ``status`` is
  ``partial``, ``complete`` (the file was verified and renamed into the inbox),
  ``failed`` (with an error ``name`` from the list below; the transfer is over)
  or ``unknown`` (the answer to a query about a transfer the receiver does not
  hold: start from chunk 0).

Acknowledgements are FILE_TRANSFER messages rather than ACK messages because
an ACK acknowledges one message of one session, while a transfer outlives
sessions and connections: the transfer state (ranges, verdict) must be
answerable by ``transfer_id`` after a reconnect.

File names: a name is one path component. Refused (``unsafe_file_name``):
empty, ``.``/``..``, any ``/`` or ``\\``, NUL or another control character,
more than 255 bytes of UTF-8, and names starting with ``.`` (hidden files, and
the receiver's own ``.iac-part-*`` temporaries). The target's resolved parent
must be the inbox itself.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from iac.errors import REASONS, FileTransferError
from iac.protocol.canonical import HEX64_RE, MAX_SAFE_INT
from iac.wire.jsonutil import dumps_compact

#: Smallest ``chunk_size`` accepted: bounds the number of chunks, and the receiver's bitmap, per byte.
MIN_CHUNK_SIZE = 1024
#: Room a FILE_TRANSFER message needs besides the chunk bytes: ids, signature, the JSON header, and a
#: FORWARD wrapper with a path of up to 64 AgentIds when the chunk is relayed.
MESSAGE_OVERHEAD = 8192
MAX_ACK_RANGES = 256
MAX_NAME_BYTES = 255
MAX_PAYLOAD_JSON = 4096
#: Integers in the payloads stay below 2**53 so that every JSON implementation reads them exactly.
MAX_JSON_INT = MAX_SAFE_INT
_TRANSFER_ID_RE = re.compile(r"[A-Za-z0-9._~-]{1,64}")


class AckStatus(StrEnum):
    """The ``status`` of a file transfer's ack: some chunks held, all verified, refused, or unknown."""

    PARTIAL = "partial"
    COMPLETE = "complete"
    FAILED = "failed"
    UNKNOWN = "unknown"


Range = tuple[int, int]


def new_transfer_id() -> str:
    """A fresh random transfer id (32 hex digits)."""
    return secrets.token_hex(16)


_TRANSFER_ID_DOMAIN = b"iac-file-transfer-id/v1\x00"


def transfer_id_for(sender: str, receiver: str, name: str, size: int, chunk_size: int, sha256: str) -> str:
    """The transfer id of one file from ``sender`` to ``receiver`` (AgentIds), 32 hex digits.

    The same file (name, size, chunk size and SHA-256) between the same two agents always gets
    the same id, so a transfer that a stopped sender left partial is found again by the next one.
    """
    fields = (sender, receiver, name, str(size), str(chunk_size), sha256)
    h = hashlib.sha256(_TRANSFER_ID_DOMAIN)
    for value in fields:
        data = value.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(4, "big") + data)
    return h.hexdigest()[:32]


def check_transfer_id(value: object) -> str:
    if not isinstance(value, str) or _TRANSFER_ID_RE.fullmatch(value) is None:
        raise FileTransferError(
            f"transfer_id must be 1-64 characters of [A-Za-z0-9._~-], got {value!r:.80}",
            reason="bad_transfer_payload",
        )
    return value


def check_file_name(name: object) -> str:
    """Return ``name`` if it is a safe single file name for the inbox, else raise ``unsafe_file_name``."""
    if not isinstance(name, str):
        raise FileTransferError(
            f"file name must be a string, got {type(name).__name__}", reason="unsafe_file_name"
        )
    if not name:
        raise FileTransferError("file name is empty", reason="unsafe_file_name")
    if name in (".", ".."):
        raise FileTransferError(f"file name {name!r} names a directory", reason="unsafe_file_name")
    if "/" in name or "\\" in name:
        raise FileTransferError(
            f"file name {name[:80]!r} contains a path separator", reason="unsafe_file_name"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise FileTransferError(
            f"file name {name[:80]!r} contains NUL or a control character", reason="unsafe_file_name"
        )
    if name.startswith("."):
        raise FileTransferError(
            f"file name {name[:80]!r} is hidden (starts with '.')", reason="unsafe_file_name"
        )
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise FileTransferError(
            f"file name {name[:80]!r} is not valid Unicode", reason="unsafe_file_name"
        ) from None
    if len(encoded) > MAX_NAME_BYTES:
        raise FileTransferError(
            f"file name is {len(encoded)} bytes of UTF-8, above {MAX_NAME_BYTES}", reason="unsafe_file_name"
        )
    return name


def chunk_count(size: int, chunk_size: int) -> int:
    """``total`` for a file of ``size`` bytes: ``max(1, ceil(size / chunk_size))``."""
    return max(1, -(-size // chunk_size))


def chunk_length(index: int, size: int, chunk_size: int) -> int:
    """How many bytes chunk ``index`` holds."""
    return max(0, min(chunk_size, size - index * chunk_size))


def max_chunk_size_for(max_frame_size: int) -> int:
    """The largest chunk that fits a FILE_TRANSFER message in a frame of ``max_frame_size``."""
    return max_frame_size - MESSAGE_OVERHEAD


def _int_field(obj: Mapping[str, Any], key: str, transfer_id: str, minimum: int = 0) -> int:
    value = obj.get(key)
    if type(value) is not int or not minimum <= value <= MAX_JSON_INT:
        raise FileTransferError(
            f"{key} must be an integer in [{minimum}, 2**53 - 1], got {value!r:.40}",
            transfer_id,
            reason="bad_transfer_payload",
        )
    return value


def _hex64_field(obj: Mapping[str, Any], key: str, transfer_id: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or HEX64_RE.fullmatch(value) is None:
        raise FileTransferError(
            f"{key} must be 64 lowercase hex digits", transfer_id, reason="bad_transfer_payload"
        )
    return value


def load_payload_json(payload_json: str) -> dict[str, Any]:
    if len(payload_json) > MAX_PAYLOAD_JSON:
        raise FileTransferError(
            f"payload_json is {len(payload_json)} characters, above {MAX_PAYLOAD_JSON}",
            reason="bad_transfer_payload",
        )
    try:
        obj = json.loads(payload_json)
    except (ValueError, RecursionError):
        raise FileTransferError("payload_json is not JSON", reason="bad_transfer_payload") from None
    if not isinstance(obj, dict):
        raise FileTransferError("payload_json is not a JSON object", reason="bad_transfer_payload")
    return obj


# --- payloads -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkHeader:
    """The JSON header of one chunk."""

    transfer_id: str
    name: str
    index: int
    total: int
    size: int
    chunk_size: int
    sha256: str
    chunk_sha256: str | None = None

    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "transfer_id": self.transfer_id,
            "name": self.name,
            "index": self.index,
            "total": self.total,
            "size": self.size,
            "chunk_size": self.chunk_size,
            "sha256": self.sha256,
        }
        if self.chunk_sha256 is not None:
            obj["chunk_sha256"] = self.chunk_sha256
        return dumps_compact(obj)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ChunkHeader:
        """Check types and ranges (not the receiver's limits) and build a header."""
        tid = check_transfer_id(obj.get("transfer_id"))
        name = obj.get("name")
        if not isinstance(name, str):
            raise FileTransferError("name must be a string", tid, reason="bad_transfer_payload")
        index = _int_field(obj, "index", tid)
        total = _int_field(obj, "total", tid, 1)
        size = _int_field(obj, "size", tid)
        chunk_size = _int_field(obj, "chunk_size", tid, 1)
        sha = _hex64_field(obj, "sha256", tid)
        chunk_sha = _hex64_field(obj, "chunk_sha256", tid) if "chunk_sha256" in obj else None
        return cls(tid, name, index, total, size, chunk_size, sha, chunk_sha)

    def same_file(self, other: ChunkHeader) -> bool:
        return (self.name, self.size, self.total, self.chunk_size, self.sha256) == (
            other.name,
            other.size,
            other.total,
            other.chunk_size,
            other.sha256,
        )


@dataclass(frozen=True, slots=True)
class AckPayload:
    """What a receiver holds of one transfer (the JSON of an acknowledgement)."""

    transfer_id: str
    ranges: tuple[Range, ...] = ()
    status: AckStatus = AckStatus.PARTIAL
    error: str = ""
    message: str = ""
    truncated: bool = False

    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "transfer_id": self.transfer_id,
            "ack": [[a, b] for a, b in self.ranges],
            "status": self.status.value,
        }
        if self.truncated:
            obj["truncated"] = True
        if self.status is AckStatus.FAILED:
            obj["error"] = self.error
            obj["message"] = self.message
        return dumps_compact(obj)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> AckPayload:
        tid = check_transfer_id(obj.get("transfer_id"))
        raw = obj.get("ack")
        if not isinstance(raw, list) or len(raw) > MAX_ACK_RANGES:
            raise FileTransferError(
                f"ack must be a list of at most {MAX_ACK_RANGES} ranges", tid, reason="bad_transfer_payload"
            )
        ranges: list[Range] = []
        prev_end = -1
        for item in raw:
            if (
                not isinstance(item, list)
                or len(item) != 2
                or any(type(x) is not int or not 0 <= x <= MAX_JSON_INT for x in item)
                or not item[0] < item[1]
                or item[0] <= prev_end
            ):
                raise FileTransferError(
                    "ack ranges must be sorted, disjoint, non-adjacent [start, end) pairs",
                    tid,
                    reason="bad_transfer_payload",
                )
            ranges.append((item[0], item[1]))
            prev_end = item[1]
        try:
            status = AckStatus(str(obj.get("status")))
        except ValueError:
            raise FileTransferError(
                f"unknown ack status {obj.get('status')!r:.40}", tid, reason="bad_transfer_payload"
            ) from None
        truncated = obj.get("truncated", False)
        if not isinstance(truncated, bool):
            raise FileTransferError("truncated must be a boolean", tid, reason="bad_transfer_payload")
        error = obj.get("error", "")
        message = obj.get("message", "")
        if not isinstance(error, str) or not isinstance(message, str):
            raise FileTransferError("error and message must be strings", tid, reason="bad_transfer_payload")
        if status is AckStatus.FAILED and not error:
            raise FileTransferError("a failed ack names its error", tid, reason="bad_transfer_payload")
        return cls(tid, tuple(ranges), status, error[:100], message[:500], truncated)

    @property
    def count(self) -> int:
        """How many chunks the ranges cover."""
        return sum(b - a for a, b in self.ranges)


@dataclass(frozen=True, slots=True)
class StateQuery:
    """A sender asking what the receiver holds of a transfer: after a reconnect, or with
    ``start`` before its first chunk (the receiver then forgets a remembered verdict)."""

    transfer_id: str
    start: bool = False

    def to_json(self) -> str:
        obj: dict[str, Any] = {"transfer_id": self.transfer_id, "query": True}
        if self.start:
            obj["start"] = True
        return dumps_compact(obj)


def parse_payload(payload_json: str) -> ChunkHeader | AckPayload | StateQuery:
    """Classify and check a FILE_TRANSFER payload: a chunk header, an ack or a state query.

    A payload with ``"ack"`` is an ack, with ``"query": true`` a query, else a chunk header.
    """
    obj = load_payload_json(payload_json)
    if "ack" in obj:
        return AckPayload.from_obj(obj)
    if obj.get("query") is True:
        tid = check_transfer_id(obj.get("transfer_id"))
        start = obj.get("start", False)
        if not isinstance(start, bool):
            raise FileTransferError("start must be a boolean", tid, reason="bad_transfer_payload")
        return StateQuery(tid, start)
    return ChunkHeader.from_obj(obj)


def failure_ack(error: FileTransferError, transfer_id: str = "") -> AckPayload:
    """The ``failed`` ack that answers a fatal :class:`FileTransferError`."""
    tid = error.transfer_id or transfer_id
    return AckPayload(check_transfer_id(tid), (), AckStatus.FAILED, error.reason, str(error)[:500])


def ranges_of(held: bytearray, limit: int = MAX_ACK_RANGES) -> tuple[tuple[Range, ...], bool]:
    """Half-open ranges of the set bytes in ``held``; True when more than ``limit`` exist."""
    out: list[Range] = []
    n = len(held)
    i = held.find(1)
    while i != -1:
        j = held.find(0, i)
        if j == -1:
            j = n
        if len(out) == limit:
            return tuple(out), True
        out.append((i, j))
        i = held.find(1, j) if j < n else -1
    return tuple(out), False


def error_for(ack: AckPayload) -> FileTransferError:
    """The typed error a ``failed`` ack names (``file_transfer_error`` for a name not known here)."""
    row = REASONS.get(ack.error)
    reason = ack.error if row is not None and row.cls is FileTransferError else None
    return FileTransferError(ack.message or ack.error, ack.transfer_id, reason=reason)
