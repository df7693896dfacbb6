"""One sender, or one connection with its FORWARDs, holds at most its share of the replay
store's sessions (1 % of ``max_sessions`` by default): a real ``iac node`` process flooded with
new sessions from one TLS connection keeps admitting other senders' first sessions."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run

from iac.node.node import Node
from iac.transport import dial
from iac.wire._pb.iac_pb2 import Forward, MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame, open_message, sign_message

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
SLOW = bool(os.environ.get("IAC_SLOW"))


@contextlib.contextmanager
def iac_node(tmp_path: Path, *args: str) -> Iterator[dict[str, str]]:
    """``iac node`` on a loopback TLS port; its ``node``, ``listening`` and ``status`` lines."""
    key = tmp_path / "victim.key"
    Identity.generate().save(key)
    admin = tmp_path / "victim.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "iac", "node", "--key", str(key), "--listen", "tls://127.0.0.1:0",
         "--admin", str(admin), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines: dict[str, str] = {}
        while "status" not in lines:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            kind, _, value = line.strip().partition(" ")
            lines.setdefault(kind, value)
        yield lines
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def status(admin: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "iac", "status", "--admin", admin, "--json"],
        capture_output=True, text=True, env=ENV, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def flood(tmp_path: Path, *, sessions: int, share: int, max_sessions: int, forwarded: int) -> None:
    """One key on one TLS connection: ``forwarded`` sessions of throwaway keys inside FORWARD,
    then ``sessions`` new sessions of its own (PINGs, each answered: a PONG when admitted, busy
    when not), while five honest nodes each ask for the first time; then the counts."""
    args = ["--max-sessions", str(max_sessions)]
    if share != max_sessions // 100:
        args += ["--sessions-per-tenant", str(share)]
    with iac_node(tmp_path, *args) as lines:
        victim, url = lines["node"], lines["listening"]

        async def main() -> None:
            x = Identity.generate()
            conn = await dial(url, x, expect=victim)
            loop = asyncio.get_running_loop()
            answers: Counter[str] = Counter()
            done = asyncio.Event()

            async def read() -> None:
                while True:
                    inc = await conn.recv()
                    if inc.frame.type != FrameType.MESSAGE:
                        continue
                    msg = open_message(inc.frame.body)
                    if msg.msg_type == MessageType.ERROR:
                        answers["busy" if "busy" in msg.payload_json else msg.payload_json[:80]] += 1
                    else:
                        answers["answered"] += 1
                    if sum(answers.values()) >= sessions:
                        done.set()

            def ping(sender: Identity, session: Session) -> Any:
                t = time.time_ns() // 1000
                return build_message(sender=sender.agent_id, to=victim, msg_type=MessageType.PING,
                                     session=session, timestamp_us=t, deadline_us=t + 30_000_000)  # fmt: skip

            reader = asyncio.ensure_future(read())
            try:
                for _ in range(forwarded):  # throwaway keys, one session each, through this connection
                    z = Identity.generate()
                    inner = sign_message(z, ping(z, Session()))
                    fwd = Forward(hop_limit=4, path=[z.agent_id, x.agent_id], message=inner)
                    await conn.send(encode_frame(FrameType.FORWARD, fwd.SerializeToString()))
                frames = [encode_message_frame(x, ping(x, Session())) for _ in range(sessions)]

                async def attack() -> None:
                    for f in frames:
                        await conn.send(f)

                async def honest(i: int) -> float:
                    async with Node() as node:
                        node.add_peer(victim, url)
                        start = loop.time()
                        await node.request(victim, MessageType.PING, None, timeout=5.0)
                        return loop.time() - start

                attacking = asyncio.ensure_future(attack())
                took = []
                for i in range(5):  # while the flood is on its way
                    took.append(await honest(i))
                await attacking
                await asyncio.wait_for(done.wait(), 60)
                assert max(took) < 5.0, took
                # the bound: the connection's own sessions plus those it forwarded, its share
                assert answers["answered"] == share - forwarded, answers
                assert answers["busy"] == sessions - (share - forwarded), answers
                for i in range(5):  # and once it is over its share: still every honest first session
                    took.append(await honest(i))
                assert max(took) < 5.0, took
            finally:
                reader.cancel()
                await conn.close()

        run(main(), timeout=120)
        refused = status(lines["status"])["stats"]["refused"]
        assert refused["replay_store_full"] == sessions - (share - forwarded), refused


def test_one_connection_holds_its_share_of_the_replay_store(tmp_path: Path) -> None:
    """The attack of 100,600 sessions, scaled: 1,006 sessions (and 40 forwarded) against a
    node with max_sessions 10,000 (the default share: 1 %, 100)."""
    flood(tmp_path, sessions=1_006, share=100, max_sessions=10_000, forwarded=40)


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="slow: set IAC_SLOW=1")
def test_one_connection_holds_its_share_of_the_replay_store_at_full_size(tmp_path: Path) -> None:
    """The attack at full size: 100,600 sessions from one connection against the defaults."""
    flood(tmp_path, sessions=100_600, share=1_000, max_sessions=100_000, forwarded=400)
