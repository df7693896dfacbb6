"""The receiving side of a file transfer: chunks written in place, checked, renamed into the inbox.

Resume across receiver restarts: next to each temporary file
``.iac-part-<key>`` the receiver keeps ``.iac-part-<key>.json`` with the
header and the held ranges, rewritten atomically (temp + ``os.replace``)
before each ack goes out, so an acknowledged chunk is on record. It is a hint:
the whole-file hash decides. Both files are created 0600 (only the receiving
user reads what is being received). A completed file is fsynced before the
rename (``durable=True``). A receiver remembers the verdict of the last
:data:`MAX_FINISHED` finished transfers in memory, so a retransmitted last
chunk is answered again (a state query that starts an attempt clears it);
after a restart that memory is gone (a retransmission of a finished transfer
then fails with ``file_exists``).

A partial transfer whose sender never comes back would stay on disk:
:meth:`FileReceiver.remove_abandoned` deletes the temporary files of every
transfer idle for longer than a time to live, judged by their modification
times, so it also finds what an earlier process left.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from iac.errors import ConfigError, DiskError, FileTransferError
from iac.protocol.files.partials import (
    idle_partials,
    part_paths,
    read_state,
    unlink,
    write_state,
)
from iac.protocol.files.payloads import (
    MAX_ACK_RANGES,
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
    failure_ack,
    load_payload_json,
    max_chunk_size_for,
    parse_payload,
    ranges_of,
)
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE

DEFAULT_MAX_SIZE = 1 << 30
DEFAULT_MAX_TRANSFERS = 16
MAX_FINISHED = 1024


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
        ranges, truncated = ranges_of(self.held)
        return AckPayload(self.header.transfer_id, ranges, AckStatus.PARTIAL, truncated=truncated)


@dataclass(slots=True)
class ReceiverStats:
    chunks: int = 0
    duplicates: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    resumed: int = 0
    #: Partial transfers whose files :meth:`FileReceiver.remove_abandoned` deleted.
    abandoned: int = 0


class FileReceiver:
    """Receives files into ``inbox_dir``. Sans-IO: the node passes chunks in and sends the acks out.

    :meth:`on_chunk` checks a chunk against the limits and the transfer's first
    chunk, writes it at ``index * chunk_size`` in ``.iac-part-<key>`` (created
    0600 beside the target, so the rename stays on one file system), records it,
    and returns the ack to send. When every chunk is held it checks the file's
    SHA-256 and renames it into the inbox atomically (without replacing an
    existing file unless ``overwrite``). Refusals raise a
    :class:`FileTransferError`; for a ``fatal`` one the transfer is dropped and
    :func:`failure_ack` gives the answer to send. A file operation that fails on this
    side (a full disk, a permission) raises :class:`~iac.errors.DiskError` with the path.
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
        try:
            return self._on_message(payload_json, data, sender, now)
        except OSError as exc:
            raise self._disk_error(exc) from exc

    def _on_message(self, payload_json: str, data: bytes, sender: str, now: float) -> AckPayload:
        parsed = parse_payload(payload_json)
        if isinstance(parsed, StateQuery):
            if parsed.start:  # a new attempt: a remembered verdict no longer answers it
                self._finished.pop((sender, parsed.transfer_id), None)
            return self.state(parsed.transfer_id, sender=sender)
        if isinstance(parsed, AckPayload):
            raise FileTransferError(
                "an ack is not for a receiver", parsed.transfer_id, reason="bad_transfer_payload"
            )
        return self._on_header(parsed, data, sender, now)

    def on_chunk(self, payload_json: str, data: bytes, *, sender: str = "", now: float = 0.0) -> AckPayload:
        """Take one chunk (its header JSON and bytes); return the ack to send back.

        ``sender`` is the verified origin AgentId of the message: transfers are
        keyed by ``(sender, transfer_id)``. ``now`` (monotonic seconds) is
        recorded for :meth:`expire`.
        """
        try:
            header = ChunkHeader.from_obj(load_payload_json(payload_json))
        except FileTransferError as exc:
            self._count(exc.reason)
            raise
        try:
            return self._on_header(header, data, sender, now)
        except OSError as exc:
            raise self._disk_error(exc) from exc

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
        unlink(part)
        unlink(state_path)
        return found

    def expire(self, now: float, max_idle: float) -> int:
        """Close (not delete: they can resume) transfers idle for ``max_idle`` seconds; return how many."""
        idle = [k for k, inc in self._active.items() if now - inc.last_seen >= max_idle]
        for key in idle:
            os.close(self._active.pop(key).fd)
        return len(idle)

    def remove_abandoned(self, now: float, ttl: float) -> int:
        """Delete the temporary files of every partial transfer idle for ``ttl`` seconds or longer
        (the partial file and its state); return how many transfers went.

        ``now`` is wall-clock seconds (as :func:`time.time`), compared with the files' modification
        times, which every received chunk updates; so transfers an earlier process left are found
        too. A transfer removed here starts over if its sender comes back.
        """
        if not ttl > 0:
            raise ConfigError("ttl must be positive")
        by_part = {inc.part: key for key, inc in self._active.items()}
        removed = 0
        try:
            for part, files in list(idle_partials(self.inbox, now, ttl)):
                key = by_part.get(part)
                if key is not None:
                    os.close(self._active.pop(key).fd)
                for path in files:
                    unlink(path)
                removed += 1
        except OSError as exc:
            self.stats.abandoned += removed
            raise self._disk_error(exc) from exc
        self.stats.abandoned += removed
        return removed

    @property
    def active(self) -> int:
        return len(self._active)

    def _disk_error(self, exc: OSError) -> DiskError:
        """A failed file operation, as the typed error naming its path (the inbox if none)."""
        path = str(exc.filename) if exc.filename is not None else str(self.inbox)
        return DiskError(f"{path}: {exc.strerror or exc}", path=path)

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
                raise FileTransferError(str(done), header.transfer_id, reason=done.reason)
            self.stats.duplicates += 1
            return done
        try:
            self._check_header(header, data)
            inc = self._active.get(key)
            if inc is None:
                inc = self._open(key, header)
            elif not inc.header.same_file(header):
                raise FileTransferError(
                    "chunk header differs from the transfer's (name, size, total, chunk_size or sha256)",
                    header.transfer_id,
                    reason="transfer_mismatch",
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
            self._count(exc.reason)
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
        except FileTransferError as exc:
            raise FileTransferError(str(exc), tid, reason="unsafe_file_name") from None
        if header.size > self.max_size:
            raise FileTransferError(
                f"file is {header.size} bytes, above the limit {self.max_size}", tid, reason="file_too_large"
            )
        if not MIN_CHUNK_SIZE <= header.chunk_size <= self.max_chunk_size:
            raise FileTransferError(
                f"chunk_size {header.chunk_size} is outside [{MIN_CHUNK_SIZE}, {self.max_chunk_size}]",
                tid,
                reason="bad_transfer_payload",
            )
        expected_total = chunk_count(header.size, header.chunk_size)
        if header.total != expected_total:
            raise FileTransferError(
                f"total {header.total} does not match size and chunk_size (expected {expected_total})",
                tid,
                reason="transfer_mismatch",
            )
        if header.index >= header.total:
            raise FileTransferError(
                f"chunk index {header.index} is not below total {header.total}",
                tid,
                reason="chunk_out_of_range",
            )
        expected = chunk_length(header.index, header.size, header.chunk_size)
        if len(data) != expected:
            raise FileTransferError(
                f"chunk {header.index} is {len(data)} bytes, expected {expected}",
                tid,
                reason="bad_chunk_length",
            )
        if header.chunk_sha256 is not None and hashlib.sha256(data).hexdigest() != header.chunk_sha256:
            raise FileTransferError(
                f"chunk {header.index} does not match its chunk_sha256", tid, reason="chunk_hash_mismatch"
            )

    def _open(self, key: tuple[str, str], header: ChunkHeader) -> _Incoming:
        tid = header.transfer_id
        target = self.inbox / header.name
        # Belt and braces after check_file_name: the lexical target must sit directly in the inbox.
        if Path(os.path.normpath(self._inbox_real / header.name)).parent != self._inbox_real:
            raise FileTransferError(
                f"file name {header.name!r} resolves outside the inbox", tid, reason="unsafe_file_name"
            )
        if not self.overwrite and os.path.lexists(target):
            raise FileTransferError(f"{header.name!r} is already in the inbox", tid, reason="file_exists")
        part, state_path = self._paths(key)
        stored = self._read_state(key)
        if stored is not None and stored[0].same_file(header):
            inc = self._reopen(key, header, part, state_path, stored[1])
            if inc is not None:
                self.stats.resumed += 1
                self._active[key] = inc
                return inc
        if len(self._active) >= self.max_transfers:
            raise FileTransferError(
                f"already receiving {len(self._active)} files", tid, reason="too_many_transfers"
            )
        unlink(part)
        unlink(state_path)
        fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.ftruncate(fd, header.size)
        except OSError:
            os.close(fd)
            unlink(part)
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
            raise FileTransferError(
                f"already receiving {len(self._active)} files",
                header.transfer_id,
                reason="too_many_transfers",
            )
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
            raise FileTransferError(
                f"{h.name!r}: the received file does not match its sha256",
                h.transfer_id,
                reason="file_hash_mismatch",
            )
        if self.durable:
            os.fsync(inc.fd)
        os.close(inc.fd)
        del self._active[key]
        target = self.inbox / h.name
        try:
            self._place(inc.part, target)
        except FileTransferError:
            unlink(inc.part)
            unlink(inc.state_path)
            raise
        unlink(inc.state_path)
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
            raise FileTransferError(
                f"{target.name!r} is already in the inbox", reason="file_exists"
            ) from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                raise
            if os.path.lexists(target):  # no hard links here: check, then rename
                raise FileTransferError(
                    f"{target.name!r} is already in the inbox", reason="file_exists"
                ) from None
            os.replace(part, target)
            return
        unlink(part)

    # -- bookkeeping ----------------------------------------------------------------------------

    def _paths(self, key: tuple[str, str]) -> tuple[Path, Path]:
        return part_paths(self.inbox, key)

    def _save_state(self, inc: _Incoming) -> None:
        if self.persist_state:
            ranges, _ = ranges_of(inc.held, limit=inc.header.total)
            write_state(inc.state_path, inc.sender, inc.header, ranges)

    def _read_state(self, key: tuple[str, str]) -> tuple[ChunkHeader, tuple[Range, ...]] | None:
        return read_state(self._paths(key)[1], key) if self.persist_state else None

    def _discard(self, inc: _Incoming) -> None:
        os.close(inc.fd)
        unlink(inc.part)
        unlink(inc.state_path)

    def _remember(self, key: tuple[str, str], verdict: AckPayload | FileTransferError) -> None:
        self._finished[key] = verdict
        self._finished.move_to_end(key)
        while len(self._finished) > MAX_FINISHED:
            self._finished.popitem(last=False)

    def _count(self, name: str) -> None:
        self.stats.refused[name] = self.stats.refused.get(name, 0) + 1

    def __repr__(self) -> str:
        return f"FileReceiver(inbox={str(self.inbox)!r}, active={len(self._active)})"
