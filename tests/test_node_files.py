"""Node.send_file over real loopback connections: intact delivery, resume after a killed connection,
refusals (no inbox, unsafe name, size, existing file), tampered chunks, a relay in between.

The large transfer runs through a TCP proxy that the test kills at ~50 % (from the progress
callback): the sender redials, asks the receiver what it holds and sends only the rest.
24 MiB by default; IAC_SLOW=1 sends 200 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import message_of, run

from iac.errors import ConfigError, RemoteError, TransferRefused
from iac.node.config import NodeConfig
from iac.node.node import Node, ReceivedFile
from iac.protocol.files import (
    ChunkHeader,
    FileReceiver,
    FileSender,
    TransferProgress,
    chunk_count,
    default_chunk_size,
    new_transfer_id,
)
from iac.protocol.routing import RelayPolicy
from iac.testing import node_pair
from iac.transport import dial
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Message, MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame

SLOW = os.environ.get("IAC_SLOW") == "1"
BIG = (200 if SLOW else 24) * 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def tmpdir() -> AsyncIterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="iacf-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def make_file(path: Path, size: int) -> str:
    """A file of pseudo-random bytes; returns its SHA-256."""
    h = hashlib.sha256()
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        left = size
        i = 0
        while left:
            piece = (block[i % 7 :] + block[: i % 7])[: min(left, len(block))]  # vary blocks cheaply
            f.write(piece)
            h.update(piece)
            left -= len(piece)
            i += 1
    return h.hexdigest()


def inbox(d: Path) -> NodeConfig:
    """A receiver with an inbox in ``d``."""
    return NodeConfig(inbox_dir=d / "inbox")


class TcpProxy:
    """Forwards TCP connections to a target; :meth:`kill` aborts every connection it carries."""

    def __init__(self, port: int) -> None:
        self.target_port = port
        self.pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self.kills = 0
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"tls://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.pairs.append((writer, up_writer))
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(1 << 16):
                dst.write(data)
                await dst.drain()
        dst.close()

    def kill(self) -> None:
        for a, b in self.pairs:
            a.transport.abort()
            b.transport.abort()
        self.pairs.clear()
        self.kills += 1

    async def close(self) -> None:
        self.kill()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.mark.slow  # 24 MiB by default; IAC_SLOW=1 sends 200 MiB
def test_large_file_survives_a_killed_connection_and_resumes() -> None:
    async def main() -> None:
        async with tmpdir() as d, node_pair("tls", server_config=inbox(d)) as (_tx, rx):
            src = d / "big.bin"
            digest = make_file(src, BIG)
            port = int(rx.addresses[0].rsplit(":", 1)[1])
            proxy = TcpProxy(port)
            via_proxy = await proxy.start()
            tx2 = Node()  # a sender that knows the receiver only through the proxy
            await tx2.start()
            tx2.add_peer(rx.agent_id, via_proxy)
            seen: list[TransferProgress] = []
            at_kill: list[int] = []

            def progress(p: TransferProgress) -> None:
                seen.append(p)
                if not at_kill and p.fraction >= 0.5:
                    at_kill.append(p.chunks_done)
                    proxy.kill()

            try:
                res = await tx2.send_file(rx.agent_id, src, on_progress=progress, timeout=30)
            finally:
                await tx2.close()
                await proxy.close()
            out = d / "inbox" / "big.bin"
            assert res.name == "big.bin" and res.sha256 == digest and res.size == BIG
            assert out.stat().st_size == BIG and stat.S_IMODE(out.stat().st_mode) == 0o600
            assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
            assert proxy.kills >= 1 and res.resumed >= 1
            # Only chunks in flight at the break were sent again: none of the acknowledged ones.
            window = tx2.config.file_window
            assert res.chunks_sent == res.chunks + res.chunks_resent
            assert res.chunks_resent <= window
            assert at_kill[0] >= res.chunks // 2
            files = rx.stats().files
            # Chunks still queued on the dead connection may land after the state query was answered:
            # those (never acknowledged) are the only ones the receiver can see twice.
            assert files["received"] == 1 and files["chunk_duplicates"] <= res.chunks_resent
            assert files["chunks_received"] == res.chunks
            assert seen[-1].fraction == 1.0
            assert not [p for p in (d / "inbox").iterdir() if p.name.startswith(".")]  # no leftovers

    run(main(), timeout=300 if SLOW else 120)


def test_send_file_progress_result_and_on_file() -> None:
    async def main() -> None:
        async with tmpdir() as d, node_pair("tls", server_config=inbox(d)) as (tx, rx):
            src = d / "notes.txt"
            digest = make_file(src, 300_003)
            got: list[ReceivedFile] = []
            rx.on_file(got.append)
            seen: list[float] = []
            res = await tx.send_file(
                rx.agent_id,
                src,
                name="report.txt",
                chunk_size=32 * 1024,
                on_progress=lambda p: seen.append(p.fraction),
            )
            assert res.name == "report.txt" and res.chunks == chunk_count(300_003, 32 * 1024)
            assert res.chunks_resent == 0 and res.resumed == 0
            assert seen == sorted(seen) and seen[-1] == 1.0
            out = d / "inbox" / "report.txt"
            assert hashlib.sha256(out.read_bytes()).hexdigest() == digest
            assert got == [ReceivedFile(tx.agent_id, res.transfer_id, "report.txt", out, 300_003, digest)]
            assert tx.stats().files["sent"] == 1 and rx.stats().files["received"] == 1
            # The same name again: the receiver never replaces a file.
            with pytest.raises(TransferRefused) as e:
                await tx.send_file(rx.agent_id, src, name="report.txt")
            assert e.value.code == "file_exists"
            assert rx.stats().file_refused == {"file_exists": 1}
            # An empty file is one empty chunk.
            empty = d / "empty"
            empty.write_bytes(b"")
            res = await tx.send_file(rx.agent_id, empty)
            assert res.chunks == 1 and (d / "inbox" / "empty").read_bytes() == b""

    run(main())


def test_refusals_no_inbox_size_limit_and_local_name_check() -> None:
    async def main() -> None:
        async with tmpdir() as d:
            src = d / "f.bin"
            make_file(src, 5000)
            # no inbox: files are refused
            async with node_pair("tls", server_config=NodeConfig()) as (tx, rx):
                with pytest.raises(RemoteError) as e:
                    await tx.send_file(rx.agent_id, src, timeout=5)
                assert e.value.code == "no_handler"
                assert rx.stats().refused == {"no_handler": 1}
                assert tx.stats().files["failed"] == 1
            small = NodeConfig(inbox_dir=d / "small", max_file_size=4096)
            async with node_pair("tls", server_config=small) as (tx, rx):
                with pytest.raises(TransferRefused) as e2:
                    await tx.send_file(rx.agent_id, src, timeout=5)
                assert e2.value.code == "file_too_large"
                for bad in ("../escape", "a/b", ".hidden", ""):
                    with pytest.raises(ConfigError):
                        await tx.send_file(rx.agent_id, src, name=bad)
                assert not (d / "escape").exists()

    run(main())


def test_file_through_a_relay() -> None:
    async def main() -> None:
        async with (
            tmpdir() as d,
            Node(listen=[f"unix://{d}/c.sock"], config=NodeConfig(inbox_dir=d / "inbox")) as c,
            Node(
                listen=["tls://127.0.0.1:0"], config=NodeConfig(relay_policy=RelayPolicy(relay_unicast=True))
            ) as b,
            Node() as a,
        ):
            b.add_peer(c.agent_id, *c.addresses)
            await b.connect(c.agent_id)
            a.add_peer(b.agent_id, *b.addresses)
            src = d / "relayed.bin"
            digest = make_file(src, 1_000_000)
            res = await a.send_file(c.agent_id, src, via=b.agent_id, timeout=10)
            assert res.sha256 == digest
            assert hashlib.sha256((d / "inbox" / "relayed.bin").read_bytes()).hexdigest() == digest
            assert b.stats().routing["relayed"] >= 2 * res.chunks  # chunks one way, acks the other

    run(main())


# --- a malicious sender on a raw connection -----------------------------------------------------


class RawSender:
    def __init__(self, identity: Identity, conn: Connection, rx: Node) -> None:
        self.identity = identity
        self.conn = conn
        self.rx = rx
        self.session = Session()

    async def send(self, payload_json: str, data: bytes = b"") -> Message:
        msg = build_message(
            sender=self.identity.agent_id,
            to=self.rx.agent_id,
            msg_type=MessageType.FILE_TRANSFER,
            session=self.session,
            timestamp_us=self.rx.clock.now_us(),
            payload_json=payload_json,
            extra_data=data,
        )
        await self.conn.send(encode_message_frame(self.identity, msg))
        inc = await asyncio.wait_for(self.conn.recv(), 5)
        assert message_of(inc) is not None
        return message_of(inc)


def answer(m: Message) -> tuple[int, Any]:
    return int(m.msg_type), json.loads(m.payload_json)


def test_tampered_chunks_and_unsafe_names_from_a_raw_sender_are_refused() -> None:
    async def main() -> None:
        async with tmpdir() as d, node_pair("tls", server_config=inbox(d)) as (_tx, rx):
            me = Identity.generate()
            conn = await dial(rx.addresses[0], me, expect=rx.agent_id)
            raw = RawSender(me, conn, rx)
            try:
                content = os.urandom(3000)
                size, cs = len(content), 1024
                chunks = [content[i * cs : (i + 1) * cs] for i in range(3)]
                file_sha = hashlib.sha256(content).hexdigest()

                def header(i: int, tid: str, *, name: str = "data.bin", sha: str = file_sha,
                           chunk_sha: str | None = None) -> str:  # fmt: skip
                    own = chunk_sha or hashlib.sha256(chunks[i]).hexdigest()
                    return ChunkHeader(tid, name, i, 3, size, cs, sha, own).to_json()

                # 1. A chunk whose bytes do not match its chunk_sha256: refused, not written.
                tid = new_transfer_id()
                tampered = bytes([chunks[0][0] ^ 1]) + chunks[0][1:]
                mt, body = answer(await raw.send(header(0, tid), tampered))
                assert mt == MessageType.ERROR and body["code"] == "bad_request"
                assert "chunk_hash_mismatch" in body["message"]
                # 2. The genuine chunks complete the file.
                for i in range(3):
                    mt, body = answer(await raw.send(header(i, tid), chunks[i]))
                assert mt == MessageType.FILE_TRANSFER and body["status"] == "complete"
                assert (d / "inbox" / "data.bin").read_bytes() == content
                # 3. Chunks that each match their own hash but not the announced file hash: the whole
                #    file is refused before the rename.
                tid2 = new_transfer_id()
                wrong = hashlib.sha256(b"something else").hexdigest()
                for i in range(3):
                    mt, body = answer(
                        await raw.send(header(i, tid2, name="forged.bin", sha=wrong), chunks[i])
                    )
                assert body["status"] == "failed" and body["error"] == "file_hash_mismatch"
                assert not (d / "inbox" / "forged.bin").exists()
                # 4. Names that would escape the inbox.
                for bad in ("../escape.bin", "/etc/passwd", "..", "a\\b", ".iac-part-x"):
                    mt, body = answer(await raw.send(header(0, new_transfer_id(), name=bad), chunks[0]))
                    assert body["status"] == "failed" and body["error"] == "unsafe_file_name", bad
                assert not (d / "escape.bin").exists()
                # 5. A state query for an unknown transfer, and a payload that is not a chunk.
                mt, body = answer(await raw.send(json.dumps({"transfer_id": "nope", "query": True})))
                assert body == {"transfer_id": "nope", "ack": [], "status": "unknown"}
                mt, body = answer(await raw.send('{"hello": 1}'))
                assert mt == MessageType.ERROR and body["code"] == "bad_request"
            finally:
                await conn.close()
            refused = rx.stats().file_refused
            assert refused["chunk_hash_mismatch"] == 1 and refused["file_hash_mismatch"] == 1
            assert refused["unsafe_file_name"] == 5
            leftovers = [p.name for p in (d / "inbox").iterdir()]
            assert sorted(leftovers) == ["data.bin"]

    run(main())


# --- a sender started again; abandoned partial transfers -----------------------------------------


def test_a_file_sent_again_after_it_was_moved_away_arrives_again() -> None:
    """Transfer ids come from the sender, receiver and file, so the same file gets the same id
    each time; the receiver's memory of a finished transfer must not answer a new attempt."""

    async def main() -> None:
        async with tmpdir() as d, node_pair("tls", server_config=inbox(d)) as (tx, rx):
            src = d / "same.bin"
            digest = make_file(src, 100_000)
            first = await tx.send_file(rx.agent_id, src)
            (d / "inbox" / "same.bin").rename(d / "taken.bin")
            again = await tx.send_file(rx.agent_id, src)
            assert again.transfer_id == first.transfer_id and again.chunks_sent == again.chunks
            assert hashlib.sha256((d / "inbox" / "same.bin").read_bytes()).hexdigest() == digest
            assert rx.stats().files["received"] == 2

    run(main())


