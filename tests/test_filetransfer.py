"""Sans-IO file transfer: a FileSender and a FileReceiver wired in memory with an explicit clock."""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from iac.errors import ConfigError, MessageRejected
from iac.protocol.files import (
    MIN_CHUNK_SIZE,
    PART_PREFIX,
    AckPayload,
    AckStatus,
    ChunkHeader,
    ChunkToSend,
    FileReceiver,
    FileSender,
    FileTransferError,
    StateQuery,
    TransferProgress,
    TransferRefused,
    check_file_name,
    error_for,
    failure_ack,
    hash_file,
    parse_payload,
    transfer_id_for,
)

ROOT = Path(__file__).resolve().parent.parent
VECTORS: dict[str, Any] = json.loads((ROOT / "proto" / "testvectors" / "mesh-v1.json").read_text("utf-8"))
ALICE = "a" * 64
MALLORY = "b" * 64
MiB = 1024 * 1024
SLOW = os.environ.get("IAC_SLOW") == "1"


def make_file(path: Path, size: int, seed: int = 7) -> str:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def sha_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(MiB):
            h.update(block)
    return h.hexdigest()


def pump(
    sender: FileSender,
    receiver: FileReceiver,
    *,
    sent: Counter[int] | None = None,
    drop: Callable[[ChunkToSend], bool] = lambda c: False,
    stop: Callable[[], bool] = lambda: False,
    now: float = 0.0,
    max_rounds: int = 100_000,
) -> float:
    """Drive a transfer in memory until done (or ``stop``); dropped chunks are recovered by timeouts."""
    for _ in range(max_rounds):
        if sender.done or stop():
            return now
        chunks = sender.next_chunks(now)
        if not chunks:
            now = max(now, sender.next_timer() or now)
            sender.on_timeout(now)
            continue
        for c in chunks:
            if sent is not None:
                sent[c.index] += 1
            if drop(c):
                continue
            ack = receiver.on_chunk(c.payload_json, c.data, sender=ALICE, now=now)
            sender.on_ack(ack.to_json())
            if stop():
                return now
        now += 0.001
    raise AssertionError("transfer did not finish")


def leftovers(inbox: Path) -> list[str]:
    return sorted(p.name for p in inbox.iterdir() if p.name.startswith(PART_PREFIX))


# --- whole transfers ----------------------------------------------------------------------------


def test_20_mib_file_arrives_intact_with_monotonic_progress(tmp_path: Path) -> None:
    src = tmp_path / "data.bin"
    digest = make_file(src, 20 * MiB + 12_345)
    seen: list[TransferProgress] = []
    sender = FileSender("t-20mib", src, on_progress=seen.append)
    receiver = FileReceiver(tmp_path / "inbox", max_size=64 * MiB)
    pump(sender, receiver)
    out = tmp_path / "inbox" / "data.bin"
    assert sha_of(out) == digest
    assert out.stat().st_size == 20 * MiB + 12_345
    assert leftovers(tmp_path / "inbox") == []
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions)
    assert fractions[-1] == 1.0
    assert seen[-1].bytes_done == seen[-1].size
    assert sender.stats.chunks_resent == 0
    assert receiver.stats.completed == 1
    assert receiver.state("t-20mib", sender=ALICE).status is AckStatus.COMPLETE
    sender.close()


BIG = (200 if SLOW else 24) * MiB


@pytest.mark.slow  # 24 MiB by default; IAC_SLOW=1 runs the 200 MiB version
def test_large_file_with_a_cut_at_half(tmp_path: Path) -> None:
    src = tmp_path / "big.bin"
    digest = make_file(src, BIG)
    receiver = FileReceiver(tmp_path / "inbox", max_size=256 * MiB)
    sent: Counter[int] = Counter()
    first = FileSender("t-200", src)
    pump(first, receiver, sent=sent, stop=lambda: first.progress.fraction >= 0.5)
    first.close()
    state = receiver.on_message(StateQuery("t-200").to_json(), b"", sender=ALICE)
    second = FileSender("t-200", src, resume=state)
    pump(second, receiver, sent=sent)
    assert sha_of(tmp_path / "inbox" / "big.bin") == digest
    assert sum(sent.values()) - second.total <= first.window
    second.close()


