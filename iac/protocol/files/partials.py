"""A receiver's temporary files in its inbox: where a partial transfer is written, its state
record, and finding the ones left idle.

For the transfer ``(sender, transfer_id)`` the partial file is ``.iac-part-<digest>`` (the
digest: 32 hex digits of the SHA-256 of the key) and its state ``.iac-part-<digest>.json``:
the chunk header's file fields and the received ranges, written to ``….json.tmp`` (mode 0600)
and renamed over the record, so a reader sees the old record or the new one, never half of one.
File names a sender may use never start with ``.``, so these names cannot clash with a file
received into the inbox.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from iac.errors import FileTransferError
from iac.protocol.files.payloads import ChunkHeader, Range
from iac.wire.jsonutil import dumps_compact
from iac.wire.private import write_private

PART_PREFIX = ".iac-part-"
#: The partial file, its state and the state's temporary file; group 1 is the digest.
_PART_NAME_RE = re.compile(re.escape(PART_PREFIX) + r"([0-9a-f]{32})(?:\.json(?:\.tmp)?)?")


def part_paths(inbox: Path, key: tuple[str, str]) -> tuple[Path, Path]:
    """The partial file and the state file of the transfer ``key`` = ``(sender, transfer_id)``."""
    digest = hashlib.sha256(f"{key[0]}\x00{key[1]}".encode()).hexdigest()[:32]
    part = inbox / f"{PART_PREFIX}{digest}"
    return part, part.with_name(part.name + ".json")


def write_state(state_path: Path, sender: str, header: ChunkHeader, ranges: tuple[Range, ...]) -> None:
    """Record what is held of a transfer, atomically, readable by this user only."""
    doc = {
        "version": 1,
        "sender": sender,
        "transfer_id": header.transfer_id,
        "name": header.name,
        "size": header.size,
        "total": header.total,
        "chunk_size": header.chunk_size,
        "sha256": header.sha256,
        "received": [[a, b] for a, b in ranges],
    }
    tmp = state_path.with_name(state_path.name + ".tmp")  # idle_partials finds a leftover one
    write_private(state_path, dumps_compact(doc).encode("utf-8"), tmp=tmp)


def read_state(state_path: Path, key: tuple[str, str]) -> tuple[ChunkHeader, tuple[Range, ...]] | None:
    """The header and received ranges recorded for ``key``; None when there is no valid record."""
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
    except (OSError, ValueError, TypeError, KeyError, AttributeError, FileTransferError):
        return None


def idle_partials(inbox: Path, now: float, ttl: float) -> Iterator[tuple[Path, list[Path]]]:
    """The temporary files of each transfer that none was modified in the last ``ttl`` seconds
    before ``now`` (wall-clock seconds): ``(partial file path, every file of that transfer)``."""
    groups: dict[str, list[tuple[Path, float]]] = {}
    with os.scandir(inbox) as entries:
        for entry in entries:
            match = _PART_NAME_RE.fullmatch(entry.name)
            if match is None:
                continue
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue
            groups.setdefault(match.group(1), []).append((Path(entry.path), mtime))
    for digest, files in groups.items():
        if now - max(mtime for _, mtime in files) >= ttl:
            yield inbox / f"{PART_PREFIX}{digest}", [path for path, _ in files]


def unlink(path: Path) -> None:
    """Remove ``path`` if it is there."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
