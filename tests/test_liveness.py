"""Liveness: results that say what happened and work that ends when its peer is gone.

A broadcast says how many peers it went to (0 is counted and logged), a registry counts the
broadcasts that missed agents it knows, a stream's handler ends once its consumer's connection is
gone (a consumer killed with SIGKILL, in its own process) and never runs past ``max_stream_time``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys

import pytest
from conftest import HERE, ROOT, run

from iac import MeshClient, Node, NodeConfig, PeerEvent, RemoteError, TransportConfig, serve_registry
from iac.node import Broadcast
from iac.testing import eventually

TLS = "tls://127.0.0.1:0"
CONSUMER = HERE / "stream_consumer.py"


def short_idle(idle: float) -> NodeConfig:
    return NodeConfig(transport=TransportConfig(idle_timeout=idle))


def test_a_broadcast_into_an_idle_mesh_reports_0(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        cfg = short_idle(0.4)
        async with Node(listen=[TLS], config=cfg) as a, Node(listen=[TLS], config=cfg) as b:
            got: list[object] = []
            b.on("BROADCAST")(lambda ctx: got.append(ctx.payload))
            down = asyncio.Event()
            a.on_peer(lambda ev: None if ev.up else down.set())
            a.add_peer(b.agent_id, *b.addresses)
            await a.connect(b.agent_id)
            sent = await a.broadcast("BROADCAST", "live")
            assert isinstance(sent, Broadcast) and sent.peers == 1 and int(sent) == 1
            await eventually(lambda: got == ["live"])
            assert a.stats().routing["unsent"] == 0
            await asyncio.wait_for(down.wait(), 5)  # the mesh idled out
            with caplog.at_level(logging.WARNING, logger="iac.node"):
                for _ in range(3):
                    idle = await a.broadcast("BROADCAST", "idle")
                    assert idle.peers == 0 and idle.peer == ""
            assert a.stats().routing["unsent"] == 3
            assert sum("reached no peer" in r.getMessage() for r in caplog.records) == 3
            assert got == ["live"]

    run(main())


def test_a_registry_counts_a_broadcast_that_missed_agents_it_knows(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with Node(listen=[TLS]) as rn, Node() as a, Node() as b, Node() as c:
            reg = serve_registry(rn)
            clients = [MeshClient(n, rn.agent_id, rn.addresses) for n in (a, b, c)]
            for mc in clients:
                await mc.start()
            await eventually(lambda: reg.stats()["live_agents"] == 3)
            got: list[str] = []
            for n in (b, c):
                n.on("BROADCAST")(lambda ctx, n=n: got.append(n.agent_id))
            sent = await a.broadcast("BROADCAST", 1)  # a -> registry -> b, c: everyone
            assert sent.peers == 1
            await eventually(lambda: len(got) == 2)
            assert reg.stats()["short_broadcasts"] == 0 and rn.stats().routing["short"] == 0
            conn = rn.connection(c.agent_id)  # c drops off the registry
            assert conn is not None
            await conn.close()
            await eventually(lambda: not rn.connected(c.agent_id))
            with caplog.at_level(logging.WARNING, logger="iac.mesh"):
                await a.broadcast("BROADCAST", 2)
                await eventually(lambda: len(got) == 3)
                await eventually(lambda: reg.stats()["short_broadcasts"] == 1)
            assert rn.stats().routing["short"] == 1
            assert any("reached 2 of the 3 agents" in r.getMessage() for r in caplog.records)
            for mc in clients:
                await mc.close()
            reg.close()

    run(main())


def test_a_stream_is_capped_by_max_stream_time() -> None:
    async def main() -> None:
        async with Node(listen=[TLS], config=NodeConfig(max_stream_time=0.3)) as server, Node() as client:
            client.add_peer(server.agent_id, *server.addresses)
            ended = asyncio.Event()

            @server.on("RUN")
            async def forever(ctx):  # type: ignore[no-untyped-def]
                try:
                    yield 0
                    await asyncio.Event().wait()
                finally:
                    ended.set()

            parts = []
            with pytest.raises(RemoteError) as err:
                async for part in client.stream(server.agent_id, "RUN", timeout=3600):
                    parts.append(part.payload)
            assert parts == [0] and err.value.code == "timeout"
            assert ended.is_set() and server.stats().running == 0
            with pytest.raises(Exception, match="max_stream_time"):
                NodeConfig(max_stream_time=0)

    run(main())


@pytest.mark.parametrize("transport", ["tls"])
def test_a_killed_consumer_frees_the_producers_slot(transport: str) -> None:
    async def main() -> None:
        async with Node(listen=[f"{transport}://127.0.0.1:0"]) as producer:
            started, ended = asyncio.Event(), asyncio.Event()
            down = asyncio.Event()

            @producer.on("RUN")
            async def forever(ctx):  # type: ignore[no-untyped-def]
                started.set()
                try:
                    i = 0
                    while True:
                        yield i
                        i += 1
                finally:
                    ended.set()

            def on_peer(ev: PeerEvent) -> None:
                if not ev.up:
                    down.set()

            producer.on_peer(on_peer)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(CONSUMER), producer.agent_id, producer.addresses[0],
                stdout=asyncio.subprocess.PIPE, env=env,
            )  # fmt: skip
            try:
                assert proc.stdout is not None
                line = await asyncio.wait_for(proc.stdout.readline(), 20)
                assert json.loads(line) == {"part": 0}
                await eventually(lambda: producer.stats().running == 1)  # waiting for credit
                assert not ended.is_set()
                loop = asyncio.get_running_loop()
                proc.send_signal(signal.SIGKILL)
                killed = loop.time()
                await asyncio.wait_for(ended.wait(), 10)
                await eventually(lambda: producer.stats().running == 0, timeout=10)
                assert loop.time() - killed < 10
                assert down.is_set()
                assert producer.stats().replies_sent <= 3  # the window of 2, and the part made
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()

    run(main())