def test_empty_file(tmp_path: Path) -> None:
    src = tmp_path / "empty.txt"
    src.write_bytes(b"")
    seen: list[float] = []
    sender = FileSender("t-empty", src, on_progress=lambda p: seen.append(p.fraction))
    assert sender.total == 1
    receiver = FileReceiver(tmp_path / "inbox")
    pump(sender, receiver)
    assert (tmp_path / "inbox" / "empty.txt").read_bytes() == b""
    assert seen == [1.0]


def test_file_object_source_and_lost_chunks_are_resent_after_timeout(tmp_path: Path) -> None:
    src = tmp_path / "x.bin"
    digest = make_file(src, 300_000)
    receiver = FileReceiver(tmp_path / "inbox")
    dropped: set[int] = set()

    def drop(c: ChunkToSend) -> bool:  # lose the first send of every third chunk
        if c.index % 3 == 0 and c.attempt == 1:
            dropped.add(c.index)
            return True
        return False

    with src.open("rb") as f:
        sender = FileSender("t-loss", f, name="copy.bin", chunk_size=16 * 1024, window=4)
        pump(sender, receiver, drop=drop)
    assert sha_of(tmp_path / "inbox" / "copy.bin") == digest
    assert sender.stats.chunks_resent == len(dropped) > 0
    assert sender.stats.timeouts == len(dropped)


def test_a_window_slower_than_the_retransmit_timeout_does_not_collapse(tmp_path: Path) -> None:
    """A reliable link that shares its bandwidth among the chunks it carries, as QUIC's streams
    do, slow enough that one window takes longer than ``retransmit_timeout`` (a loaded
    machine). Resending every chunk at each timeout put copies behind copies: every chunk
    arrived later and later and none was acknowledged for longer than a send_file stall
    timeout. The timeout backs off and resends the oldest chunk alone when nothing overtook it."""
    chunk, window, rto = 16 * 1024, 8, 5.0
    src = tmp_path / "slow.bin"
    digest = make_file(src, 32 * chunk)
    receiver = FileReceiver(tmp_path / "inbox")
    sender = FileSender("t-slow", src, chunk_size=chunk, window=window, retransmit_timeout=rto)
    rate = window * chunk / (3 * rto)  # bytes a virtual second: one window takes 3 timeouts
    step = 0.05
    link: list[tuple[ChunkToSend, list[float]]] = []  # each copy, with the bytes it still needs
    now = last_progress = 0.0
    longest_gap = 0.0
    while not sender.done and now < 600.0:  # 60 s at the link's rate with nothing resent
        for c in sender.next_chunks(now):
            link.append((c, [float(len(c.data) + 200)]))  # 200: the header and signature
        timer = sender.next_timer()
        if timer is not None and timer <= now:
            sender.on_timeout(now)
            continue
        now += step
        share = rate * step / max(1, len(link))
        for c, left in list(link):
            left[0] -= share
            if left[0] <= 0:
                link.remove((c, left))
                before = sender.progress.chunks_done
                ack = receiver.on_chunk(c.payload_json, c.data, sender=ALICE, now=now)
                sender.on_ack(ack, now=now)
                if sender.progress.chunks_done != before:
                    longest_gap = max(longest_gap, now - last_progress)
                    last_progress = now
    assert sender.done and sha_of(tmp_path / "inbox" / "slow.bin") == digest
    # What each chunk waits for in the link is what the sender put ahead of it: copies of its own
    # chunks it resent too early. Before: 30 s and more between two acknowledged chunks.
    assert longest_gap < 30.0
    assert sender.stats.chunks_resent <= window
    sender.close()


# --- resume -------------------------------------------------------------------------------------


