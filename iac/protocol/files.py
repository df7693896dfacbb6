"""File transfer over FILE_TRANSFER messages, sans-IO: no sockets, no clock, no asyncio.

A file travels as numbered chunks, one per FILE_TRANSFER message: the chunk
header is JSON in ``payload_json`` and the chunk bytes are ``extra_data``.
The receiver answers with acknowledgements, also FILE_TRANSFER messages, whose
JSON says which chunks it holds. :class:`FileSender` keeps a window of chunks in
flight, re-queues what is not acknowledged in time and, after a broken
connection, resumes from the receiver's state so that acknowledged chunks are
never sent again. :class:`FileReceiver` writes chunks at their offset into a
temporary file in its inbox, checks the whole file's SHA-256 and only then
renames it into place (atomically). The node moves the payloads; this module
decides.

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
    query  (sender → receiver, after a reconnect: "what do you hold?")
      {"transfer_id": "7f3a…", "query": true}

* ``transfer_id``: 1–64 characters of ``[A-Za-z0-9._~-]``, chosen by the sender
  (:func:`new_transfer_id`: 32 hex digits). The receiver keys a transfer by
  ``(origin AgentId, transfer_id)``, so two senders never share one.
* ``index`` counts from 0; ``total`` is ``max(1, ceil(size / chunk_size))`` (an
  empty file is one empty chunk); chunk ``i`` covers bytes
  ``[i * chunk_size, min(size, (i + 1) * chunk_size))``. ``chunk_size`` is an
  addition to the fields of the design input: without it a receiver could not
  place a chunk that arrives before chunk 0.
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

File names: a name is one path component. Refused (:class:`UnsafeFileName`):
empty, ``.``/``..``, any ``/`` or ``\\``, NUL or another control character,
more than 255 bytes of UTF-8, and names starting with ``.`` (hidden files, and
the receiver's own ``.iac-part-*`` temporaries). The target's resolved parent
must be the inbox itself.

Resume across receiver restarts: next to each temporary file
``.iac-part-<key>`` the receiver keeps ``.iac-part-<key>.json`` with the
header and the held ranges, rewritten atomically (temp + ``os.replace``)
before each ack goes out, so an acknowledged chunk is on record. It is a hint:
the whole-file hash decides. A completed file is fsynced before the rename
(``durable=True``). A receiver remembers the verdict of the last
:data:`MAX_FINISHED` finished transfers in memory, so a retransmitted last
chunk is answered again; after a restart that memory is gone (a retransmission
of a finished transfer then fails with ``file_exists``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, BinaryIO

from iac.errors import (
    BadChunkLength,
    BadTransferPayload,
    ChunkHashMismatch,
    ChunkOutOfRange,
    ConfigError,
    FileExistsInInbox,
    FileHashMismatch,
    FileTooLarge,
    FileTransferError,
    SourceChanged,
    TooManyTransfers,
    TransferMismatch,
    TransferRefused,
    UnsafeFileName,
)
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE

DEFAULT_CHUNK_SIZE = 256 * 1024
#: Smallest ``chunk_size`` accepted: bounds the number of chunks, and the receiver's bitmap, per byte.
MIN_CHUNK_SIZE = 1024
DEFAULT_WINDOW = 8
MAX_WINDOW = 1024
#: Room a FILE_TRANSFER message needs besides the chunk bytes: ids, signature, the JSON header, and a
#: FORWARD wrapper with a path of up to 64 AgentIds when the chunk is relayed.
MESSAGE_OVERHEAD = 8192
DEFAULT_MAX_SIZE = 1 << 30
DEFAULT_MAX_TRANSFERS = 16
MAX_ACK_RANGES = 256
MAX_FINISHED = 1024
MAX_NAME_BYTES = 255
MAX_PAYLOAD_JSON = 4096
#: Integers in the payloads stay below 2**53 so that every JSON implementation reads them exactly.
MAX_JSON_INT = (1 << 53) - 1
PART_PREFIX = ".iac-part-"
_TRANSFER_ID_RE = re.compile(r"[A-Za-z0-9._~-]{1,64}")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
_READ_BLOCK = 1 << 20


#: Error classes by name, for turning a ``failed`` ack back into a typed error.
_ERRORS_BY_NAME: dict[str, type[FileTransferError]] = {
    cls.name: cls
    for cls in (
        FileTransferError,
        BadTransferPayload,
        UnsafeFileName,
        FileTooLarge,
        TransferMismatch,
        ChunkOutOfRange,
        BadChunkLength,
        ChunkHashMismatch,
        FileHashMismatch,
        TooManyTransfers,
        FileExistsInInbox,
    )
}


class AckStatus(StrEnum):
    PARTIAL = "partial"
    COMPLETE = "complete"
    FAILED = "failed"
    UNKNOWN = "unknown"


Range = tuple[int, int]


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def new_transfer_id() -> str:
    """A fresh random transfer id (32 hex digits)."""
    return secrets.token_hex(16)


def check_transfer_id(value: object) -> str:
    if not isinstance(value, str) or _TRANSFER_ID_RE.fullmatch(value) is None:
        raise BadTransferPayload(f"transfer_id must be 1-64 characters of [A-Za-z0-9._~-], got {value!r:.80}")
    return value


def check_file_name(name: object) -> str:
    """Return ``name`` if it is a safe single file name for the inbox, else raise :class:`UnsafeFileName`."""
    if not isinstance(name, str):
        raise UnsafeFileName(f"file name must be a string, got {type(name).__name__}")
    if not name:
        raise UnsafeFileName("file name is empty")
    if name in (".", ".."):
        raise UnsafeFileName(f"file name {name!r} names a directory")
    if "/" in name or "\\" in name:
        raise UnsafeFileName(f"file name {name[:80]!r} contains a path separator")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise UnsafeFileName(f"file name {name[:80]!r} contains NUL or a control character")
    if name.startswith("."):
        raise UnsafeFileName(f"file name {name[:80]!r} is hidden (starts with '.')")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeFileName(f"file name {name[:80]!r} is not valid Unicode") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise UnsafeFileName(f"file name is {len(encoded)} bytes of UTF-8, above {MAX_NAME_BYTES}")
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
        raise BadTransferPayload(
            f"{key} must be an integer in [{minimum}, 2**53 - 1], got {value!r:.40}", transfer_id
        )
    return value


def _hex64_field(obj: Mapping[str, Any], key: str, transfer_id: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or _HEX64_RE.fullmatch(value) is None:
        raise BadTransferPayload(f"{key} must be 64 lowercase hex digits", transfer_id)
    return value


def _load_json(payload_json: str) -> dict[str, Any]:
    if len(payload_json) > MAX_PAYLOAD_JSON:
        raise BadTransferPayload(f"payload_json is {len(payload_json)} characters, above {MAX_PAYLOAD_JSON}")
    try:
        obj = json.loads(payload_json)
    except (ValueError, RecursionError):
        raise BadTransferPayload("payload_json is not JSON") from None
    if not isinstance(obj, dict):
        raise BadTransferPayload("payload_json is not a JSON object")
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
        return _dumps(obj)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> ChunkHeader:
        """Check types and ranges (not the receiver's limits) and build a header."""
        tid = check_transfer_id(obj.get("transfer_id"))
        name = obj.get("name")
        if not isinstance(name, str):
            raise BadTransferPayload("name must be a string", tid)
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
        return _dumps(obj)

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> AckPayload:
        tid = check_transfer_id(obj.get("transfer_id"))
        raw = obj.get("ack")
        if not isinstance(raw, list) or len(raw) > MAX_ACK_RANGES:
            raise BadTransferPayload(f"ack must be a list of at most {MAX_ACK_RANGES} ranges", tid)
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
                raise BadTransferPayload(
                    "ack ranges must be sorted, disjoint, non-adjacent [start, end) pairs", tid
                )
            ranges.append((item[0], item[1]))
            prev_end = item[1]
        try:
            status = AckStatus(str(obj.get("status")))
        except ValueError:
            raise BadTransferPayload(f"unknown ack status {obj.get('status')!r:.40}", tid) from None
        truncated = obj.get("truncated", False)
        if not isinstance(truncated, bool):
            raise BadTransferPayload("truncated must be a boolean", tid)
        error = obj.get("error", "")
        message = obj.get("message", "")
        if not isinstance(error, str) or not isinstance(message, str):
            raise BadTransferPayload("error and message must be strings", tid)
        if status is AckStatus.FAILED and not error:
            raise BadTransferPayload("a failed ack names its error", tid)
        return cls(tid, tuple(ranges), status, error[:100], message[:500], truncated)

    @property
    def count(self) -> int:
        """How many chunks the ranges cover."""
        return sum(b - a for a, b in self.ranges)


@dataclass(frozen=True, slots=True)
class StateQuery:
    """A sender asking, after a reconnect, what the receiver holds of a transfer."""

    transfer_id: str

    def to_json(self) -> str:
        return _dumps({"transfer_id": self.transfer_id, "query": True})


def parse_payload(payload_json: str) -> ChunkHeader | AckPayload | StateQuery:
    """Classify and check a FILE_TRANSFER payload: a chunk header, an ack or a state query.

    A payload with ``"ack"`` is an ack, with ``"query": true`` a query, else a chunk header.
    """
    obj = _load_json(payload_json)
    if "ack" in obj:
        return AckPayload.from_obj(obj)
    if obj.get("query") is True:
        return StateQuery(check_transfer_id(obj.get("transfer_id")))
    return ChunkHeader.from_obj(obj)


def failure_ack(error: FileTransferError, transfer_id: str = "") -> AckPayload:
    """The ``failed`` ack that answers a fatal :class:`FileTransferError`."""
    tid = error.transfer_id or transfer_id
    return AckPayload(check_transfer_id(tid), (), AckStatus.FAILED, error.name, str(error)[:500])


def _ranges_of(held: bytearray, limit: int = MAX_ACK_RANGES) -> tuple[tuple[Range, ...], bool]:
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


# --- sender -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChunkToSend:
    """One chunk for the node to send as a FILE_TRANSFER message (``payload_json``, ``data``)."""

    index: int
    offset: int
    payload_json: str
    data: bytes
    #: 1 for the first send of this chunk, 2 for the first resend, …
    attempt: int


@dataclass(frozen=True, slots=True)
class TransferProgress:
    """Acknowledged progress of one transfer."""

    transfer_id: str
    bytes_done: int
    size: int
    chunks_done: int
    total: int

    @property
    def fraction(self) -> float:
        """Between 0.0 and 1.0 (an empty file is 1.0 once its one chunk is acknowledged)."""
        if self.size == 0:
            return self.chunks_done / self.total
        return self.bytes_done / self.size


ProgressCallback = Callable[[TransferProgress], None]


@dataclass(slots=True)
class SenderStats:
    chunks_sent: int = 0
    chunks_resent: int = 0
    bytes_sent: int = 0
    timeouts: int = 0
    acks: int = 0


class FileSender:
    """Sends one file as a window of chunks. Sans-IO: the node sends and receives, this decides.

    Drive it with :meth:`next_chunks` (what to send now), :meth:`on_ack` (a
    received ack), :meth:`on_timeout` (at :meth:`next_timer`), and after a
    broken connection :meth:`resume_from` with the receiver's state (the answer
    to :meth:`query_json`). ``now`` is seconds on a monotonic clock.

    ``source`` is a path (opened and closed here) or a seekable binary file
    object (left open). The whole-file SHA-256 goes in every chunk, so it is
    computed at construction (one read of the file) unless ``sha256`` is given.
    ``chunk_size`` defaults to 256 KiB, at most what fits a frame of
    ``max_frame_size``; ``window`` bounds chunks in flight; a chunk not
    acknowledged ``retransmit_timeout`` seconds after it was sent is queued again.
    """

    def __init__(
        self,
        transfer_id: str,
        source: str | os.PathLike[str] | BinaryIO,
        *,
        name: str | None = None,
        chunk_size: int | None = None,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        window: int = DEFAULT_WINDOW,
        retransmit_timeout: float = 5.0,
        sha256: str | None = None,
        on_progress: ProgressCallback | None = None,
        resume: AckPayload | None = None,
    ) -> None:
        try:
            self.transfer_id = check_transfer_id(transfer_id)
        except BadTransferPayload as exc:
            raise ConfigError(str(exc)) from None
        limit = max_chunk_size_for(max_frame_size)
        if chunk_size is None:
            chunk_size = min(DEFAULT_CHUNK_SIZE, limit)
        if not MIN_CHUNK_SIZE <= chunk_size <= limit:
            raise ConfigError(
                f"chunk_size must be in [{MIN_CHUNK_SIZE}, {limit}] for max_frame_size {max_frame_size}, "
                f"got {chunk_size}"
            )
        if not 1 <= window <= MAX_WINDOW:
            raise ConfigError(f"window must be in [1, {MAX_WINDOW}], got {window}")
        if retransmit_timeout <= 0:
            raise ConfigError("retransmit_timeout must be positive")
        self._owned = isinstance(source, (str, os.PathLike))
        if isinstance(source, (str, os.PathLike)):
            path = Path(source)
            if name is None:
                name = path.name
            try:
                self._file: BinaryIO = path.open("rb")
            except OSError as exc:
                raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        else:
            self._file = source
            if name is None:
                raise ConfigError("name is required when the source is a file object")
        try:
            self.name = check_file_name(name)
        except UnsafeFileName as exc:
            self.close()
            raise ConfigError(str(exc)) from None
        try:
            self.size = self._file.seek(0, os.SEEK_END)
            self._file.seek(0)
            self.sha256 = sha256 if sha256 is not None else self._hash_source()
        except OSError as exc:
            self.close()
            raise ConfigError(f"cannot read the source: {exc}") from None
        if _HEX64_RE.fullmatch(self.sha256) is None:
            self.close()
            raise ConfigError("sha256 must be 64 lowercase hex digits")
        if self.size > MAX_JSON_INT:
            self.close()
            raise ConfigError("file is too large for a transfer")
        self.chunk_size = chunk_size
        self.total = chunk_count(self.size, chunk_size)
        self.window = window
        self.retransmit_timeout = retransmit_timeout
        self.on_progress = on_progress
        self.stats = SenderStats()
        self._acked = bytearray(self.total)
        self._acked_count = 0
        self._acked_bytes = 0
        self._attempts: dict[int, int] = {}
        self._in_flight: dict[int, float] = {}  # index -> time sent
        self._retry: list[int] = []  # re-queued indices, kept sorted (lowest first)
        self._next_new = 0
        self._complete = False
        self.error: TransferRefused | None = None
        if resume is not None:
            self.resume_from(resume)

    def _hash_source(self) -> str:
        h = hashlib.sha256()
        self._file.seek(0)
        while block := self._file.read(_READ_BLOCK):
            h.update(block)
        self._file.seek(0)
        return h.hexdigest()

    # -- state ----------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once the receiver reported the file verified and in its inbox."""
        return self._complete

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def progress(self) -> TransferProgress:
        return TransferProgress(self.transfer_id, self._acked_bytes, self.size, self._acked_count, self.total)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def is_acked(self, index: int) -> bool:
        return bool(self._acked[index])

    def header(self, index: int, chunk_sha256: str | None = None) -> ChunkHeader:
        return ChunkHeader(
            self.transfer_id,
            self.name,
            index,
            self.total,
            self.size,
            self.chunk_size,
            self.sha256,
            chunk_sha256,
        )

    def query_json(self) -> str:
        """The payload asking the receiver for its state of this transfer (send after a reconnect)."""
        return StateQuery(self.transfer_id).to_json()

    # -- driving --------------------------------------------------------------------------------

    def next_chunks(self, now: float) -> list[ChunkToSend]:
        """Chunks to send now: re-queued ones first, then new ones, up to ``window`` in flight."""
        out: list[ChunkToSend] = []
        if self._complete or self.error is not None:
            return out
        while len(self._in_flight) < self.window:
            index = self._pop_next()
            if index is None:
                break
            out.append(self._make_chunk(index, now))
        return out

    def _pop_next(self) -> int | None:
        while self._retry:
            index = self._retry.pop(0)
            if not self._acked[index] and index not in self._in_flight:
                return index
        while self._next_new < self.total:
            index = self._next_new
            self._next_new += 1
            if not self._acked[index]:
                return index
        return None

    def _make_chunk(self, index: int, now: float) -> ChunkToSend:
        offset = index * self.chunk_size
        length = chunk_length(index, self.size, self.chunk_size)
        self._file.seek(offset)
        data = self._file.read(length)
        if len(data) != length:
            raise SourceChanged(f"{self.name}: read {len(data)} bytes at offset {offset}, expected {length}")
        attempt = self._attempts.get(index, 0) + 1
        self._attempts[index] = attempt
        self._in_flight[index] = now
        self.stats.chunks_sent += 1
        self.stats.bytes_sent += length
        if attempt > 1:
            self.stats.chunks_resent += 1
        header = self.header(index, hashlib.sha256(data).hexdigest())
        return ChunkToSend(index, offset, header.to_json(), data, attempt)

    def on_ack(self, payload: str | AckPayload) -> None:
        """Take an acknowledgement: mark the chunks it holds, finish on ``complete``.

        A ``failed`` ack ends the transfer: :attr:`error` is set and
        :class:`TransferRefused` raised (its ``code`` is the receiver's error name).
        An ``unknown`` ack (the receiver no longer holds the transfer) starts it over.
        """
        ack = self._parse_ack(payload)
        self.stats.acks += 1
        if ack.status is AckStatus.FAILED:
            self._fail(ack)
        if ack.status is AckStatus.UNKNOWN:  # the receiver lost the transfer: start over
            self.resume_from(ack)
            return
        self._mark(ack.ranges)
        if ack.status is AckStatus.COMPLETE:
            self._mark(((0, self.total),))
            self._complete = True
            self._in_flight.clear()
            self._retry.clear()

    def on_timeout(self, now: float) -> int:
        """Queue again every chunk in flight for ``retransmit_timeout`` or longer; return how many."""
        due = [i for i, sent in self._in_flight.items() if sent + self.retransmit_timeout <= now]
        for index in due:
            del self._in_flight[index]
            self._requeue(index)
        self.stats.timeouts += len(due)
        return len(due)

    def next_timer(self) -> float | None:
        """When :meth:`on_timeout` has something to do (None: nothing in flight)."""
        if not self._in_flight:
            return None
        return min(self._in_flight.values()) + self.retransmit_timeout

    def connection_lost(self) -> None:
        """Every chunk in flight is lost with the connection: queue them again now."""
        for index in sorted(self._in_flight):
            self._requeue(index)
        self._in_flight.clear()

    def resume_from(self, state: str | AckPayload) -> None:
        """Continue after a reconnect from the receiver's state (its answer to :meth:`query_json`).

        Chunks in flight are queued again; the acknowledged set becomes exactly
        what the receiver holds (``unknown``: nothing, start over), so chunks it
        holds are never sent again and chunks it lost are. Progress goes down
        only if the receiver lost chunks it had acknowledged.
        """
        ack = self._parse_ack(state)
        self.connection_lost()
        if ack.status is AckStatus.FAILED:
            self._fail(ack)
        if ack.status is AckStatus.COMPLETE:
            self.on_ack(ack)
            return
        if not ack.truncated:
            held = bytearray(self.total)
            for a, b in ack.ranges:
                held[a:b] = b"\x01" * (b - a)
            changed = held != self._acked
            self._acked = held
            self._acked_count = held.count(1)
            self._acked_bytes = self._count_acked_bytes()
            self._retry.clear()
            self._next_new = 0  # sweep every chunk the receiver lacks, in order
            if changed:
                self._report()
        self._mark(ack.ranges)

    def close(self) -> None:
        """Close the source if this sender opened it."""
        if self._owned:
            self._file.close()

    # -- internals ------------------------------------------------------------------------------

    def _parse_ack(self, payload: str | AckPayload) -> AckPayload:
        if isinstance(payload, str):
            parsed = parse_payload(payload)
            if not isinstance(parsed, AckPayload):
                raise BadTransferPayload("expected an ack payload", self.transfer_id)
            payload = parsed
        if payload.transfer_id != self.transfer_id:
            raise BadTransferPayload(
                f"ack is for transfer {payload.transfer_id!r}, not {self.transfer_id!r}", self.transfer_id
            )
        if payload.ranges and payload.ranges[-1][1] > self.total:
            raise BadTransferPayload(f"ack names chunks beyond total {self.total}", self.transfer_id)
        return payload

    def _fail(self, ack: AckPayload) -> None:
        self.error = TransferRefused(ack.error, ack.message)
        self._in_flight.clear()
        self._retry.clear()
        raise self.error

    def _requeue(self, index: int) -> None:
        if not self._acked[index] and index not in self._retry:
            self._retry.append(index)
            self._retry.sort()

    def _count_acked_bytes(self) -> int:
        full = self._acked_count
        last = self.total - 1
        n = full * self.chunk_size
        if self._acked[last]:
            n -= self.chunk_size - chunk_length(last, self.size, self.chunk_size)
        return n

    def _mark(self, ranges: Iterable[Range]) -> None:
        changed = False
        for a, b in ranges:
            for index in [i for i in self._in_flight if a <= i < b]:
                del self._in_flight[index]
            newly = (b - a) - self._acked.count(1, a, b)
            if newly:
                self._acked[a:b] = b"\x01" * (b - a)
                self._acked_count += newly
                changed = True
        if changed:
            self._acked_bytes = self._count_acked_bytes()
            self._report()

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def __repr__(self) -> str:
        return (
            f"FileSender(transfer_id={self.transfer_id!r}, name={self.name!r}, "
            f"{self._acked_count}/{self.total} chunks acknowledged)"
        )


# --- receiver -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Incoming:
    sender: str
    header: ChunkHeader
    part: Path
    state_path: Path
    fd: int
    held: bytearray
    held_count: int = 0
    hashed_upto: int = 0
    hasher: hashlib._Hash = field(default_factory=hashlib.sha256)
    last_seen: float = 0.0

    def ack(self) -> AckPayload:
        ranges, truncated = _ranges_of(self.held)
        return AckPayload(self.header.transfer_id, ranges, AckStatus.PARTIAL, truncated=truncated)


@dataclass(slots=True)
class ReceiverStats:
    chunks: int = 0
    duplicates: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    resumed: int = 0


class FileReceiver:
    """Receives files into ``inbox_dir``. Sans-IO: the node passes chunks in and sends the acks out.

    :meth:`on_chunk` checks a chunk against the limits and the transfer's first
    chunk, writes it at ``index * chunk_size`` in ``.iac-part-<key>`` (created
    0600 beside the target, so the rename stays on one file system), records it,
    and returns the ack to send. When every chunk is held it checks the file's
    SHA-256 and renames it into the inbox atomically (without replacing an
    existing file unless ``overwrite``). Refusals raise a
    :class:`FileTransferError`; for a ``fatal`` one the transfer is dropped and
    :func:`failure_ack` gives the answer to send.
    """

    def __init__(
        self,
        inbox_dir: str | os.PathLike[str],
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_transfers: int = DEFAULT_MAX_TRANSFERS,
        overwrite: bool = False,
        persist_state: bool = True,
        durable: bool = True,
    ) -> None:
        if max_size < 0 or max_transfers < 1:
            raise ConfigError("max_size must be >= 0 and max_transfers >= 1")
        self.inbox = Path(inbox_dir)
        self.inbox.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._inbox_real = self.inbox.resolve()
        self.max_size = max_size
        self.max_chunk_size = max_chunk_size_for(max_frame_size)
        self.max_transfers = max_transfers
        self.overwrite = overwrite
        self.persist_state = persist_state
        self.durable = durable
        self.stats = ReceiverStats()
        self._active: dict[tuple[str, str], _Incoming] = {}
        self._finished: OrderedDict[tuple[str, str], AckPayload | FileTransferError] = OrderedDict()

    # -- public ---------------------------------------------------------------------------------

    def on_message(self, payload_json: str, data: bytes, *, sender: str = "", now: float = 0.0) -> AckPayload:
        """Handle any FILE_TRANSFER payload aimed at a receiver: a chunk or a state query."""
        parsed = parse_payload(payload_json)
        if isinstance(parsed, StateQuery):
            return self.state(parsed.transfer_id, sender=sender)
        if isinstance(parsed, AckPayload):
            raise BadTransferPayload("an ack is not for a receiver", parsed.transfer_id)
        return self._on_header(parsed, data, sender, now)

    def on_chunk(self, payload_json: str, data: bytes, *, sender: str = "", now: float = 0.0) -> AckPayload:
        """Take one chunk (its header JSON and bytes); return the ack to send back.

        ``sender`` is the verified origin AgentId of the message: transfers are
        keyed by ``(sender, transfer_id)``. ``now`` (monotonic seconds) is
        recorded for :meth:`expire`.
        """
        try:
            header = ChunkHeader.from_obj(_load_json(payload_json))
        except BadTransferPayload:
            self._count(BadTransferPayload.name)
            raise
        return self._on_header(header, data, sender, now)

    def state(self, transfer_id: str, *, sender: str = "") -> AckPayload:
        """What this receiver holds of a transfer (``unknown`` when nothing)."""
        key = (sender, check_transfer_id(transfer_id))
        done = self._finished.get(key)
        if isinstance(done, AckPayload):
            return done
        if isinstance(done, FileTransferError):
            return failure_ack(done, transfer_id)
        inc = self._active.get(key)
        if inc is not None:
            return inc.ack()
        stored = self._read_state(key)
        if stored is not None:
            _header, ranges = stored
            return AckPayload(transfer_id, ranges[:MAX_ACK_RANGES], truncated=len(ranges) > MAX_ACK_RANGES)
        return AckPayload(transfer_id, (), AckStatus.UNKNOWN)

    def abandon(self, transfer_id: str, *, sender: str = "") -> bool:
        """Drop a partial transfer and its files; True if there was one."""
        key = (sender, check_transfer_id(transfer_id))
        inc = self._active.pop(key, None)
        if inc is not None:
            self._discard(inc)
            return True
        part, state_path = self._paths(key)
        found = part.exists() or state_path.exists()
        _unlink(part)
        _unlink(state_path)
        return found

    def expire(self, now: float, max_idle: float) -> int:
        """Close (not delete: they can resume) transfers idle for ``max_idle`` seconds; return how many."""
        idle = [k for k, inc in self._active.items() if now - inc.last_seen >= max_idle]
        for key in idle:
            os.close(self._active.pop(key).fd)
        return len(idle)

    @property
    def active(self) -> int:
        return len(self._active)

    def close(self) -> None:
        """Close open temporary files; partial transfers stay on disk for a resume."""
        for inc in self._active.values():
            os.close(inc.fd)
        self._active.clear()

    # -- the chunk path -------------------------------------------------------------------------

    def _on_header(self, header: ChunkHeader, data: bytes, sender: str, now: float) -> AckPayload:
        key = (sender, header.transfer_id)
        done = self._finished.get(key)
        if done is not None:
            if isinstance(done, FileTransferError):
                raise type(done)(str(done), header.transfer_id)
            self.stats.duplicates += 1
            return done
        try:
            self._check_header(header, data)
            inc = self._active.get(key)
            if inc is None:
                inc = self._open(key, header)
            elif not inc.header.same_file(header):
                raise TransferMismatch(
                    "chunk header differs from the transfer's (name, size, total, chunk_size or sha256)",
                    header.transfer_id,
                )
            inc.last_seen = now
            if inc.held[header.index]:
                self.stats.duplicates += 1
                return inc.ack()
            self._write(inc, header.index, data)
            self.stats.chunks += 1
            if inc.held_count == header.total:
                return self._finish(key, inc)
            self._save_state(inc)
            return inc.ack()
        except FileTransferError as exc:
            self._count(exc.name)
            if exc.fatal:
                inc = self._active.pop(key, None)
                if inc is not None:
                    self._discard(inc)
                self._remember(key, exc)
                self.stats.failed += 1
            raise

    def _check_header(self, header: ChunkHeader, data: bytes) -> None:
        tid = header.transfer_id
        try:
            check_file_name(header.name)
        except UnsafeFileName as exc:
            raise UnsafeFileName(str(exc), tid) from None
        if header.size > self.max_size:
            raise FileTooLarge(f"file is {header.size} bytes, above the limit {self.max_size}", tid)
        if not MIN_CHUNK_SIZE <= header.chunk_size <= self.max_chunk_size:
            raise BadTransferPayload(
                f"chunk_size {header.chunk_size} is outside [{MIN_CHUNK_SIZE}, {self.max_chunk_size}]", tid
            )
        expected_total = chunk_count(header.size, header.chunk_size)
        if header.total != expected_total:
            raise TransferMismatch(
                f"total {header.total} does not match size and chunk_size (expected {expected_total})", tid
            )
        if header.index >= header.total:
            raise ChunkOutOfRange(f"chunk index {header.index} is not below total {header.total}", tid)
        expected = chunk_length(header.index, header.size, header.chunk_size)
        if len(data) != expected:
            raise BadChunkLength(f"chunk {header.index} is {len(data)} bytes, expected {expected}", tid)
        if header.chunk_sha256 is not None and hashlib.sha256(data).hexdigest() != header.chunk_sha256:
            raise ChunkHashMismatch(f"chunk {header.index} does not match its chunk_sha256", tid)

    def _open(self, key: tuple[str, str], header: ChunkHeader) -> _Incoming:
        tid = header.transfer_id
        target = self.inbox / header.name
        # Belt and braces after check_file_name: the lexical target must sit directly in the inbox.
        if Path(os.path.normpath(self._inbox_real / header.name)).parent != self._inbox_real:
            raise UnsafeFileName(f"file name {header.name!r} resolves outside the inbox", tid)
        if not self.overwrite and os.path.lexists(target):
            raise FileExistsInInbox(f"{header.name!r} is already in the inbox", tid)
        part, state_path = self._paths(key)
        stored = self._read_state(key)
        if stored is not None and stored[0].same_file(header):
            inc = self._reopen(key, header, part, state_path, stored[1])
            if inc is not None:
                self.stats.resumed += 1
                self._active[key] = inc
                return inc
        if len(self._active) >= self.max_transfers:
            raise TooManyTransfers(f"already receiving {len(self._active)} files", tid)
        _unlink(part)
        _unlink(state_path)
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.ftruncate(fd, header.size)
        except OSError:
            os.close(fd)
            _unlink(part)
            raise
        inc = _Incoming(key[0], header, part, state_path, fd, bytearray(header.total))
        self._active[key] = inc
        return inc

    def _reopen(
        self,
        key: tuple[str, str],
        header: ChunkHeader,
        part: Path,
        state_path: Path,
        ranges: tuple[Range, ...],
    ) -> _Incoming | None:
        if len(self._active) >= self.max_transfers:
            raise TooManyTransfers(f"already receiving {len(self._active)} files", header.transfer_id)
        try:
            fd = os.open(part, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return None
        if os.fstat(fd).st_size != header.size:
            os.close(fd)
            return None
        held = bytearray(header.total)
        for a, b in ranges:
            held[a:b] = b"\x01" * (b - a)
        return _Incoming(key[0], header, part, state_path, fd, held, held.count(1))

    def _write(self, inc: _Incoming, index: int, data: bytes) -> None:
        offset = index * inc.header.chunk_size
        view = memoryview(data)
        while view:
            n = os.pwrite(inc.fd, view, offset)
            view = view[n:]
            offset += n
        inc.held[index] = 1
        inc.held_count += 1
        if index == inc.hashed_upto:
            inc.hasher.update(data)
            inc.hashed_upto += 1
            self._advance_hash(inc)

    def _advance_hash(self, inc: _Incoming) -> None:
        """Hash forward over chunks that arrived early (read back from the file)."""
        h = inc.header
        while inc.hashed_upto < h.total and inc.held[inc.hashed_upto]:
            i = inc.hashed_upto
            inc.hasher.update(os.pread(inc.fd, chunk_length(i, h.size, h.chunk_size), i * h.chunk_size))
            inc.hashed_upto += 1

    def _finish(self, key: tuple[str, str], inc: _Incoming) -> AckPayload:
        h = inc.header
        self._advance_hash(inc)
        if inc.hashed_upto != h.total:  # resumed after a restart: hash the file from the start
            inc.hasher = hashlib.sha256()
            inc.hashed_upto = 0
            self._advance_hash(inc)
        if inc.hasher.hexdigest() != h.sha256:
            raise FileHashMismatch(f"{h.name!r}: the received file does not match its sha256", h.transfer_id)
        if self.durable:
            os.fsync(inc.fd)
        os.close(inc.fd)
        del self._active[key]
        target = self.inbox / h.name
        try:
            self._place(inc.part, target)
        except FileTransferError:
            _unlink(inc.part)
            _unlink(inc.state_path)
            raise
        _unlink(inc.state_path)
        ack = AckPayload(h.transfer_id, ((0, h.total),), AckStatus.COMPLETE)
        self._remember(key, ack)
        self.stats.completed += 1
        return ack

    def _place(self, part: Path, target: Path) -> None:
        if self.overwrite:
            os.replace(part, target)
            return
        try:
            os.link(part, target)  # atomic and never replaces an existing file
        except FileExistsError:
            raise FileExistsInInbox(f"{target.name!r} is already in the inbox") from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            if os.path.lexists(target):  # no hard links here: check, then rename
                raise FileExistsInInbox(f"{target.name!r} is already in the inbox") from None
            os.replace(part, target)
            return
        _unlink(part)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _paths(self, key: tuple[str, str]) -> tuple[Path, Path]:
        digest = hashlib.sha256(f"{key[0]}\x00{key[1]}".encode()).hexdigest()[:32]
        part = self.inbox / f"{PART_PREFIX}{digest}"
        return part, part.with_name(part.name + ".json")

    def _save_state(self, inc: _Incoming) -> None:
        if not self.persist_state:
            return
        ranges, _ = _ranges_of(inc.held, limit=inc.header.total)
        h = inc.header
        doc = {
            "version": 1,
            "sender": inc.sender,
            "transfer_id": h.transfer_id,
            "name": h.name,
            "size": h.size,
            "total": h.total,
            "chunk_size": h.chunk_size,
            "sha256": h.sha256,
            "received": [[a, b] for a, b in ranges],
        }
        tmp = inc.state_path.with_name(inc.state_path.name + ".tmp")
        tmp.write_text(_dumps(doc), encoding="utf-8")
        os.replace(tmp, inc.state_path)

    def _read_state(self, key: tuple[str, str]) -> tuple[ChunkHeader, tuple[Range, ...]] | None:
        if not self.persist_state:
            return None
        _part, state_path = self._paths(key)
        try:
            doc = json.loads(state_path.read_text(encoding="utf-8"))
            if doc.get("sender") != key[0] or doc.get("transfer_id") != key[1]:
                return None
            header = ChunkHeader.from_obj({**doc, "index": 0})
            ranges: list[Range] = []
            for a, b in doc["received"]:
                if type(a) is not int or type(b) is not int or not 0 <= a < b <= header.total:
                    return None
                ranges.append((a, b))
            return header, tuple(ranges)
        except (OSError, ValueError, TypeError, KeyError, FileTransferError):
            return None

    def _discard(self, inc: _Incoming) -> None:
        os.close(inc.fd)
        _unlink(inc.part)
        _unlink(inc.state_path)

    def _remember(self, key: tuple[str, str], verdict: AckPayload | FileTransferError) -> None:
        self._finished[key] = verdict
        self._finished.move_to_end(key)
        while len(self._finished) > MAX_FINISHED:
            self._finished.popitem(last=False)

    def _count(self, name: str) -> None:
        self.stats.refused[name] = self.stats.refused.get(name, 0) + 1

    def __repr__(self) -> str:
        return f"FileReceiver(inbox={str(self.inbox)!r}, active={len(self._active)})"


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def error_for(ack: AckPayload) -> FileTransferError:
    """The typed error a ``failed`` ack names (``file_transfer_error`` for a name not known here)."""
    cls = _ERRORS_BY_NAME.get(ack.error, FileTransferError)
    return cls(ack.message or ack.error, ack.transfer_id)


__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_WINDOW",
    "MAX_ACK_RANGES",
    "MIN_CHUNK_SIZE",
    "AckPayload",
    "AckStatus",
    "BadChunkLength",
    "BadTransferPayload",
    "ChunkHashMismatch",
    "ChunkHeader",
    "ChunkOutOfRange",
    "ChunkToSend",
    "FileExistsInInbox",
    "FileHashMismatch",
    "FileReceiver",
    "FileSender",
    "FileTooLarge",
    "FileTransferError",
    "SourceChanged",
    "StateQuery",
    "TooManyTransfers",
    "TransferMismatch",
    "TransferProgress",
    "TransferRefused",
    "UnsafeFileName",
    "check_file_name",
    "chunk_count",
    "chunk_length",
    "error_for",
    "failure_ack",
    "new_transfer_id",
    "parse_payload",
]
