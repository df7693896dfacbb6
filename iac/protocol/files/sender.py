"""The sending side of a file transfer: a window of chunks, retransmission and resume."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from iac.errors import ConfigError, FileTransferError, LocalError, TransferRefused
from iac.protocol.canonical import HEX64_RE
from iac.protocol.files.payloads import (
    MAX_JSON_INT,
    MIN_CHUNK_SIZE,
    AckPayload,
    AckStatus,
    ChunkHeader,
    Range,
    StateQuery,
    check_file_name,
    check_transfer_id,
    chunk_count,
    chunk_length,
    max_chunk_size_for,
    parse_payload,
)
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE

DEFAULT_CHUNK_SIZE = 256 * 1024
DEFAULT_WINDOW = 8
MAX_WINDOW = 1024
#: The most the retransmission timeout grows to, in multiples of ``retransmit_timeout``.
MAX_BACKOFF = 8
_READ_BLOCK = 1 << 20


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


def default_chunk_size(max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> int:
    """The chunk size a :class:`FileSender` picks when given none: 256 KiB, or what fits a frame."""
    return min(DEFAULT_CHUNK_SIZE, max_chunk_size_for(max_frame_size))


def hash_file(path: str | os.PathLike[str]) -> tuple[int, str]:
    """The size and lowercase hex SHA-256 of the file at ``path`` (one read);
    :class:`ConfigError` when it cannot be read."""
    h = hashlib.sha256()
    size = 0
    try:
        with Path(path).open("rb") as f:
            while block := f.read(_READ_BLOCK):
                h.update(block)
                size += len(block)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return size, h.hexdigest()


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
    acknowledged ``retransmit_timeout`` seconds after it was sent is queued again
    (the timer backs off and restarts with progress: :meth:`on_timeout`).
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
        except FileTransferError as exc:
            raise ConfigError(str(exc)) from None
        limit = max_chunk_size_for(max_frame_size)
        if chunk_size is None:
            chunk_size = default_chunk_size(max_frame_size)
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
        except FileTransferError as exc:
            self.close()
            raise ConfigError(str(exc)) from None
        try:
            self.size = self._file.seek(0, os.SEEK_END)
            self._file.seek(0)
            self.sha256 = sha256 if sha256 is not None else self._hash_source()
        except OSError as exc:
            self.close()
            raise ConfigError(f"cannot read the source: {exc}") from None
        if HEX64_RE.fullmatch(self.sha256) is None:
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
        # The retransmission timer (RFC 6298's, per transfer): it doubles at each expiry and
        # restarts, at its base, when an ack brings new chunks.
        self._backoff = 1
        self._restarted: float | None = None  # when an ack last brought new chunks
        self._acked_sent: float | None = None  # the latest send of a chunk acknowledged in flight
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

    def query_json(self, *, start: bool = False) -> str:
        """The payload asking the receiver for its state of this transfer: after a reconnect, or
        with ``start`` before the first chunk (answer it with :meth:`resume_from`)."""
        return StateQuery(self.transfer_id, start).to_json()

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
            raise LocalError(
                f"{self.name}: read {len(data)} bytes at offset {offset}, expected {length}",
                reason="source_changed",
            )
        attempt = self._attempts.get(index, 0) + 1
        self._attempts[index] = attempt
        self._in_flight[index] = now
        self.stats.chunks_sent += 1
        self.stats.bytes_sent += length
        if attempt > 1:
            self.stats.chunks_resent += 1
        header = self.header(index, hashlib.sha256(data).hexdigest())
        return ChunkToSend(index, offset, header.to_json(), data, attempt)

    def on_ack(self, payload: str | AckPayload, *, now: float | None = None) -> None:
        """Take an acknowledgement: mark the chunks it holds, finish on ``complete``.

        A ``failed`` ack ends the transfer: :attr:`error` is set and
        :class:`TransferRefused` raised (its ``code`` is the receiver's error name).
        An ``unknown`` ack (the receiver no longer holds the transfer) starts it over.
        ``now``: when it arrived; an ack that brings new chunks restarts the retransmission timer.
        """
        ack = self._parse_ack(payload)
        self.stats.acks += 1
        if ack.status is AckStatus.FAILED:
            self._fail(ack)
        if ack.status is AckStatus.UNKNOWN:  # the receiver lost the transfer: start over
            self.resume_from(ack)
            return
        if self._mark(ack.ranges):
            self._backoff = 1
            if now is not None:
                self._restarted = now
        if ack.status is AckStatus.COMPLETE:
            self._mark(((0, self.total),))
            self._complete = True
            self._in_flight.clear()
            self._retry.clear()

    def on_timeout(self, now: float) -> int:
        """The retransmission timer: queue chunks in flight again; return how many.

        A chunk is due ``retransmit_timeout`` after it was sent or after the last ack that
        brought new chunks, whichever is later, times a backoff that doubles at each expiry
        (up to :data:`MAX_BACKOFF`). Due chunks sent before one that was acknowledged since are
        taken as lost and all queued again; when nothing overtook them, only the oldest is: the
        link may just be slow (a loaded machine), and each copy sent too early would go on
        its way behind the chunks still in flight, and make them later still."""
        due = sorted((sent, i) for i, sent in self._in_flight.items() if self._due(sent) <= now)
        if not due:
            return 0
        acked_sent = self._acked_sent
        lost = [i for sent, i in due if acked_sent is not None and sent < acked_sent] or [due[0][1]]
        for index in lost:
            del self._in_flight[index]
            self._requeue(index)
        self._backoff = min(2 * self._backoff, MAX_BACKOFF)
        self.stats.timeouts += len(lost)
        return len(lost)

    def next_timer(self) -> float | None:
        """When :meth:`on_timeout` has something to do (None: nothing in flight)."""
        if not self._in_flight:
            return None
        return self._due(min(self._in_flight.values()))

    def _due(self, sent: float) -> float:
        restarted = self._restarted
        start = sent if restarted is None or restarted < sent else restarted
        return start + self.retransmit_timeout * self._backoff

    def connection_lost(self) -> None:
        """Every chunk in flight is lost with the connection: queue them again now."""
        self._backoff = 1
        self._restarted = self._acked_sent = None
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
                raise FileTransferError(
                    "expected an ack payload", self.transfer_id, reason="bad_transfer_payload"
                )
            payload = parsed
        if payload.transfer_id != self.transfer_id:
            raise FileTransferError(
                f"ack is for transfer {payload.transfer_id!r}, not {self.transfer_id!r}",
                self.transfer_id,
                reason="bad_transfer_payload",
            )
        if payload.ranges and payload.ranges[-1][1] > self.total:
            raise FileTransferError(
                f"ack names chunks beyond total {self.total}", self.transfer_id, reason="bad_transfer_payload"
            )
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

    def _mark(self, ranges: Iterable[Range]) -> bool:
        """Mark acknowledged chunks; True if any was new."""
        changed = False
        for a, b in ranges:
            for index in [i for i in self._in_flight if a <= i < b]:
                sent = self._in_flight.pop(index)
                if self._acked_sent is None or sent > self._acked_sent:
                    self._acked_sent = sent
            newly = (b - a) - self._acked.count(1, a, b)
            if newly:
                self._acked[a:b] = b"\x01" * (b - a)
                self._acked_count += newly
                changed = True
        if changed:
            self._acked_bytes = self._count_acked_bytes()
            self._report()
        return changed

    def _report(self) -> None:
        if self.on_progress is not None:
            self.on_progress(self.progress)

    def __repr__(self) -> str:
        return (
            f"FileSender(transfer_id={self.transfer_id!r}, name={self.name!r}, "
            f"{self._acked_count}/{self.total} chunks acknowledged)"
        )