def test_cut_at_half_resumes_without_resending_acknowledged_chunks(tmp_path: Path) -> None:
    src = tmp_path / "data.bin"
    digest = make_file(src, 20 * MiB)
    receiver = FileReceiver(tmp_path / "inbox", max_size=64 * MiB)
    sent: Counter[int] = Counter()
    first = FileSender("t-cut", src, window=16)
    in_flight_at_cut: list[int] = []

    def cut_after_half(c: ChunkToSend) -> bool:
        # Once half is acknowledged the connection is gone: every later chunk is lost.
        if first.progress.fraction >= 0.5:
            in_flight_at_cut.append(c.index)
            return True
        return False

    pump(first, receiver, sent=sent, drop=cut_after_half, stop=lambda: len(in_flight_at_cut) >= 8)
    acked_before = {i for i in range(first.total) if first.is_acked(i)}
    assert 0.5 <= first.progress.fraction < 0.6
    first.close()

    # Reconnect: a new sender asks the receiver what it holds and resumes from that.
    answer = receiver.on_message(StateQuery("t-cut").to_json(), b"", sender=ALICE)
    assert answer.status is AckStatus.PARTIAL
    resent: Counter[int] = Counter()
    second = FileSender("t-cut", src, resume=AckPayload.from_obj(json.loads(answer.to_json())))
    assert second.progress.bytes_done == first.progress.bytes_done
    pump(second, receiver, sent=resent)
    assert sha_of(tmp_path / "inbox" / "data.bin") == digest
    assert not acked_before & set(resent), "an acknowledged chunk was sent again"
    assert set(resent) == set(range(second.total)) - acked_before
    assert all(n == 1 for n in resent.values())
    total_sent = sum(sent.values()) + sum(resent.values())
    assert total_sent == second.total + len(in_flight_at_cut)


def test_resume_after_receiver_restart_uses_persisted_state(tmp_path: Path) -> None:
    src = tmp_path / "data.bin"
    digest = make_file(src, 2 * MiB)
    inbox = tmp_path / "inbox"
    receiver = FileReceiver(inbox)
    first = FileSender("t-restart", src, chunk_size=64 * 1024)
    pump(first, receiver, stop=lambda: first.progress.fraction >= 0.5)
    receiver.close()  # the receiving process goes away; the part file and its state stay
    assert len(leftovers(inbox)) == 2

    restarted = FileReceiver(inbox)
    state = restarted.state("t-restart", sender=ALICE)
    assert state.count == first.progress.chunks_done
    assert restarted.state("t-restart", sender=MALLORY).status is AckStatus.UNKNOWN
    resent: Counter[int] = Counter()
    second = FileSender("t-restart", src, chunk_size=64 * 1024, resume=state)
    pump(second, restarted, sent=resent)
    assert restarted.stats.resumed == 1
    assert sha_of(inbox / "data.bin") == digest
    assert sum(resent.values()) == second.total - state.count
    assert leftovers(inbox) == []


def test_resume_from_unknown_starts_over(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 100_000)
    sender = FileSender("t-u", src, chunk_size=MIN_CHUNK_SIZE * 8)
    for c in sender.next_chunks(0.0):
        sender.on_ack(AckPayload("t-u", ((0, c.index + 1),)))
    assert sender.progress.chunks_done > 0
    sender.resume_from(AckPayload("t-u", (), AckStatus.UNKNOWN))
    assert sender.progress.chunks_done == 0
    assert [c.index for c in sender.next_chunks(1.0)] == list(range(min(sender.window, sender.total)))
    sender.on_ack(AckPayload("t-u", ((0, 3),)))
    sender.on_ack(AckPayload("t-u", (), AckStatus.UNKNOWN))  # in the middle of a transfer, too
    assert sender.progress.chunks_done == 0 and sender.in_flight == 0


# --- a sender started again, abandoned transfers, private state ---------------------------------

BOB = "c" * 64


def test_transfer_id_for_names_sender_receiver_and_file() -> None:
    base = (ALICE, BOB, "a.bin", 5000, 1024, "0" * 64)
    tid = transfer_id_for(*base)
    assert tid == transfer_id_for(*base) and len(tid) == 32 and int(tid, 16) >= 0
    changed = [
        (MALLORY, BOB, "a.bin", 5000, 1024, "0" * 64),
        (ALICE, MALLORY, "a.bin", 5000, 1024, "0" * 64),
        (ALICE, BOB, "b.bin", 5000, 1024, "0" * 64),
        (ALICE, BOB, "a.bin", 5001, 1024, "0" * 64),
        (ALICE, BOB, "a.bin", 5000, 2048, "0" * 64),
        (ALICE, BOB, "a.bin", 5000, 1024, "1" * 64),
    ]
    assert len({transfer_id_for(*c) for c in changed} | {tid}) == len(changed) + 1
    # fields are length-prefixed: moving characters from one field to the next changes the id
    assert transfer_id_for("ab", "c", "n", 1, 1, "0" * 64) != transfer_id_for("a", "bc", "n", 1, 1, "0" * 64)