def test_abandoned_partial_transfers_are_deleted_from_the_inbox() -> None:
    """A partial transfer idle longer than ``file_partial_ttl`` (here: its files last written an
    hour ago, with a TTL of a minute) is deleted by the node's housekeeping; a fresh one stays."""

    async def main() -> None:
        async with tmpdir() as d:
            box = d / "inbox"
            old = FileReceiver(box)  # an earlier receiving process, stopped mid-transfer
            src = d / "f.bin"
            make_file(src, 5000)
            for tid, when in (("t-old", time.time() - 3600), ("t-fresh", time.time())):
                c = FileSender(tid, src, name=f"{tid}.bin", chunk_size=1024).next_chunks(0.0)[0]
                before = {p.name for p in box.iterdir()}
                old.on_chunk(c.payload_json, c.data, sender=Identity.generate().agent_id)
                for p in box.iterdir():
                    if p.name not in before:
                        os.utime(p, (when, when))
            old.close()
            assert len(list(box.iterdir())) == 4
            config = NodeConfig(inbox_dir=box, file_partial_ttl=60.0)
            async with Node(config=config):
                for _ in range(100):  # housekeeping runs every second
                    if len(list(box.iterdir())) == 2:
                        break
                    await asyncio.sleep(0.05)
            left = sorted(p.name for p in box.iterdir())
            assert len(left) == 2 and all(time.time() - (box / n).stat().st_mtime < 600 for n in left)

    run(main())
    with pytest.raises(ConfigError):
        NodeConfig(file_partial_ttl=0)


