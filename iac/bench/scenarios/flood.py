"""An honest peer's latency while another peer floods the node with valid messages.

    .venv/bin/python -m iac.bench.scenarios.flood [--quick] [--json FILE]
    .venv/bin/python -m iac.bench.harness.record flood          # a full run kept in benchmarks/results/

Three processes on loopback: the node (``flood.py serve``), the flooder (``flood.py flood``,
messages signed ahead, at a fixed rate) and the honest peer in this one. The figure is the
median over repetitions of p50 during ÷ p50 without (target :data:`TARGET`), for the two
:data:`CASES`; benchmarks/README.md, "Sharing the node under a flood"."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import child_env as env_for
from iac.bench.harness.process import Endpoint, say
from iac.bench.harness.stats import median
from iac.bench.reports import live
from iac.node.node import Node
from iac.transport.endpoints import dial
from iac.wire.enums import MessageType
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, encode_message_frame

TARGET = 1.5

MODULE = "iac.bench.scenarios.flood"


async def serve(handler_ms: float) -> int:
    async with Node(listen=["tls://127.0.0.1:0"]) as node:
        if handler_ms:
            node.on(MessageType.RUN)(lambda ctx: time.sleep(handler_ms / 1e3))  # a plain function: a thread
        else:
            node.on(MessageType.RUN)(lambda ctx: None)
        say({"ready": True, "agent_id": node.agent_id, "url": node.addresses[0]})
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if json.loads(line).get("cmd") == "stats":
                s = node.stats()
                say({"handled": s.handled, "refused": dict(s.refused), "throttled": s.throttled})
    return 0


async def flood(target: dict[str, str], rate: float, seconds: float) -> int:
    me = Identity.generate()
    session = Session()
    frames = [
        encode_message_frame(
            me,
            build_message(
                sender=me.agent_id, to=target["agent_id"], msg_type=MessageType.RUN, session=session,
                timestamp_us=time.time_ns() // 1000, payload_json='{"n":1}',
            ),
        )
        for _ in range(int(rate * seconds))
    ]  # fmt: skip
    conn = await dial(target["url"], me, expect=target["agent_id"])
    say({"ready": True})
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # go
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    sent = 0
    while sent < len(frames):
        due = min(len(frames), int((loop.time() - t0) * rate) + 1)
        while sent < due:
            await conn.send(frames[sent])
            sent += 1
        await asyncio.sleep(0.001)
    say({"sent": sent, "elapsed_s": loop.time() - t0})
    await conn.close()
    return 0


def _endpoint(*args: str) -> Endpoint:
    """This script in a child process, as ``loss.py``'s endpoints are driven (JSON lines); started
    off the loop (the flooder signs its messages before it says it is ready)."""
    return Endpoint([sys.executable, "-m", "iac.bench.scenarios.flood", *args], env_for(), timeout=120)


async def _p50(client: Node, peer: str, seconds: float) -> tuple[float, int]:
    """Sequential requests for ``seconds``: their p50 (µs) and how many."""
    lat: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        await client.request(peer, MessageType.RUN, {"honest": True}, timeout=10)
        lat.append((time.perf_counter() - t) * 1e6)
    return float(median(lat)), len(lat)


async def measure(reps: int, rate: float, seconds: float, handler_ms: float) -> dict[str, Any]:
    server = await asyncio.to_thread(_endpoint, "serve", "--handler-ms", str(handler_ms))
    try:
        target = server.first
        async with Node() as client:
            client.add_peer(target["agent_id"], target["url"])
            await _p50(client, target["agent_id"], 0.5)  # warm up
            rows = []
            for _ in range(reps):
                quiet, n_quiet = await _p50(client, target["agent_id"], seconds)
                args = ("--target", json.dumps(target), "--rate", str(rate), "--seconds", str(seconds))
                flooder = await asyncio.to_thread(_endpoint, "flood", *args)
                try:
                    flooding = asyncio.ensure_future(asyncio.to_thread(flooder.ask, {"cmd": "go"}, 60))
                    loaded, n_loaded = await _p50(client, target["agent_id"], seconds * 0.8)
                    sent = await flooding
                finally:
                    flooder.close()
                rows.append({"p50_quiet_us": quiet, "p50_flood_us": loaded, "ratio": loaded / quiet,
                             "requests": [n_quiet, n_loaded], "flood_sent": sent["sent"],
                             "flood_rate": sent["sent"] / sent["elapsed_s"]})  # fmt: skip
            stats = await asyncio.to_thread(server.ask, {"cmd": "stats"}, 30)
    finally:
        server.close()
    ratios = [r["ratio"] for r in rows]
    return {
        "rate": rate,
        "handler_ms": handler_ms,
        "seconds": seconds,
        "reps": rows,
        "ratio_median": float(median(ratios)),
        "target": TARGET,
        "server": stats,
    }


#: The two cases: handlers that return at once (the event loop is the limit), and handlers that
#: block for 2 ms on the node's worker threads (the threads are the limit).
CASES = ({"rate": 10_000.0, "handler_ms": 0.0}, {"rate": 4_000.0, "handler_ms": 2.0})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="role")
    sv = sub.add_parser("serve", help="(internal) the node")
    sv.add_argument("--handler-ms", type=float, default=0.0)
    f = sub.add_parser("flood", help="(internal) the flooding peer")
    f.add_argument("--target", required=True)
    f.add_argument("--rate", type=float, required=True)
    f.add_argument("--seconds", type=float, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.role == "serve":
        return asyncio.run(serve(args.handler_ms))
    if args.role == "flood":
        return asyncio.run(flood(json.loads(args.target), args.rate, args.seconds))
    reps, seconds = (2, 1.0) if args.quick else (5, 3.0)
    cases = [asyncio.run(measure(reps, c["rate"], seconds, c["handler_ms"])) for c in CASES]
    data = {"target": TARGET, "cases": cases}
    live.print_rendered(("flood",), MODULE, data)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
