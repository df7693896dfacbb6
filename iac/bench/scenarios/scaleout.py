"""One node identity served by one or two processes that share the replay store and the HELLO
nonce cache: requests/s and server CPU per request, 1 -> 2 processes.

    .venv/bin/python -m iac.bench.scenarios.scaleout                 # full run (about 2 minutes)
    .venv/bin/python -m iac.bench.scenarios.scaleout --quick         # smoke test
    .venv/bin/python -m iac.bench.scenarios.scaleout --json out.json # also write every number as JSON

Contenders (:data:`CONTENDERS`), in turns: one server with in-memory stores, one on the shared
SQLite files, two on the same files; each server process listens on a port of its own, with a
client process per server. The method: benchmarks/README.md, "Beyond one process"."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines
from iac.bench.harness import process
from iac.bench.harness.paths import TEST_CORPUS
from iac.bench.harness.results import at_depth, turn_order
from iac.bench.harness.stats import median
from iac.bench.reports import live

IN_FLIGHT = 64
MODULE = "iac.bench.scenarios.scaleout"
CONTENDERS = ("1 process, memory store", "1 process, shared store", "2 processes, shared store")


async def start_server(name: str, workdir: Path) -> baselines.Server:
    """``mem-0`` or ``shared-<i>``: a Node with the identity in ``workdir`` (made by the parent)."""
    from iac.node.config import NodeConfig
    from iac.node.node import Context, Node
    from iac.protocol.replay import ReplayConfig
    from iac.stores.nonces import SqliteNonceCache
    from iac.stores.sqlite import SqliteReplayStore
    from iac.transport.base import TransportConfig
    from iac.wire._pb.iac_pb2 import MessageType
    from iac.wire.identity import Identity

    identity = Identity.from_seed(bytes.fromhex((workdir / "seed").read_text()))
    store = nonces = None
    transport = TransportConfig()
    if name.startswith("shared"):
        store = SqliteReplayStore(workdir / "replay.db", ReplayConfig(), synchronous="NORMAL")
        nonces = SqliteNonceCache(workdir / "nonces.db", max_skew_us=transport.max_skew_us)
        transport = TransportConfig(nonce_cache=nonces)
    node = Node(
        identity,
        listen=["tls://127.0.0.1:0"],
        config=NodeConfig(sync_in_thread=False, transport=transport),
        replay_store=store,
    )

    @node.on(MessageType.RUN)
    def handler(ctx: Context) -> object:
        return baselines.answer(ctx.payload)

    await node.start()
    return baselines.Server({"name": name, "agent_id": node.agent_id, "url": node.addresses[0]}, node.close)


async def client_main(url: str, peer: str, count: int, payload_file: Path) -> None:
    """One client process: warm up, then ``count`` requests at 64 in flight; print JSON."""
    from iac.node.node import Node
    from iac.wire._pb.iac_pb2 import MessageType

    payloads = json.loads(payload_file.read_text())
    async with Node() as node:
        node.add_peer(peer, url)

        def request(i: int) -> Awaitable[object]:
            return node.request(peer, MessageType.RUN, payloads[i % len(payloads)])

        await at_depth(request, 50, 1)
        print("ready", flush=True)
        sys.stdin.readline()  # the parent starts every client at once
        t0 = time.monotonic()
        await at_depth(request, count, IN_FLIGHT)
        print(json.dumps({"start": t0, "end": time.monotonic(), "n": count}), flush=True)


async def run_clients(servers: list[process.Endpoint], count: int, payload_file: Path) -> float:
    """One client process per server, started together; requests/s of all of them."""
    procs = []
    for s in servers:
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "iac.bench.scenarios.scaleout",
            "--client", s.first["url"], s.first["agent_id"], str(count),
            str(payload_file), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        procs.append(p)
    for p in procs:
        assert p.stdout is not None
        if (await asyncio.wait_for(p.stdout.readline(), 60)).strip() != b"ready":
            raise RuntimeError("a client did not start")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        await p.stdin.drain()
    out = []
    for p in procs:
        assert p.stdout is not None
        out.append(json.loads(await asyncio.wait_for(p.stdout.readline(), 300)))
        await p.wait()
    return float(sum(o["n"] for o in out) / (max(o["end"] for o in out) - min(o["start"] for o in out)))


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from iac.bench.harness.calibrate import MIN_SCALING, Calibrator
    from iac.wire.identity import Identity

    workdir = Path(tempfile.mkdtemp(prefix="iacscale-"))
    (workdir / "seed").write_text(Identity.generate().seed().hex())
    lines = [ln for ln in TEST_CORPUS.read_text().splitlines() if ln.strip()]
    payload_file = workdir / "payloads.json"
    payload_file.write_text(json.dumps([json.loads(ln) for ln in lines[:500]]))
    groups = {
        CONTENDERS[0]: ["mem-0"],
        CONTENDERS[1]: ["shared-0"],
        CONTENDERS[2]: ["shared-0", "shared-1"],
    }
    rps: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    cpu: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    scaling: list[float] = []
    calibrator = Calibrator(0.1)
    calibrator.start()
    servers: dict[str, process.Endpoint] = {}
    try:
        for n in ("mem-0", "shared-0", "shared-1"):
            servers[n] = await asyncio.to_thread(process.server_endpoint, MODULE, n, workdir)
        before = calibrator.measure()["scaling"]
        for rep, order in enumerate(turn_order(CONTENDERS, args.reps)):
            for c in order:
                procs = [servers[n] for n in groups[c]]
                c0 = [p.cpu_seconds() or 0.0 for p in procs]
                r = await run_clients(procs, args.count, payload_file)
                c1 = [p.cpu_seconds() or 0.0 for p in procs]
                rps[c].append(r)
                cpu[c].append((sum(c1) - sum(c0)) / (args.count * len(procs)) * 1e6)
            after = calibrator.measure()["scaling"]
            scaling.append(min(before, after))
            before = after
            print(f"  .. repetition {rep + 1}/{args.reps}: scaling {scaling[-1]:.2f}", file=sys.stderr)
    finally:
        closing = (asyncio.to_thread(s.close) for s in servers.values())
        await asyncio.gather(*closing, return_exceptions=True)
        calibrator.close()
        shutil.rmtree(workdir, ignore_errors=True)
    valid = [i for i, s in enumerate(scaling) if s >= MIN_SCALING]
    report: dict[str, Any] = {
        "benchmark": "scaleout",
        "config": {"count_per_client": args.count, "reps": args.reps, "in_flight": IN_FLIGHT},
        "scaling": scaling,
        "valid_reps": valid,
        "contenders": {
            c: {
                "requests_per_s": median(rps[c]),
                "requests_per_s_valid": median([rps[c][i] for i in valid]) if valid else None,
                "server_cpu_us_per_request": median(cpu[c]),
                "per_rep": {"requests_per_s": rps[c], "server_cpu_us_per_request": cpu[c]},
            }
            for c in CONTENDERS
        },
    }
    one, two = report["contenders"][CONTENDERS[1]], report["contenders"][CONTENDERS[2]]
    report["two_over_one"] = two["requests_per_s"] / one["requests_per_s"]
    report["shared_over_memory_cpu"] = (
        one["server_cpu_us_per_request"] / report["contenders"][CONTENDERS[0]]["server_cpu_us_per_request"]
    )
    return report


def cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--count", type=int)
    ap.add_argument("--reps", type=int)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        workdir = Path(args.workdir)
        asyncio.run(baselines.serve(lambda: start_server(args.serve, workdir)))
        return
    if args.client:
        url, peer, count, pf = args.client
        asyncio.run(client_main(url, peer, int(count), Path(pf)))
        return
    args.count = args.count or (200 if args.quick else 2000)
    args.reps = args.reps or (1 if args.quick else 5)
    report = asyncio.run(main(args))
    live.print_rendered(("scaleout",), "iac.bench.scenarios.scaleout", report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    cli()
