"""File transfer: FILE_TRANSFER payloads into a :class:`~iac.protocol.files.FileReceiver` on a
temporary inbox, and acknowledgements into a :class:`~iac.protocol.files.FileSender`.

Input: from the end, the side (0: receiver, 1: sender), whether the receiver restarts (0 or 1),
how many messages (1-8) and, per message, its origin (0 or 1; for the sender: 0 ``on_ack``, 1
``resume_from``), the length of its ``payload_json`` and of its chunk bytes (0-65535 each); the
payloads (UTF-8, as a protobuf string holds them; invalid bytes become U+FFFD) and chunk bytes from
the front. The receiver takes files up to 1 MiB, two at a time, in frames of 64 KiB; after a
restart a second receiver on the same inbox takes the same messages again (resuming from the
state files). The sender sends the mesh vectors' file (2051 bytes in chunks of 1 KiB).

Checked besides the bounds: nothing is written outside the inbox, the inbox holds only regular
files with safe names, and the sender's progress stays within the file.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from iac.errors import PeerError, TransferRefused
from iac.protocol.files import PART_PREFIX, FileReceiver, FileSender, check_file_name, parse_payload
from tests.fuzz.bounds import Finding, check_error
from tests.fuzz.common import MAX_FRAME, FuzzedDataProvider, Layout, vectors

#: A ``failed`` acknowledgement ends a transfer with the receiver's error (``TransferRefused``).
ALLOWED = (PeerError, TransferRefused)

RECEIVER, SENDER = 0, 1
ORIGINS = ("origin-a", "origin-b")
MAX_SIZE = 1 << 20


@dataclass(frozen=True)
class Plan:
    side: int
    restart: bool
    messages: tuple[tuple[int, str, bytes], ...]  # (origin or sender call, payload_json, chunk)


def parse(data: bytes) -> Plan:
    fdp = FuzzedDataProvider(data)
    side = fdp.ConsumeIntInRange(0, 1)
    restart = fdp.ConsumeIntInRange(0, 1) == 1
    messages = []
    for _ in range(fdp.ConsumeIntInRange(1, 8)):
        origin = fdp.ConsumeIntInRange(0, 1)
        payload = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 65535)).decode("utf-8", "replace")
        chunk = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 65535))
        messages.append((origin, payload, chunk))
    return Plan(side, restart, tuple(messages))


def layout(plan: Plan) -> bytes:
    out = Layout().int(plan.side, 0, 1).int(int(plan.restart), 0, 1).int(len(plan.messages), 1, 8)
    for origin, payload, chunk in plan.messages:
        raw = payload.encode("utf-8")
        out.int(origin, 0, 1).int(len(raw), 0, 65535).bytes(raw)
        out.int(len(chunk), 0, 65535).bytes(chunk)
    return out.build()


@cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="iac-fuzz-files-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _receive(plan: Plan, inbox: Path) -> None:
    receiver = FileReceiver(
        inbox, max_size=MAX_SIZE, max_frame_size=MAX_FRAME, max_transfers=2, durable=False
    )
    try:
        for now, (origin, payload, chunk) in enumerate(plan.messages):
            try:
                receiver.on_message(payload, chunk, sender=ORIGINS[origin], now=float(now))
            except PeerError as exc:
                check_error(exc)  # refused; the transfer (or the next one) goes on
    finally:
        receiver.close()


def _check_inbox(root: Path, inbox: Path) -> None:
    if sorted(p.name for p in root.iterdir()) != [inbox.name]:
        raise Finding(f"the receiver wrote outside its inbox: {sorted(p.name for p in root.iterdir())}")
    for entry in os.scandir(inbox):
        if not entry.is_file(follow_symlinks=False):
            raise Finding(f"the inbox holds something that is not a regular file: {entry.name!r}")
        if not entry.name.startswith(PART_PREFIX):
            check_file_name(entry.name)


def _send(plan: Plan) -> None:
    transfer = vectors("mesh-v1")["file_transfer"]
    content = bytes.fromhex(transfer["content_hex"])
    sender = FileSender(
        "vector-transfer-1",
        io.BytesIO(content),
        name="notes.txt",
        chunk_size=transfer["chunk_size"],
        max_frame_size=MAX_FRAME,
    )
    for now, (call, payload, _chunk) in enumerate(plan.messages):
        sender.next_chunks(float(now))
        if call == 0:
            sender.on_ack(payload)
        else:
            sender.resume_from(payload)
        progress = sender.progress
        if (
            not 0 <= progress.bytes_done <= len(content)
            or not 0 <= progress.chunks_done <= progress.total
            or sender.in_flight > sender.window
        ):
            raise Finding(f"sender progress out of range: {progress}")
        sender.on_timeout(float(now) + 10.0)


def TestOneInput(data: bytes) -> None:
    plan = parse(data)
    if plan.side == SENDER:
        _send(plan)
        return
    for _origin, payload, _chunk in plan.messages:
        try:
            parse_payload(payload)
        except PeerError as exc:
            check_error(exc)
    root = Path(tempfile.mkdtemp(dir=_workdir()))
    inbox = root / "inbox"
    try:
        _receive(plan, inbox)
        if plan.restart:
            _receive(plan, inbox)
        _check_inbox(root, inbox)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def seeds() -> dict[str, bytes]:
    """The mesh vectors' transfer in order, out of order, with a restart in the middle; every
    negative chunk; and every acknowledgement and the state query at the sender."""
    transfer = vectors("mesh-v1")["file_transfer"]
    chunks = [(0, c["payload_json"], bytes.fromhex(c["extra_data_hex"])) for c in transfer["chunks"]]
    query = (0, transfer["query"]["payload_json"], b"")
    first = json.loads(chunks[0][1])
    other_id = chunks[0][1].replace(first["transfer_id"], "another-transfer")
    out = {
        "transfer-in-order": layout(Plan(RECEIVER, False, (*chunks, query))),
        "transfer-reversed": layout(Plan(RECEIVER, False, tuple(reversed(chunks)))),
        "transfer-restart": layout(Plan(RECEIVER, True, (chunks[0], query))),
        "transfer-two-origins": layout(Plan(RECEIVER, False, (chunks[0], (1, *chunks[0][1:]), chunks[1]))),
        "transfer-then-a-chunk-again": layout(Plan(RECEIVER, False, (*chunks, chunks[1]))),
        "transfer-then-the-same-name": layout(Plan(RECEIVER, False, (*chunks, (0, other_id, chunks[0][2])))),
        "transfer-restart-in-the-middle": layout(Plan(RECEIVER, True, (chunks[0], chunks[2]))),
    }
    for neg in transfer["negative"]:
        out[f"refused-{neg['name']}"] = layout(
            Plan(RECEIVER, False, ((0, neg["payload_json"], bytes.fromhex(neg["extra_data_hex"])),))
        )
    acks = [(0, a["payload_json"], b"") for a in transfer["acks"]]
    out["sender-acks"] = layout(Plan(SENDER, False, tuple(acks[:3])))
    for i, ack in enumerate(acks):
        out[f"sender-ack-{i}"] = layout(Plan(SENDER, False, (ack,)))
        out[f"sender-resume-{i}"] = layout(Plan(SENDER, False, ((1, *ack[1:]),)))
    return out
