"""Round trips with both ends in this process, for profiling the per-request path.

    .venv/bin/python -m iac.bench.scenarios.roundtrip                          # every contender, interleaved
    .venv/bin/python -m iac.bench.scenarios.roundtrip --json out.json          # ... and every number as JSON
    .venv/bin/python -m iac.bench.scenarios.roundtrip tls                      # one: CPU µs per round trip
    .venv/bin/python -m iac.bench.scenarios.roundtrip quic --floor             # the floor contender instead
    .venv/bin/python -m iac.bench.scenarios.roundtrip tls --in-flight 64       # 64 requests in flight
    .venv/bin/python -m iac.bench.scenarios.roundtrip tls --sync-in-thread     # the handler on a thread
    .venv/bin/python -m iac.bench.scenarios.roundtrip tls --profile out.pstats # cProfile the measured part
    valgrind --tool=callgrind .venv/bin/python -m iac.bench.scenarios.roundtrip tls --count 300 --reps 1
    .venv/bin/python -m iac.bench.scenarios.roundtrip --callgrind           # ... and that for TLS and UNIX

A server and a client node (or, ``--floor``, the floor's) on one event loop; it prints the CPU
time per round trip of both ends together. Without a transport, every contender of
:data:`MATRIX` in turns, with cProfile counts per round trip; ``--callgrind`` adds instructions
per round trip (two ``--count``s under valgrind, their difference). benchmarks/README.md, "The
per-request path", says how to read them."""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines
from iac.bench.harness.paths import TEST_CORPUS
from iac.bench.harness.results import at_depth, turn_order
from iac.bench.harness.stats import median
from iac.bench.reports import live

Request = Callable[[int], Awaitable[None]]


def payloads() -> list[Any]:
    lines = [ln for ln in TEST_CORPUS.read_text().splitlines() if ln.strip()]
    return [json.loads(ln) for ln in random.Random(7).sample(lines, 500)]


async def iac_pair(
    transport: str, sync_in_thread: bool, pl: list[Any], sign_in_worker: bool = False
) -> tuple[Request, Any]:
    from iac.node.config import NodeConfig
    from iac.node.node import Context, Node
    from iac.wire._pb.iac_pb2 import MessageType

    d = tempfile.mkdtemp(prefix="iacrt-")
    url = f"unix://{d}/s.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"
    config = NodeConfig(sync_in_thread=sync_in_thread, adaptive_sync=False, sign_in_worker=sign_in_worker)
    server = Node(listen=[url], config=config)

    @server.on(MessageType.RUN)
    def handler(ctx: Context) -> object:
        return baselines.answer(ctx.payload)

    await server.start()
    client = Node(config=NodeConfig(sign_in_worker=sign_in_worker))
    await client.start()
    client.add_peer(server.agent_id, server.addresses[0])
    peer, run = server.agent_id, MessageType.RUN

    async def request(i: int) -> None:
        reply = await client.request(peer, run, pl[i % len(pl)])
        if reply.payload.get("ok") is not True:
            raise RuntimeError(f"bad reply {reply.payload!r}")

    async def close() -> None:
        await client.close()
        await server.close()
        shutil.rmtree(d, ignore_errors=True)

    return request, close


async def floor_pair(transport: str, pl: list[Any]) -> tuple[Request, Any]:
    from iac.bench.contenders import floor

    d = tempfile.mkdtemp(prefix="iacrt-")
    srv = await floor.start_floor(f"floor-{transport}", Path(d))
    client = floor.FloorClient(pl, srv.info)
    await client.start()

    async def close() -> None:
        await client.close()
        await srv.close()
        shutil.rmtree(d, ignore_errors=True)

    return client.request, close


async def main(args: argparse.Namespace) -> None:
    pl = payloads()
    if args.floor:
        request, close = await floor_pair(args.transport, pl)
    else:
        request, close = await iac_pair(args.transport, args.sync_in_thread, pl, args.sign_in_worker)

    try:
        await run_requests(request, 300, args.in_flight)
        prof = cProfile.Profile() if args.profile else None
        cpu: list[float] = []
        rps: list[float] = []
        for _ in range(args.reps):
            if prof is not None:
                prof.enable()
            cpu.append(await run_requests(request, args.count, args.in_flight, rps))
            if prof is not None:
                prof.disable()
        if prof is not None:
            prof.dump_stats(args.profile)
    finally:
        await close()
    what = f"{'floor' if args.floor else 'iac'}-{args.transport}"
    print(f"{what}, {args.in_flight} in flight: CPU µs per round trip (both ends) median "
          f"{median(cpu):.0f} [{min(cpu):.0f} .. {max(cpu):.0f}] of {args.reps} x {args.count}; "
          f"req/s {median(rps):.0f} [{min(rps):.0f} .. {max(rps):.0f}]")  # fmt: skip


#: name, transport, floor, the handler on a thread, signing in batches on the crypto worker.
MATRIX = (
    ("iac-quic", "quic", False, False, False),
    ("floor-quic", "quic", True, False, False),
    ("iac-tls", "tls", False, False, False),
    ("floor-tls", "tls", True, False, False),
    ("iac-unix", "unix", False, False, False),
    ("floor-unix", "unix", True, False, False),
    ("iac-tls-thread", "tls", False, True, False),
    ("iac-tls-signw", "tls", False, False, True),
)


async def run_requests(request: Request, n: int, in_flight: int, walls: list[float] | None = None) -> float:
    """``n`` requests, ``in_flight`` at a time; CPU µs per round trip (and requests/s to ``walls``)."""
    c0, w0 = time.process_time(), time.perf_counter()
    await at_depth(request, n, in_flight)
    if walls is not None:
        walls.append(n / (time.perf_counter() - w0))
    return (time.process_time() - c0) / n * 1e6