def test_a_sender_started_again_continues_from_what_the_receiver_holds(tmp_path: Path) -> None:
    """A second sender for the same file (another process: nothing shared but the file) names
    the same transfer, asks the receiver with a start query and sends only what it lacks."""
    src = tmp_path / "data.bin"
    digest = make_file(src, 3 * MiB)
    receiver = FileReceiver(tmp_path / "inbox")

    def new_sender() -> FileSender:
        size, sha = hash_file(src)
        assert sha == digest
        tid = transfer_id_for(ALICE, BOB, src.name, size, 64 * 1024, sha)
        return FileSender(tid, src, chunk_size=64 * 1024, sha256=sha)

    first = new_sender()
    pump(first, receiver, stop=lambda: first.progress.fraction >= 0.4)
    held = first.progress.chunks_done
    first.close()  # the first sender is gone: killed, nothing said to the receiver

    second = new_sender()
    assert second.transfer_id == first.transfer_id
    answer = receiver.on_message(second.query_json(start=True), b"", sender=ALICE)
    second.resume_from(answer)
    assert second.progress.chunks_done == held > 0
    sent: Counter[int] = Counter()
    pump(second, receiver, sent=sent)
    assert sum(sent.values()) == second.total - held and all(n == 1 for n in sent.values())
    assert sha_of(tmp_path / "inbox" / "data.bin") == digest


def test_a_start_query_forgets_a_finished_verdict(tmp_path: Path) -> None:
    """A file sent again under the same transfer id after the receiver finished it (moved away
    since, or refused for a cause that is gone) is received again; a plain query after a
    reconnect still gets the verdict."""
    src = tmp_path / "a.bin"
    digest = make_file(src, 5000)
    inbox = tmp_path / "inbox"
    receiver = FileReceiver(inbox)

    def ask(start: bool) -> AckPayload:
        return receiver.on_message(StateQuery("t-again", start=start).to_json(), b"", sender=ALICE)

    def send_again() -> None:
        sender = FileSender("t-again", src, chunk_size=MIN_CHUNK_SIZE)
        sender.resume_from(ask(start=True))
        pump(sender, receiver)

    pump(FileSender("t-again", src, chunk_size=MIN_CHUNK_SIZE), receiver)
    assert ask(start=False).status is AckStatus.COMPLETE
    (inbox / "a.bin").rename(tmp_path / "moved.bin")
    send_again()  # the receiver's copy was moved away: received again
    assert sha_of(inbox / "a.bin") == digest
    with pytest.raises(FileTransferError) as exc_info:
        send_again()  # and now it is there: refused as before
    assert exc_info.value.reason == "file_exists"
    assert ask(start=False).status is AckStatus.FAILED
    (inbox / "a.bin").unlink()
    send_again()  # the clash is gone
    assert sha_of(inbox / "a.bin") == digest


