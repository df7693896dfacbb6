#!/usr/bin/env python3
"""Node benchmark: ``node.request`` round trips over QUIC, TLS/TCP and UNIX sockets.

    .venv/bin/python benchmarks/node.py             # 2000 sequential + 10000 at 64 in flight
    .venv/bin/python benchmarks/node.py --quick     # 200 + 1000 (smoke test)
    .venv/bin/python benchmarks/node.py --json out.json

Per transport, two nodes in one process on loopback (one event loop, so both sides'
CPU counts against one core):

* RTT p50/p99: sequential ``request`` calls (one in flight).
* requests/s: ``request`` calls with 64 in flight.
* bytes/request: frame bytes both ways (``stats().bytes_sent`` of both nodes; the
  REPLY included; transport headers — TLS records, QUIC packets, TCP/IP — not
  included).

The payload is a small agent-style JSON object. The HTTP and gRPC baselines the issue
asks for are not in this file yet (aiohttp is not a dependency of the project).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from iac._node import Context, Node
from iac._node_config import NodeConfig
from iac._pb.iac_pb2 import MessageType

PAYLOAD = {"task": "summarize", "args": {"doc": "q3-report.pdf", "max_words": 120}, "priority": 2}


async def bench(transport: str, sequential: int, concurrent: int, in_flight: int) -> dict[str, Any]:
    d = tempfile.mkdtemp(prefix="iacb-")
    url = f"unix://{d}/s/b.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"
    cfg = NodeConfig(sync_in_thread=False, max_in_flight=in_flight, max_handlers=in_flight)
    try:
        async with Node(listen=[url], config=cfg) as bob, Node(config=cfg) as alice:

            @bob.on(MessageType.RUN)
            def handler(ctx: Context) -> object:
                return {"ok": True, "words": 118}

            alice.add_peer(bob.agent_id, *bob.addresses)
            for _ in range(50):  # warm up: connection, dictionaries, caches
                await alice.request(bob.agent_id, MessageType.RUN, PAYLOAD, timeout=10)
            b0 = alice.stats().bytes_sent + bob.stats().bytes_sent
            rtts: list[float] = []
            for _ in range(sequential):
                t = time.perf_counter()
                await alice.request(bob.agent_id, MessageType.RUN, PAYLOAD, timeout=10)
                rtts.append(time.perf_counter() - t)
            b1 = alice.stats().bytes_sent + bob.stats().bytes_sent
            sem = asyncio.Semaphore(in_flight)

            async def one() -> None:
                async with sem:
                    await alice.request(bob.agent_id, MessageType.RUN, PAYLOAD, timeout=30)

            t = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(concurrent)))
            elapsed = time.perf_counter() - t
            rtts.sort()
            return {
                "transport": transport,
                "rtt_p50_us": round(statistics.median(rtts) * 1e6, 1),
                "rtt_p99_us": round(rtts[int(0.99 * (len(rtts) - 1))] * 1e6, 1),
                "requests_per_s_at_64": round(concurrent / elapsed),
                "bytes_per_request": round((b1 - b0) / sequential, 1),
            }
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    seq, conc = (200, 1000) if args.quick else (2000, 10000)
    results = [asyncio.run(bench(t, seq, conc, 64)) for t in ("unix", "tls", "quic")]
    print(f"{'transport':<10} {'p50 µs':>9} {'p99 µs':>9} {'req/s @64':>10} {'bytes/req':>10}")
    for r in results:
        print(
            f"{r['transport']:<10} {r['rtt_p50_us']:>9} {r['rtt_p99_us']:>9} "
            f"{r['requests_per_s_at_64']:>10} {r['bytes_per_request']:>10}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