class CuttingProxy(TcpProxy):
    """A :class:`TcpProxy` that calls ``on_half`` once ``limit`` bytes went to the target."""

    def __init__(self, port: int, limit: int, on_half: Callable[[], None]) -> None:
        super().__init__(port)
        self.limit, self.on_half, self.forwarded = limit, on_half, 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.pairs.append((writer, up_writer))

        async def upstream() -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await reader.read(1 << 16):
                    up_writer.write(data)
                    await up_writer.drain()
                    self.forwarded += len(data)
                    if self.forwarded >= self.limit:
                        self.on_half()
                        return
            up_writer.close()

        await asyncio.gather(upstream(), self._pump(up_reader, writer))


_SENT_LINE = re.compile(r"(\d+) chunks sent, (\d+) resent, (\d+) resumed, (\d+) reconnects")


def test_a_killed_send_file_process_is_resumed_by_the_next_run() -> None:
    """`iac send-file` is killed (SIGKILL) halfway; run again, it sends only what the receiver
    lacks, and the file arrives intact."""

    async def main() -> None:
        async with tmpdir() as d, Node(listen=["tls://127.0.0.1:0"], config=inbox(d)) as rx:
            Identity.generate().save(d / "tx.key")
            src = d / "big.bin"
            digest = make_file(src, 24 * 1024 * 1024)
            total = chunk_count(src.stat().st_size, default_chunk_size())
            received: list[ReceivedFile] = []
            rx.on_file(received.append)

            def send_file(addr: str) -> list[str]:
                key = str(d / "tx.key")
                return [sys.executable, "-m", "iac", "send-file", "--key", key, "--to", rx.agent_id,
                        "--addr", addr, str(src), "--quiet", "--timeout", "20"]  # fmt: skip

            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            port = int(rx.addresses[0].rsplit(":", 1)[1])
            procs: list[asyncio.subprocess.Process] = []

            def kill_sender() -> None:
                if procs[0].returncode is None:
                    procs[0].send_signal(signal.SIGKILL)
                proxy.kill()

            proxy = CuttingProxy(port, src.stat().st_size // 2, kill_sender)
            via_proxy = await proxy.start()
            procs.append(await asyncio.create_subprocess_exec(*send_file(via_proxy), env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE))  # fmt: skip
            out, _ = await procs[0].communicate()
            await proxy.close()
            assert procs[0].returncode == -signal.SIGKILL and out == b""
            # the receiver reads what reached it before the cut; wait until it holds still
            last = -1
            while (now := rx.stats().files["chunks_received"]) != last or rx.stats().connections:
                last = now
                await asyncio.sleep(0.3)
            held = last
            assert 0 < held < total and received == []
            parts = [p for p in (d / "inbox").iterdir() if p.name.startswith(".iac-part-")]
            assert len(parts) == 2 and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in parts)

            again = await asyncio.create_subprocess_exec(*send_file(rx.addresses[0]), env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)  # fmt: skip
            out, err = await again.communicate()
            assert again.returncode == 0, err.decode()
            match = _SENT_LINE.search(out.decode())
            assert match is not None, out.decode()
            sent, resent, resumed, _reconnects = map(int, match.groups())
            assert (sent, resent, resumed) == (total - held, 0, held), out.decode()
            result = d / "inbox" / "big.bin"
            assert hashlib.sha256(result.read_bytes()).hexdigest() == digest
            assert len(received) == 1 and received[0].sha256 == digest
            assert rx.stats().files["chunks_received"] == total  # every chunk written once
            assert not [p for p in (d / "inbox").iterdir() if p.name.startswith(".")]

    run(main(), timeout=120)