def test_partial_and_state_files_are_private(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 5000)
    receiver = FileReceiver(tmp_path / "inbox")
    old = os.umask(0o022)  # a usual umask: files are world-readable unless created otherwise
    try:
        c = FileSender("t-mode", src, chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
        receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
        c = FileSender("t-mode", src, chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[1]
        receiver.on_chunk(c.payload_json, c.data, sender=ALICE)  # the state is rewritten: still private
    finally:
        os.umask(old)
    names = leftovers(tmp_path / "inbox")
    assert len(names) == 2 and any(n.endswith(".json") for n in names)
    for name in names:
        assert stat.S_IMODE((tmp_path / "inbox" / name).stat().st_mode) == 0o600, name


def test_abandoned_partials_are_removed_after_their_ttl(tmp_path: Path) -> None:
    """Time is an argument: ``now`` stands for a day later, nobody waits."""
    src = tmp_path / "a.bin"
    make_file(src, 5000)
    inbox = tmp_path / "inbox"
    earlier = FileReceiver(inbox)  # a process that received a chunk and went away
    c = FileSender("t-old", src, name="old.bin", chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
    earlier.on_chunk(c.payload_json, c.data, sender=ALICE)
    earlier.close()
    old_names = leftovers(inbox)
    receiver = FileReceiver(inbox)  # the next process, with a transfer of its own in progress
    c = FileSender("t-new", src, name="new.bin", chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
    receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    (inbox / "keep.bin").write_bytes(b"a received file")
    (inbox / f"{PART_PREFIX}not-ours").write_bytes(b"not a name the receiver makes")
    assert len(leftovers(inbox)) == 5
    day = 24 * 3600.0
    start = time.time()
    for name in old_names:  # the earlier transfer's files were last touched an hour ago ...
        os.utime(inbox / name, (start - 3600, start - 3600))

    assert receiver.remove_abandoned(start, day) == 0  # ... which is within the time to live
    assert receiver.remove_abandoned(start + day - 1800, day) == 1  # the earlier one is a day old
    assert receiver.active == 1 and receiver.state("t-old", sender=ALICE).status is AckStatus.UNKNOWN
    assert receiver.state("t-new", sender=ALICE).count == 1
    assert receiver.remove_abandoned(start + day + 1, day) == 1  # and now the active one too
    assert receiver.active == 0 and receiver.state("t-new", sender=ALICE).status is AckStatus.UNKNOWN
    assert leftovers(inbox) == [f"{PART_PREFIX}not-ours"]
    assert (inbox / "keep.bin").read_bytes() == b"a received file"
    assert receiver.stats.abandoned == 2
    with pytest.raises(ConfigError):
        receiver.remove_abandoned(start, 0)


# --- tampering ----------------------------------------------------------------------------------


def test_tampered_chunk_is_refused_by_its_chunk_hash_and_sent_again(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    digest = make_file(src, 200_000)
    receiver = FileReceiver(tmp_path / "inbox")
    sender = FileSender("t-tamper", src, chunk_size=32 * 1024)
    refused: list[FileTransferError] = []
    now = 0.0
    while not sender.done:
        for c in sender.next_chunks(now):
            data = c.data
            if c.index == 2 and c.attempt == 1:
                data = bytes([data[0] ^ 0x80]) + data[1:]
            try:
                sender.on_ack(receiver.on_chunk(c.payload_json, data, sender=ALICE))
            except FileTransferError as exc:
                assert not exc.fatal
                refused.append(exc)
        now += 10.0
        sender.on_timeout(now)
    assert len(refused) == 1
    assert receiver.stats.refused == {"chunk_hash_mismatch": 1}
    assert sha_of(tmp_path / "inbox" / "a.bin") == digest


def test_tampered_chunk_with_matching_chunk_hash_fails_the_whole_file(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 200_000)
    inbox = tmp_path / "inbox"
    receiver = FileReceiver(inbox)
    sender = FileSender("t-evil", src, chunk_size=32 * 1024)
    failure: AckPayload | None = None
    for c in sender.next_chunks(0.0):
        payload, data = c.payload_json, c.data
        if c.index == 3:  # a forger who also rewrites chunk_sha256 (or a file that changed mid-send)
            data = data[:-1] + bytes([data[-1] ^ 1])
            obj = json.loads(payload)
            obj["chunk_sha256"] = hashlib.sha256(data).hexdigest()
            payload = json.dumps(obj)
        try:
            sender.on_ack(receiver.on_chunk(payload, data, sender=ALICE))
        except FileTransferError as exc:
            assert exc.fatal
            failure = failure_ack(exc)
    assert failure is not None
    assert failure.status is AckStatus.FAILED and failure.error == "file_hash_mismatch"
    assert not (inbox / "a.bin").exists()
    assert leftovers(inbox) == []
    with pytest.raises(TransferRefused) as info:
        sender.on_ack(failure.to_json())
    assert info.value.code == "file_hash_mismatch"
    assert sender.failed and sender.next_chunks(1.0) == []
    assert error_for(failure).reason == "file_hash_mismatch"
    # a retransmission of the failed transfer gets the same verdict, not a fresh start
    c = FileSender("t-evil", src, chunk_size=32 * 1024).next_chunks(2.0)[0]
    with pytest.raises(FileTransferError) as exc_info:
        receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    assert exc_info.value.reason == "file_hash_mismatch"
    assert receiver.state("t-evil", sender=ALICE).status is AckStatus.FAILED


# --- refusals -----------------------------------------------------------------------------------

UNSAFE_NAMES = [
    "",
    ".",
    "..",
    "/etc/passwd",
    "../escape.txt",
    "a/../../b",
    "sub/file.txt",
    "..\\escape.txt",
    "C:\\Windows\\x",
    "nul\x00byte",
    "line\nbreak",
    "del\x7f",
    ".hidden",
    ".iac-part-0123",
    "x" * 256,
    "é" * 128,
]


def header_json(**change: Any) -> str:
    base: dict[str, Any] = {
        "transfer_id": "t1",
        "name": "ok.txt",
        "index": 0,
        "total": 1,
        "size": 10,
        "chunk_size": MIN_CHUNK_SIZE,
        "sha256": hashlib.sha256(b"0123456789").hexdigest(),
    }
    base.update(change)
    return json.dumps(base)


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_names_are_refused(tmp_path: Path, name: str) -> None:
    inbox = tmp_path / "inbox"
    receiver = FileReceiver(inbox)
    with pytest.raises(FileTransferError) as info:
        receiver.on_chunk(header_json(name=name), b"0123456789", sender=ALICE)
    assert info.value.reason == "unsafe_file_name"
    assert info.value.fatal and isinstance(info.value, MessageRejected)
    assert failure_ack(info.value).error == "unsafe_file_name"
    assert list(inbox.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inbox"]
    with pytest.raises(FileTransferError) as exc_info:
        check_file_name(name)
    assert exc_info.value.reason == "unsafe_file_name"


def test_sender_refuses_an_unsafe_name_locally(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x")
    with pytest.raises(ConfigError):
        FileSender("t", src, name="../a.bin")


def test_safe_unicode_names_are_accepted() -> None:
    for name in ("report.pdf", "résumé 2024.txt", "数据.csv", "a..b", "x" * 255):
        assert check_file_name(name) == name


def test_size_limit(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 50_000)
    receiver = FileReceiver(tmp_path / "inbox", max_size=49_999)
    c = FileSender("t-big", src, chunk_size=MIN_CHUNK_SIZE * 4).next_chunks(0.0)[0]
    with pytest.raises(FileTransferError) as info:
        receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    assert info.value.reason == "file_too_large"
    assert failure_ack(info.value).error == "file_too_large"
    assert list((tmp_path / "inbox").iterdir()) == []
    assert receiver.stats.refused == {"file_too_large": 1}


def test_inconsistent_chunks_are_refused(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 10_000)
    receiver = FileReceiver(tmp_path / "inbox")
    sender = FileSender("t-mix", src, chunk_size=MIN_CHUNK_SIZE)
    chunks = sender.next_chunks(0.0)
    first = json.loads(chunks[0].payload_json)
    receiver.on_chunk(chunks[0].payload_json, chunks[0].data, sender=ALICE)

    def variant(i: int = 1, **change: Any) -> str:
        return json.dumps({**json.loads(chunks[i].payload_json), **change})

    with pytest.raises(FileTransferError) as exc_info:
        receiver.on_chunk(chunks[1].payload_json, chunks[1].data[:-1], sender=ALICE)
    assert exc_info.value.reason == "bad_chunk_length"
    with pytest.raises(FileTransferError) as exc_info:
        receiver.on_chunk(variant(index=first["total"]), chunks[1].data, sender=ALICE)
    assert exc_info.value.reason == "chunk_out_of_range"
    assert receiver.active == 1  # those refused one chunk; the transfer goes on
    receiver.on_chunk(chunks[1].payload_json, chunks[1].data, sender=ALICE)
    with pytest.raises(FileTransferError) as exc_info:  # another file under the same transfer id: fatal
        receiver.on_chunk(variant(2, sha256="0" * 64), chunks[2].data, sender=ALICE)
    assert exc_info.value.reason == "transfer_mismatch"
    assert receiver.active == 0
    assert leftovers(tmp_path / "inbox") == []
    with pytest.raises(FileTransferError) as exc_info:  # the verdict stands for later chunks
        receiver.on_chunk(chunks[3].payload_json, chunks[3].data, sender=ALICE)
    assert exc_info.value.reason == "transfer_mismatch"
    other = FileReceiver(tmp_path / "inbox2")
    with pytest.raises(FileTransferError) as exc_info:  # total does not follow from size and chunk_size
        other.on_chunk(variant(total=first["total"] + 1), chunks[1].data, sender=ALICE)
    assert exc_info.value.reason == "transfer_mismatch"


def test_transfers_are_keyed_by_sender(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 5000)
    receiver = FileReceiver(tmp_path / "inbox")
    c = FileSender("same-id", src, chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
    receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    assert receiver.state("same-id", sender=ALICE).ranges == ((0, 1),)
    assert receiver.state("same-id", sender=MALLORY).status is AckStatus.UNKNOWN
    receiver.on_chunk(c.payload_json, c.data, sender=MALLORY)
    assert receiver.active == 2


def test_duplicate_chunks_are_acknowledged_not_rewritten(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 5000)
    receiver = FileReceiver(tmp_path / "inbox")
    c = FileSender("t-dup", src, chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
    a1 = receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    a2 = receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    assert a1 == a2 and receiver.stats.duplicates == 1 and receiver.stats.chunks == 1


def test_existing_file_is_not_replaced_unless_asked(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    digest = make_file(src, 5000)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.bin").write_bytes(b"keep me")
    with pytest.raises(FileTransferError) as exc_info:
        pump(FileSender("t1", src), FileReceiver(inbox))
    assert exc_info.value.reason == "file_exists"
    assert (inbox / "a.bin").read_bytes() == b"keep me"
    (inbox / "link.bin").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(FileTransferError) as exc_info:
        pump(FileSender("t2", src, name="link.bin"), FileReceiver(inbox))
    assert exc_info.value.reason == "file_exists"
    assert not (tmp_path / "elsewhere").exists()
    pump(FileSender("t3", src), FileReceiver(inbox, overwrite=True))
    assert sha_of(inbox / "a.bin") == digest


def test_too_many_transfers_is_not_fatal(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 5000)
    receiver = FileReceiver(tmp_path / "inbox", max_transfers=2)
    for tid in ("t1", "t2"):
        c = FileSender(tid, src, name=f"{tid}.bin", chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
        receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    c = FileSender("t3", src, name="t3.bin", chunk_size=MIN_CHUNK_SIZE).next_chunks(0.0)[0]
    with pytest.raises(FileTransferError) as info:
        receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    assert info.value.reason == "too_many_transfers"
    assert not info.value.fatal
    assert receiver.abandon("t1", sender=ALICE)
    receiver.on_chunk(c.payload_json, c.data, sender=ALICE)
    assert receiver.expire(now=100.0, max_idle=10.0) == 2
    assert receiver.active == 0


def test_chunk_size_is_bounded_by_the_frame_size(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    src.write_bytes(b"x")
    assert FileSender("t", src, max_frame_size=64 * 1024).chunk_size < 64 * 1024
    with pytest.raises(ConfigError):
        FileSender("t", src, chunk_size=4 * MiB)
    with pytest.raises(ConfigError):
        FileSender("t", src, chunk_size=MIN_CHUNK_SIZE - 1)
    with pytest.raises(ConfigError):
        FileSender("t", src, window=0)
    receiver = FileReceiver(tmp_path / "inbox", max_frame_size=64 * 1024)
    with pytest.raises(FileTransferError) as exc_info:
        receiver.on_chunk(header_json(chunk_size=128 * 1024), b"0123456789", sender=ALICE)
    assert exc_info.value.reason == "bad_transfer_payload"


# --- payloads -----------------------------------------------------------------------------------


def test_payload_round_trips() -> None:
    h = ChunkHeader("t", "a.txt", 1, 3, 2500, 1024, "0" * 64, "1" * 64)
    assert parse_payload(h.to_json()) == h
    a = AckPayload("t", ((0, 2), (5, 9)), AckStatus.PARTIAL)
    assert parse_payload(a.to_json()) == a
    f = AckPayload("t", (), AckStatus.FAILED, "file_too_large", "too big")
    assert parse_payload(f.to_json()) == f
    assert parse_payload(StateQuery("t").to_json()) == StateQuery("t")
    assert StateQuery("t").to_json() == '{"transfer_id":"t","query":true}'  # as before "start" existed
    assert parse_payload(StateQuery("t", start=True).to_json()) == StateQuery("t", start=True)


@pytest.mark.parametrize(
    "payload",
    [
        "not json",
        "[]",
        '{"transfer_id": "t", "ack": [[2, 1]], "status": "partial"}',
        '{"transfer_id": "t", "ack": [[0, 2], [1, 3]], "status": "partial"}',
        '{"transfer_id": "t", "ack": [[0, 2], [2, 3]], "status": "partial"}',
        '{"transfer_id": "t", "ack": [[0, true]], "status": "partial"}',
        '{"transfer_id": "t", "ack": [], "status": "maybe"}',
        '{"transfer_id": "t", "ack": [], "status": "failed"}',
        '{"transfer_id": "", "ack": [], "status": "partial"}',
        '{"transfer_id": "t", "ack": {}, "status": "partial"}',
        '{"transfer_id": "t"}',
        '{"transfer_id": "t", "query": true, "start": "yes"}',
        json.dumps({"transfer_id": "t", "pad": "x" * 5000}),
    ],
)
def test_bad_payloads(payload: str) -> None:
    with pytest.raises(FileTransferError) as exc_info:
        parse_payload(payload)
    assert exc_info.value.reason == "bad_transfer_payload"


def test_sender_refuses_acks_for_other_transfers_or_out_of_range(tmp_path: Path) -> None:
    src = tmp_path / "a.bin"
    make_file(src, 5000)
    sender = FileSender("t", src, chunk_size=MIN_CHUNK_SIZE)
    with pytest.raises(FileTransferError) as exc_info:
        sender.on_ack(AckPayload("other", ((0, 1),)))
    assert exc_info.value.reason == "bad_transfer_payload"
    with pytest.raises(FileTransferError) as exc_info:
        sender.on_ack(AckPayload("t", ((0, sender.total + 1),)))
    assert exc_info.value.reason == "bad_transfer_payload"


# --- vectors ------------------------------------------------------------------------------------


def test_vector_chunks_assemble_the_file(tmp_path: Path) -> None:
    ft = VECTORS["file_transfer"]
    content = bytes.fromhex(ft["content_hex"])
    receiver = FileReceiver(tmp_path / "inbox")
    for chunk in reversed(ft["chunks"]):  # out of order on purpose
        assert json.loads(chunk["payload_json"]) == chunk["payload"]
        receiver.on_chunk(chunk["payload_json"], bytes.fromhex(chunk["extra_data_hex"]), sender=ALICE)
    assert (tmp_path / "inbox" / "notes.txt").read_bytes() == content
    for ack in ft["acks"]:
        parsed = parse_payload(ack["payload_json"])
        assert isinstance(parsed, AckPayload)
        assert parsed.to_json() == ack["payload_json"]
    assert isinstance(parse_payload(ft["query"]["payload_json"]), StateQuery)


@pytest.mark.parametrize("vector", VECTORS["file_transfer"]["negative"], ids=lambda v: v["name"])
def test_vector_negative_chunks(tmp_path: Path, vector: dict[str, Any]) -> None:
    receiver = FileReceiver(tmp_path / "inbox", max_size=vector["max_size"])
    with pytest.raises(FileTransferError) as info:
        receiver.on_chunk(vector["payload_json"], bytes.fromhex(vector["extra_data_hex"]), sender=ALICE)
    assert info.value.reason == vector["error"]
