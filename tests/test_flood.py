"""Flood: many messages to a deliberately slow handler. Memory stays bounded (the node's queue
depths never pass their configured bounds) and every message is either handled or refused
with ``busy`` — nothing is lost unseen. 100,000 messages with IAC_SLOW=1; fewer by default."""

from __future__ import annotations

import asyncio
import os

import pytest
from conftest import run

from iac.errors import RemoteError
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.testing import eventually
from iac.wire._pb.iac_pb2 import Message, MessageType

SLOW = os.environ.get("IAC_SLOW") == "1"
N_FULL = 100_000
N = N_FULL if SLOW else 10_000

BOB = NodeConfig(max_handlers=4, max_backlog=64, max_per_peer=N_FULL, sync_in_thread=False)


def _flood_one_way(n: int) -> None:
    async def main() -> None:
        async with Node(listen=["tls://127.0.0.1:0"], config=BOB) as bob, Node() as alice:
            handled = 0
            refusals: list[str] = []  # the code of every ERROR alice's on_error callback saw
            done = asyncio.Event()
            peak_depth = 0

            def check() -> None:
                if handled + len(refusals) == n:
                    done.set()

            @bob.on(MessageType.RUN)
            async def slow(ctx: Context) -> None:
                nonlocal handled, peak_depth
                st = bob.stats()
                peak_depth = max(peak_depth, st.backlog + st.running)
                await asyncio.sleep(0.002)  # the slow handler is the behaviour under test
                handled += 1
                check()

            def on_error(peer: str, msg: Message, code: str, text: str) -> None:
                refusals.append(code)  # no assert here: the node swallows a callback's exceptions
                check()

            alice.on_error(on_error)
            alice.add_peer(bob.agent_id, *bob.addresses)
            for i in range(n):
                await alice.send(bob.agent_id, MessageType.RUN, {"i": i})
            await asyncio.wait_for(done.wait(), 60 if n <= 10_000 else 600)
            busy = len(refusals)
            assert set(refusals) == {"busy"}, f"every refusal is busy, got {sorted(set(refusals))}"
            st = bob.stats()
            assert handled + busy == n
            assert handled > 0 and busy > 0
            assert st.handled == handled
            assert st.refused == {"busy": busy}
            # bounded: never more waiting or running than configured
            assert st.backlog_peak <= BOB.max_backlog
            assert st.running_peak <= BOB.max_handlers
            assert peak_depth <= BOB.max_backlog + BOB.max_handlers
            assert alice.stats().errors_received == {"busy": busy}

    run(main(), timeout=900)


@pytest.mark.slow  # reduced count by default; IAC_SLOW=1 runs the full one
def test_flood_one_way_is_handled_or_refused_busy() -> None:
    _flood_one_way(N)


def test_flood_acknowledged_each_acked_or_busy() -> None:
    """With ACK_REQUESTED the sender waits for its window (max_in_flight) and learns each outcome."""

    async def main() -> None:
        n = 1_000
        cfg = NodeConfig(max_handlers=2, max_backlog=8, sync_in_thread=False)
        async with Node(listen=["tls://127.0.0.1:0"], config=cfg) as bob, Node() as alice:
            bob.on(MessageType.RUN)(_sleepy)
            alice.add_peer(bob.agent_id, *bob.addresses)
            sent = [await alice.send(bob.agent_id, MessageType.RUN, {"i": i}, ack=True) for i in range(n)]
            results = await asyncio.gather(*(s.wait() for s in sent), return_exceptions=True)
            acked = sum(r is None for r in results)
            busy = sum(isinstance(r, RemoteError) and r.code == "busy" for r in results)
            assert acked + busy == n and acked > 0
            assert bob.stats().handled == acked
            assert bob.stats().backlog_peak <= 8 and alice.stats().unacked == 0

    run(main(), timeout=120)


async def _sleepy(ctx: Context) -> None:
    await asyncio.sleep(0.001)


def test_per_peer_quota_is_busy() -> None:
    async def main() -> None:
        cfg = NodeConfig(max_per_peer=2, sync_in_thread=False)
        gate = asyncio.Event()
        async with Node(listen=["tls://127.0.0.1:0"], config=cfg) as bob, Node() as alice:

            @bob.on(MessageType.RUN)
            async def wait(ctx: Context) -> None:
                await gate.wait()

            alice.add_peer(bob.agent_id, *bob.addresses)
            first = [
                asyncio.ensure_future(alice.request(bob.agent_id, MessageType.RUN, timeout=5))
                for _ in range(2)
            ]
            await eventually(lambda: bob.stats().running == 2)
            with pytest.raises(RemoteError) as e:
                await alice.request(bob.agent_id, MessageType.RUN, timeout=5)
            assert e.value.code == "busy"
            gate.set()
            await asyncio.gather(*first)
            assert bob.stats().refused == {"busy": 1}

    run(main())