# --- the command line -----------------------------------------------------------------------------


def send_file_args(argv: list[str]) -> argparse.Namespace:
    from iac.cli.files import register

    parser = argparse.ArgumentParser(prog="iac")
    register(parser.add_subparsers(dest="verb", required=True))
    return parser.parse_args(["send-file", *argv])


def test_cli_send_file_to_an_inbox_node_process(capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> None:
        async with tmpdir() as d:
            Identity.generate().save(d / "rx.key")
            Identity.generate().save(d / "tx.key")
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "iac", "node", "--key", str(d / "rx.key"),
                "--listen", "tls://127.0.0.1:0", "--inbox", str(d / "inbox"),
                stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
            assert proc.stdout is not None
            try:
                node_id = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()[1]
                addr = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().split()[1]
                src = d / "upload.bin"
                digest = make_file(src, 700_000)
                args = send_file_args(["--key", str(d / "tx.key"), "--to", node_id, "--addr", addr,
                                       str(src), "--name", "up.bin", "--quiet"])  # fmt: skip
                assert await asyncio.to_thread(args.func, args) == 0
                lines = [(await asyncio.wait_for(proc.stdout.readline(), 30)).decode() for _ in range(3)]
                assert lines[0].startswith("inbox ")
                assert lines[1].startswith("status ")  # the status socket for `iac status`
                assert lines[2].startswith(f"received up.bin 700000 sha256={digest} from ")
                assert hashlib.sha256((d / "inbox" / "up.bin").read_bytes()).hexdigest() == digest
            finally:
                proc.terminate()
                assert await asyncio.wait_for(proc.wait(), 30) == 0

    run(main(), timeout=60)
    out = capsys.readouterr().out
    assert out.startswith("sent up.bin 700000 bytes sha256=")
    assert out.rstrip().endswith(", 3 chunks sent, 0 resent, 0 resumed, 0 reconnects"), out


def test_cli_send_file_errors_are_config_errors(tmp_path: Path) -> None:
    Identity.generate().save(tmp_path / "k")
    bad_to = send_file_args(
        ["--key", str(tmp_path / "k"), "--to", "nobody", "--addr", "tls://127.0.0.1:1", "x"]
    )
    with pytest.raises(ConfigError, match="--to"):
        bad_to.func(bad_to)
    aid = Identity.generate().agent_id
    missing = send_file_args(
        ["--key", str(tmp_path / "k"), "--to", aid, "--addr", "tls://127.0.0.1:1", "nofile"]
    )
    with pytest.raises(ConfigError, match="no such file"):
        missing.func(missing)


def test_progress_bar_draws_on_a_stream() -> None:
    import io

    from iac.cli.files import ProgressBar

    buf = io.StringIO()
    bar = ProgressBar(buf, "f.bin", enabled=True)
    bar.update(512, 1024, force=True)
    bar.update(1024, 1024)
    bar.finish()
    text = buf.getvalue()
    assert " 50.0%" in text and "100.0%" in text and text.endswith("\n")
    quiet = io.StringIO()
    ProgressBar(quiet, "f", enabled=False).update(1, 2)
    assert quiet.getvalue() == ""