async def counts(request: Request, n: int) -> dict[str, float]:
    """Per round trip at 1 in flight: loop turns, Python calls, QUIC flushes (cProfile)."""
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        await request(i)
    prof.disable()
    st = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    turns = sum(v[1] for k, v in st.items() if k[2] == "_run_once")
    # a flush is one build of the library's datagrams (IAC's QUIC protocol writes its transmit out)
    flushes = sum(v[1] for k, v in st.items() if k[2] == "datagrams_to_send" and "aioquic" in k[0])
    calls = sum(v[1] for v in st.values())
    return {"loop_turns": turns / n, "python_calls": calls / n, "quic_transmits": flushes / n}


#: Contenders whose instructions per round trip are counted (``--callgrind``). QUIC's are not
#: repeatable: aioquic's ACK delay expires at other points under valgrind's slowdown.
CALLGRIND = (("iac-tls", "tls", False), ("floor-tls", "tls", True), ("iac-unix", "unix", False),
             ("floor-unix", "unix", True))  # fmt: skip
CALLGRIND_COUNTS = (100, 300)
#: The ratios of medians the report shows: its name -> the figure's.
RATIOS = {"cpu_1": "cpu_us_1", "cpu_64": "cpu_us_64", "rps_64": "rps_64"}


def instructions(transport: str, floor: bool) -> float:
    """Instructions per round trip at 1 in flight: this script run under callgrind with two
    ``--count``s; the difference of the totals over the difference of the counts (start-up and
    warm-up cancel)."""
    totals = []
    for n in CALLGRIND_COUNTS:
        with tempfile.TemporaryDirectory(prefix="iacrt-cg-") as d:
            out = Path(d) / "callgrind.out"
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    sys.executable, "-m", "iac.bench.scenarios.roundtrip",
                    transport, "--count", str(n), "--reps", "1", *(["--floor"] if floor else [])]  # fmt: skip
            subprocess.run(argv, check=True, capture_output=True)
            totals.append(callgrind_total(out.read_text()))
    return (totals[1] - totals[0]) / (CALLGRIND_COUNTS[1] - CALLGRIND_COUNTS[0])


def callgrind_total(text: str) -> int:
    """The instruction total of a callgrind output file."""
    for line in text.splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError("no summary line in the callgrind output")


async def matrix(args: argparse.Namespace) -> dict[str, Any]:
    pl = payloads()
    pairs: dict[str, tuple[Request, Any]] = {}
    out: dict[str, Any] = {}
    try:
        for name, transport, is_floor, thread, signw in MATRIX:
            pairs[name] = await (
                floor_pair(transport, pl) if is_floor else iac_pair(transport, thread, pl, signw)
            )
            await run_requests(pairs[name][0], 300, 1)
            found = await counts(pairs[name][0], args.count)
            out[name] = {"cpu_us_1": [], "cpu_us_64": [], "rps_64": [], **found}
        for rep, order in enumerate(turn_order([m[0] for m in MATRIX], args.reps)):
            for name in order:
                request = pairs[name][0]
                out[name]["cpu_us_1"].append(await run_requests(request, args.count, 1))
                out[name]["cpu_us_64"].append(
                    await run_requests(request, 2 * args.count, 64, out[name]["rps_64"])
                )
            print(f"  .. repetition {rep + 1}/{args.reps}", file=sys.stderr, flush=True)
    finally:
        for _, close in pairs.values():
            await close()
    for v in out.values():
        v.update({f"{k}_median": median(v[k]) for k in RATIOS.values()})
    ratios = {}
    versus = [(f"iac-{t}", f"floor-{t}") for t in ("quic", "tls", "unix")]
    for a, b in (*versus, ("iac-tls-thread", "iac-tls"), ("iac-tls-signw", "iac-tls")):
        keys = RATIOS if a == "iac-tls-signw" else ("cpu_1", "cpu_64")  # requests/s: signing only
        ratios[f"{a} / {b}"] = {
            k: out[a][f"{RATIOS[k]}_median"] / out[b][f"{RATIOS[k]}_median"] for k in keys
        }
    counted: dict[str, float] = {}
    if args.callgrind:
        for name, transport, is_floor in CALLGRIND:
            print(f"  .. callgrind: {name}", file=sys.stderr, flush=True)
            counted[name] = instructions(transport, is_floor)
    return {
        "benchmark": "roundtrip",
        "config": {
            "count": args.count,
            "reps": args.reps,
            "in_flight": [1, 64],
            "callgrind_counts": list(CALLGRIND_COUNTS) if counted else None,
        },
        "contenders": out,
        "ratios": ratios,
        "instructions": counted,
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("transport", nargs="?", choices=("quic", "tls", "unix"), help="one contender only")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--json", type=Path, help="(every contender) write every number as JSON here")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--in-flight", type=int, default=1)
    ap.add_argument("--floor", action="store_true", help="contenders/floor.py's contender instead of IAC")
    ap.add_argument("--sync-in-thread", action="store_true", help="the server's handler on a thread")
    ap.add_argument("--sign-in-worker", action="store_true", help="both nodes sign on the worker")
    ap.add_argument("--profile", help="write cProfile stats of the measured requests here")
    ap.add_argument("--callgrind", action="store_true", help="(every contender) also count instructions")
    args = ap.parse_args()
    if args.transport is None:
        report = asyncio.run(matrix(args))
        live.print_rendered(("roundtrip",), "iac.bench.scenarios.roundtrip", report)
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")
        return
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
