"""Broadcast across node processes: every node's handler gets every broadcast exactly once.

Each node is its own ``python tests/broadcast_node.py`` process on a UNIX socket,
driven over stdin/stdout with JSON lines. The graph is a ring or a seeded random
connected graph. By default 8 processes and 20 broadcasts; IAC_SLOW=1 runs 20
processes and 100 broadcasts.

No sleeps: the test waits for the processes' own reports — every expected
delivery seen, then every Forward sent also received and judged somewhere (the
stats round trip is repeated until the sums agree) — then asks each process for
its final per-broadcast counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import run

SLOW = os.environ.get("IAC_SLOW") == "1"
N_NODES, N_BROADCASTS = (20, 100) if SLOW else (8, 20)
SCRIPT = Path(__file__).resolve().parent / "broadcast_node.py"
ROOT = SCRIPT.parent.parent


def ring(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)]


def random_connected(n: int, seed: int) -> list[tuple[int, int]]:
    """A random spanning tree plus n // 2 extra edges (so there are cycles and duplicate copies)."""
    rng = random.Random(seed)
    edges = {(rng.randrange(i), i) for i in range(1, n)}
    while len(edges) < n - 1 + n // 2:
        i, j = sorted(rng.sample(range(n), 2))
        edges.add((i, j))
    return sorted(edges)


class Proc:
    """One node process: its id and address, 'got' reports counted, other replies queued."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.got: Counter[tuple[str, int]] = Counter()
        self.progress: asyncio.Event | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            obj = json.loads(line)
            if "got" in obj:
                self.got[(obj["from"], obj["got"])] += 1
                if self.progress is not None:
                    self.progress.set()
            else:
                await self.replies.put(obj)

    async def ask(self, cmd: dict[str, Any], reply: bool = True) -> dict[str, Any] | None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        await self.proc.stdin.drain()
        return await asyncio.wait_for(self.replies.get(), 30) if reply else None


async def run_mesh(edges: list[tuple[int, int]], n: int, n_broadcasts: int, seed: int) -> None:
    d = tempfile.mkdtemp(prefix="iacb-")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs: list[Proc] = []
    try:
        for i in range(n):
            p = await asyncio.create_subprocess_exec(
                sys.executable, str(SCRIPT), f"{d}/{i}.sock",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            )  # fmt: skip
            procs.append(Proc(p))
        hello = [await asyncio.wait_for(p.replies.get(), 30) for p in procs]
        ids = [h["id"] for h in hello]
        degree = Counter[int]()
        for i, j in edges:
            degree[i] += 1
            degree[j] += 1
        # Node i dials its higher-numbered neighbours; each connection serves both directions.
        ready = await asyncio.gather(
            *(
                p.ask(
                    {
                        "cmd": "peers",
                        "degree": degree[i],
                        "dial": [[ids[j], hello[j]["addr"]] for a, j in edges if a == i],
                    }
                )
                for i, p in enumerate(procs)
            )
        )
        assert all(r == {"ready": True} for r in ready)

        rng = random.Random(seed)
        origins = [rng.randrange(n) for _ in range(n_broadcasts)]
        progress = asyncio.Event()
        for p in procs:
            p.progress = progress
        for k, o in enumerate(origins):
            await procs[o].ask({"cmd": "bcast", "k": k}, reply=False)
        expected_total = n_broadcasts * (n - 1)
        async with asyncio.timeout(60):
            while sum(sum(p.got.values()) for p in procs) < expected_total:
                await progress.wait()
                progress.clear()
            while True:  # quiescence: every Forward sent was received and judged
                stats = [r["stats"] for r in await asyncio.gather(*(p.ask({"cmd": "stats"}) for p in procs))]
                sent = sum(s["routing"]["forwarded"] for s in stats)
                judged = sum(
                    s["routing"]["delivered"] + s["routing"]["duplicates"] + sum(s["route_refused"].values())
                    for s in stats
                )
                if sent == judged:
                    break
        assert all(s["route_refused"] == {} for s in stats)
        finals = await asyncio.gather(*(p.ask({"cmd": "quit"}) for p in procs))
        for i, (p, final) in enumerate(zip(procs, finals, strict=True)):
            assert final is not None
            expected = {f"{ids[o]} {k}": 1 for k, o in enumerate(origins) if o != i}
            assert final["counts"] == expected, f"node {i}"
            assert {f"{a} {k}": v for (a, k), v in p.got.items()} == expected
        for p in procs:
            assert await asyncio.wait_for(p.proc.wait(), 30) == 0
    finally:
        for p in procs:
            if p.proc.returncode is None:
                p.proc.kill()
                await p.proc.wait()
            p.reader.cancel()
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow  # 8 processes and 20 broadcasts by default; IAC_SLOW=1 runs 20 and 100
@pytest.mark.parametrize("topology", ["ring", "random"])
def test_broadcast_across_processes_exactly_once(topology: str) -> None:
    edges = ring(N_NODES) if topology == "ring" else random_connected(N_NODES, seed=1234)
    run(run_mesh(edges, N_NODES, N_BROADCASTS, seed=99), timeout=120)
