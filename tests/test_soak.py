"""Churn: peers with new identities connect, send, vanish. What a node keeps per peer is bounded and
expires once they are gone, so its memory stays flat.

By default 40 peers churn, then the node's clock moves past the retention (2 × max_skew) and every
per-peer table must be back to where it started. With IAC_SLOW=1 the churn goes on for 10 minutes
and the node's resident memory, sampled as it goes, must stay flat."""

from __future__ import annotations

import asyncio
import os
import resource
import time

import pytest
from conftest import run

from iac import Node, NodeConfig
from iac.testing import eventually

SLOW = os.environ.get("IAC_SLOW") == "1"
#: Tables that must empty once every peer is gone (the answer cache is an LRU of fixed size).
PER_PEER = ("sessions", "verify_budgets", "in_flight", "dial_locks", "ordered_streams", "routes")


class FastForward:
    """The system clock, wall and monotonic alike, moved ahead by ``ahead_s`` (time passing at
    once: a node ignores a wall clock that jumps without the monotonic one)."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def now_us(self) -> int:
        return time.time_ns() // 1000 + int(self.ahead_s * 1_000_000)

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead_s


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / (1 << 20)


async def churn_once(server: Node, i: int) -> None:
    async with Node(config=NodeConfig(retransmit_initial=0.05)) as peer:
        peer.on("RUN")(lambda ctx: ctx.payload["i"])
        peer.add_peer(server.agent_id, *server.addresses)
        assert (await peer.request(server.agent_id, "RUN", {"i": i}, timeout=10)).payload == i
        await (await peer.send(server.agent_id, "RUN", {"i": i}, ack=True, ordered=True)).wait()
        # the server answers this peer too: a session of its own toward it
        assert (await server.request(peer.agent_id, "RUN", {"i": i}, timeout=10)).payload == i


@pytest.mark.slow
def test_state_of_peers_that_went_away_expires() -> None:
    async def main() -> None:
        clock = FastForward()
        async with Node(listen="tls://127.0.0.1:0", clock=clock) as server:
            server.on("RUN")(lambda ctx: ctx.payload["i"])
            before = dict(server.stats().peer_state)
            rss: list[float] = []
            start, i = time.monotonic(), 0
            while i < 40 or (SLOW and time.monotonic() - start < 600):
                await asyncio.gather(*(churn_once(server, i + k) for k in range(4)))
                i += 4
                if i % 200 == 0:
                    rss.append(rss_mib())
            await eventually(lambda: server.stats().connections == 0)
            during = server.stats().peer_state
            assert during["sessions"] > 0 and during["ordered_streams"] > 0  # the churn left state
            clock.ahead_s += 2 * server.config.transport.max_skew_us / 1e6 + 2  # past retention
            await eventually(
                lambda: all(server.stats().peer_state[t] <= before[t] for t in PER_PEER),
                message=lambda: f"still kept: {server.stats().peer_state}",
            )
            if SLOW:  # memory flat: the last samples within 10% (and 20 MiB) of the first after warm-up
                base = rss[len(rss) // 4]
                assert max(rss[len(rss) // 4 :]) <= max(base * 1.1, base + 20), rss

    run(main(), timeout=900 if SLOW else 120)
