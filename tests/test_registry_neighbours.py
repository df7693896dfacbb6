"""Throwaway keys through one neighbour: a real ``iac registry`` process takes at most
``--forwarded-keys`` (default 100) new keys an hour from one connection's FORWARDs, refuses the
rest with ``registry_quota``, answers every honest direct publish meanwhile, and once full makes
room for direct publishes by evicting what that neighbour brought in."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import run

from iac.mesh.wire import lookup_request, publish_request
from iac.node.node import Node
from iac.protocol.records import AgentRecord, SignedRecord, sign_record
from iac.protocol.routing import parse_forward
from iac.transport import dial
from iac.wire._pb.iac_pb2 import Forward, MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, open_message, sign_message

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
HOUR_US = 3600 * 1_000_000


def record(who: Identity) -> SignedRecord:
    now = time.time_ns() // 1000
    return sign_record(who, AgentRecord(who.agent_id, 1, now + HOUR_US, addresses=("tls://127.0.0.1:9",)))


@contextmanager
def iac_registry(tmp_path: Path, *args: str) -> Iterator[tuple[str, str]]:
    key = tmp_path / "registry.key"
    Identity.generate().save(key)
    proc = subprocess.Popen(
        [sys.executable, "-m", "iac", "registry", "--key", str(key), "--listen", "tls://127.0.0.1:0",
         "--store", "memory", "--no-admin", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines: dict[str, str] = {}
        while "listening" not in lines:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else ""
            kind, _, value = line.strip().partition(" ")
            lines.setdefault(kind, value)
        yield lines["registry"], lines["listening"]
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


def test_throwaway_keys_through_one_neighbour_are_held_to_its_quota(tmp_path: Path) -> None:
    attack, honest_n = 150, 5
    # full after the neighbour's 100 and the first five honest keys: the next five evict
    with iac_registry(tmp_path, "--max-keys", str(100 + honest_n)) as (registry, url):

        async def main() -> None:
            loop = asyncio.get_running_loop()
            x = Identity.generate()
            conn = await dial(url, x, expect=registry)
            answers: Counter[str] = Counter()
            admitted: list[str] = []
            all_in = asyncio.Event()

            async def read() -> None:  # the registry's answers come back through x (a learned route)
                while True:
                    inc = await conn.recv()
                    if inc.frame.type != FrameType.FORWARD:
                        continue
                    msg = open_message(parse_forward(inc.frame.body).message)
                    if msg.msg_type == MessageType.ERROR:
                        answers[json.loads(msg.payload_json)["message"].partition(":")[0]] += 1
                    else:
                        answers["published"] += 1
                        admitted.append(msg.to)
                    if sum(answers.values()) == attack:
                        all_in.set()

            honest: list[str] = []

            async def publish_direct() -> float:
                async with Node() as node:
                    honest.append(node.agent_id)
                    node.add_peer(registry, url)
                    start = loop.time()
                    req = publish_request(record(node.identity))
                    await node.request(registry, MessageType.REGISTER_KEY, req, timeout=5.0)
                    return loop.time() - start

            reader = asyncio.ensure_future(read())
            try:
                frames = []
                for _ in range(attack):  # one throwaway key per publish, all through x
                    z = Identity.generate()
                    now = time.time_ns() // 1000
                    msg = build_message(sender=z.agent_id, to=registry, msg_type=MessageType.REGISTER_KEY,
                                        session=Session(), timestamp_us=now, deadline_us=now + 30_000_000,
                                        payload_json=json.dumps(publish_request(record(z))))  # fmt: skip
                    fwd = Forward(hop_limit=4, path=[z.agent_id, x.agent_id], message=sign_message(z, msg))
                    frames.append(encode_frame(FrameType.FORWARD, fwd.SerializeToString()))

                async def flood() -> None:
                    for f in frames:
                        await conn.send(f)

                flooding = asyncio.ensure_future(flood())
                took = [await publish_direct() for _ in range(honest_n)]  # while the flood arrives
                await flooding
                await asyncio.wait_for(all_in.wait(), 30)
                assert answers == {"published": 100, "registry_quota": attack - 100}, answers
                # full: each direct publish evicts a key that x brought in
                took += [await publish_direct() for _ in range(honest_n)]
                assert max(took) < 5.0, took
                async with Node() as node:
                    node.add_peer(registry, url)

                    async def held(agent_id: str) -> bool:
                        req = lookup_request(agent_id=agent_id)
                        reply = await node.request(registry, MessageType.REGISTER_KEY, req, timeout=5.0)
                        return bool(reply.payload["entries"])

                    assert [await held(a) for a in honest] == [True] * 2 * honest_n
                    assert sum([await held(a) for a in admitted]) == 100 - honest_n
            finally:
                reader.cancel()
                await conn.close()

        run(main(), timeout=90)
