"""Node benchmark: IAC ``node.request`` over QUIC, TLS/TCP and UNIX next to its floor, HTTP and gRPC.

    .venv/bin/python -m iac.bench.scenarios.node                    # full run (~5 minutes)
    .venv/bin/python -m iac.bench.scenarios.node --quick            # smoke test (well under a minute)
    .venv/bin/python -m iac.bench.scenarios.node --json out.json    # also write every number as JSON
    .venv/bin/python -m iac.bench.scenarios.node --only iac-tls,floor-tls,http-ed25519 --reps 5 --count 300
    .venv/bin/python -m iac.bench.scenarios.node --loop asyncio     # leave out the uvloop contenders
    .venv/bin/python -m iac.bench.scenarios.node --profile iac-tls  # cProfile the IAC-TLS server process

Every server in its own process, every client in this one; the contenders (IAC, floors, their
uvloop lanes, the baselines), the method per repetition and the targets are in
benchmarks/README.md, "Node". Targets, verdicts and the JSON: :mod:`nodereport`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines
from iac.bench.contenders.baselines import Client
from iac.bench.contenders.iacnode import IAC, IacClient, start_iac, transport_of
from iac.bench.harness import counting, process
from iac.bench.harness.counting import CountingProxy
from iac.bench.harness.paths import TEST_CORPUS
from iac.bench.harness.process import Endpoint
from iac.bench.harness.results import at_depth
from iac.bench.harness.stats import median, percentile
from iac.testing import lanes
from iac.testing.lanes import Lane, base_name, loop_kind

TEST = TEST_CORPUS
if importlib.util.find_spec("qh3"):
    IAC = ("iac-quic", "iac-quic-qh3", "iac-tls", "iac-unix")  # type: ignore[assignment]  # the accelerated QUIC backend
FLOORS = ("floor-quic", "floor-tls", "floor-unix")
TRANSPORTS = ("quic", "tls", "unix")
IN_FLIGHT = 64
SEED = 7


def is_iac(name: str) -> bool:
    return base_name(name) in IAC


def is_floor(name: str) -> bool:
    return base_name(name) in FLOORS


def floor_of(name: str) -> str:
    """The floor an IAC contender is held to: same transport, same loop (qh3: the aioquic floor)."""
    return f"floor-{transport_of(name)}" + name[len(base_name(name)) :]


def role(name: str) -> dict[str, Any]:
    """What the report needs to know of a contender."""
    kind = "iac" if is_iac(name) else "floor" if is_floor(name) else "baseline"
    out = {"role": kind, "base": base_name(name), "loop": loop_kind(name)}
    if kind == "iac":
        out["floor"] = floor_of(name)
    return out


def contenders(loops: tuple[str, ...]) -> tuple[str, ...]:
    """IAC and floor contenders on ``loops``, by transport, then the baselines."""
    out = []
    for t in TRANSPORTS:
        for base in (*(b for b in IAC if transport_of(b) == t), f"floor-{t}"):
            out += [base if k == "asyncio" else base + lanes.UVLOOP_SUFFIX for k in loops]
    return (*out, *baselines.BASELINES)


CONTENDERS = contenders(lanes.LOOPS)


@dataclass(frozen=True)
class Plan:
    """The full run's counts (:data:`FULL`); :data:`QUICK` the smoke test's."""

    count: int = 500  # sequential requests per repetition (4x at 64 in flight, 4x one-way)
    reps: int = 7
    warm_seq: int = 50
    warm_conc: int = 4 * IN_FLIGHT
    bytes_requests: int = 200
    bytes_warmup: int = 20
    settle_s: float = 0.05  # the pause before a byte count is read
    calibration_s: float = 0.1  # the calibration loop alone

    @property
    def concurrent(self) -> int:
        return 4 * self.count


FULL = Plan()
QUICK = Plan(
    count=40,
    reps=3,
    warm_seq=10,
    warm_conc=IN_FLIGHT,
    bytes_requests=20,
    bytes_warmup=5,
    settle_s=0.01,
    calibration_s=0.05,
)


def make_client(payloads: list[Any], info: dict[str, Any], via: tuple[Any, ...] | None = None) -> Client:
    name = info["name"]
    if is_iac(name):
        url = None
        if via is not None:
            url = f"unix://{via[1]}" if via[0] == "unix" else f"{transport_of(name)}://{via[1]}:{via[2]}"
        return IacClient(payloads, info, url=url)
    if is_floor(name):
        from iac.bench.contenders.floor import FloorClient

        return FloorClient(payloads, info, via=via)
    return baselines.baseline_client(payloads, info, via=via)


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Result:
    """One figure per repetition of each measure."""

    name: str
    p50_us: list[float] = field(default_factory=list)
    p99_us: list[float] = field(default_factory=list)
    rps: list[float] = field(default_factory=list)
    server_cpu_us: list[float] = field(default_factory=list)
    client_cpu_us: list[float] = field(default_factory=list)
    echo_rps: list[float] = field(default_factory=list)
    echo_server_cpu_us: list[float] = field(default_factory=list)
    echo_client_cpu_us: list[float] = field(default_factory=list)
    oneway_rate: list[float] = field(default_factory=list)
    primitives_us: list[float] = field(default_factory=list)  # in sequence, before a floor's phase
    wire: dict[str, float] = field(default_factory=dict)


Request = Callable[[int], Awaitable[None]]


async def sequential(request: Request, n: int) -> list[float]:
    rtts = []
    clock = time.perf_counter
    for i in range(n):
        t = clock()
        await request(i)
        rtts.append(clock() - t)
    return rtts


async def cpu_phase(request: Request, proc: Endpoint, n: int) -> tuple[float, float | None, float]:
    """``n`` requests at 64 in flight: requests/s, server and client CPU µs per request."""
    gc.collect()
    s0, c0 = proc.cpu_seconds(), time.process_time()
    elapsed = await at_depth(request, n, IN_FLIGHT)
    s1, c1 = proc.cpu_seconds(), time.process_time()
    server_us = None if s0 is None or s1 is None else (s1 - s0) / n * 1e6
    return n / elapsed, server_us, (c1 - c0) / n * 1e6


async def warm_up(client: Any, plan: Plan) -> None:
    await sequential(client.request, plan.warm_seq)
    await at_depth(client.request, plan.warm_conc, IN_FLIGHT)
    if is_floor(client.name):
        await at_depth(client.echo, plan.warm_conc, IN_FLIGHT)
    if isinstance(client, IacClient):
        await client.oneway(await client.prepare_oneway(plan.warm_conc))


async def measure_rep(client: Any, proc: Endpoint, plan: Plan, result: Result, prims: Any) -> None:
    gc.collect()
    rtts = await sequential(client.request, plan.count)
    result.p50_us.append(median(rtts) * 1e6)
    result.p99_us.append(percentile(rtts, 99) * 1e6)
    if is_floor(client.name):  # what the floor's codec work costs on this machine just now
        result.primitives_us.append(prims.in_sequence()["sum"])
    phases = [(client.request, result.rps, result.server_cpu_us, result.client_cpu_us)]
    if is_floor(client.name):  # and the transport alone
        phases.append((client.echo, result.echo_rps, result.echo_server_cpu_us, result.echo_client_cpu_us))
    for request, rps, server_cpu, client_cpu in phases:
        r, server_us, client_us = await cpu_phase(request, proc, plan.concurrent)
        rps.append(r)
        if server_us is not None:
            server_cpu.append(server_us)
        client_cpu.append(client_us)
    if isinstance(client, IacClient):
        frames = await client.prepare_oneway(plan.concurrent)
        gc.collect()
        result.oneway_rate.append(await client.oneway(frames))


async def measure_wire(
    name: str, info: dict[str, Any], payloads: list[Any], workdir: Path, plan: Plan
) -> dict[str, float]:
    """Bytes at the socket per request, through a counting relay (see the module docstring)."""
    listen_path = str(workdir / f"proxy-{name}.sock")
    if is_iac(name):
        relay, via = await counting.relay_for(info["url"], listen_path)
    elif is_floor(name) and transport_of(name) == "quic":
        relay, via = await counting.relay_for(f"quic://{info['host']}:{info['port']}", listen_path)
    else:
        relay = CountingProxy(baselines.server_target(info), listen_path=listen_path)
        via = await relay.start()
    client = make_client(payloads, info, via)
    try:
        await client.start()
        await client.request(0)
        setup = relay.total
        n = min(plan.count, plan.bytes_requests)
        for i in range(plan.bytes_warmup):
            await client.request(i)
        await asyncio.sleep(plan.settle_s)  # let trailing ACKs / window updates land before the snapshot
        up0, down0 = relay.up, relay.down
        f0 = client.frame_bytes() if isinstance(client, IacClient) else 0
        await sequential(client.request, n)
        await asyncio.sleep(plan.settle_s)
        up, down = (relay.up - up0) / n, (relay.down - down0) / n
        out = {"up": round(up, 1), "down": round(down, 1), "per_request": round(up + down, 1), "setup": setup}
        if isinstance(client, IacClient):
            out["iac_frame_bytes"] = round((client.frame_bytes() - f0) / n, 1)
        return out
    finally:
        await client.close()
        await relay.close()


# --- the run ----------------------------------------------------------------------------------


def load_payloads(count: int) -> list[Any]:
    lines = [line for line in TEST.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(SEED)
    return [json.loads(line) for line in rng.sample(lines, min(count, len(lines)))]


@dataclass
class Run:
    """What a run measured besides the contenders."""

    calibrations: list[dict[str, Any]] = field(default_factory=list)
    primitives: list[dict[str, Any]] = field(default_factory=list)
    decode_rates: list[float] = field(default_factory=list)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from iac.bench.harness.calibrate import Calibrator
    from iac.bench.reports import nodereport
    from iac.bench.scenarios.primitives import Primitives

    names, plan = args.only, args.plan
    payloads = load_payloads(plan.count)
    workdir = Path(tempfile.mkdtemp(prefix="iacbench-"))
    profile_file = str(workdir / "server.pstats") if args.profile else None
    lane_by_kind = {k: Lane(k) for k in sorted({loop_kind(n) for n in names} | {"asyncio"})}

    def lane(name: str) -> Lane:
        return lane_by_kind[loop_kind(name)]

    servers: dict[str, Endpoint] = {}
    clients: dict[str, Client] = {}
    results = {name: Result(name) for name in names}
    extra = Run()
    calibrator = Calibrator(plan.calibration_s)
    prims = Primitives(payloads)
    try:
        calibrating = asyncio.get_running_loop().run_in_executor(None, calibrator.start)

        def start(n: str) -> None:  # in threads, at once; each is closed below once it started
            profile = profile_file if n == args.profile else None
            servers[n] = process.server_endpoint("iac.bench.scenarios.node", n, workdir, profile)

        await asyncio.gather(*(asyncio.to_thread(start, n) for n in names))
        say(args, f"{len(servers)} servers started")
        for name in names:
            clients[name] = make_client(payloads, servers[name].first)
            await lane(name).run(clients[name].start())
        say(args, f"clients connected; warm-up: {len(names)} contenders")
        for name in names:
            await lane(name).run(warm_up(clients[name], plan))
        await calibrating
        extra.calibrations.append(calibrator.measure())
        for rep in range(plan.reps):
            order = names if rep % 2 == 0 else names[::-1]
            extra.primitives.append(prims.measure())
            extra.decode_rates.append(median([prims.decode_rate() for _ in range(3)]))
            say(args, f"repetition {rep + 1}/{plan.reps}: scaling {extra.calibrations[-1]['scaling']:.2f}")
            for name in order:
                await lane(name).run(measure_rep(clients[name], servers[name], plan, results[name], prims))
            extra.calibrations.append(calibrator.measure())
        for name in names:
            await lane(name).run(clients.pop(name).close())
        say(args, "bytes on the wire")
        for name in names:
            results[name].wire = await lane(name).run(
                measure_wire(name, servers[name].first, payloads, workdir, plan)
            )
    finally:
        for name, c in clients.items():
            with contextlib.suppress(Exception):
                await lane(name).run(c.close())
        closing = (asyncio.to_thread(s.close) for s in servers.values())
        await asyncio.gather(*closing, return_exceptions=True)
        for ln in lane_by_kind.values():
            ln.close()
        calibrator.close()
    report = nodereport.build_report(args, plan, results, extra, {n: role(n) for n in names}, len(payloads))
    if profile_file:
        report["profile"] = nodereport.profile_summary(profile_file, args.profile)
    shutil.rmtree(workdir, ignore_errors=True)
    return report


_T0 = time.monotonic()


def say(args: argparse.Namespace, text: str) -> None:
    if not args.json_only:
        print(f"  .. {time.monotonic() - _T0:5.1f} s  {text}", file=sys.stderr, flush=True)


# --- entry points -----------------------------------------------------------------------------


def serve_main(args: argparse.Namespace) -> None:
    name = args.serve
    workdir = Path(args.workdir)
    start: Callable[[], Any]
    if is_iac(name):
        start = lambda: start_iac(name, workdir)  # noqa: E731
    elif is_floor(name):
        from iac.bench.contenders.floor import start_floor

        start = lambda: start_floor(name, workdir)  # noqa: E731
    else:
        start = lambda: baselines.start_baseline(name, workdir)  # noqa: E731
    lanes.run(lambda: baselines.serve(start, profile=args.profile_out), loop_kind(name))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke test: --count 40 --reps 3, short warm-up")
    ap.add_argument("--json", type=Path, help="write every number as JSON here")
    ap.add_argument("--json-only", action="store_true", help="print nothing (with --json)")
    ap.add_argument("--only", help=f"comma-separated contenders (of {', '.join(CONTENDERS)})")
    ap.add_argument("--count", type=int, help="sequential requests per repetition (4x at 64 in flight)")
    ap.add_argument("--reps", type=int, help="repetitions")
    ap.add_argument(
        "--loop",
        choices=("asyncio", "uvloop", "both"),
        help="the IAC and floor contenders' event loop (default: both when uvloop is installed)",
    )
    ap.add_argument("--previous", type=Path, help="results file to compare CPU with (default: the newest)")
    ap.add_argument("--profile", metavar="NAME", help="run this contender's server under cProfile")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return args
    base = QUICK if args.quick else FULL
    count = args.count or base.count
    reps, bytes_requests = args.reps or base.reps, min(count, base.bytes_requests)
    args.plan = replace(base, count=count, reps=reps, bytes_requests=bytes_requests)
    if not 1 <= args.plan.count <= 100_000 or not 1 <= args.plan.reps <= 100:
        ap.error("--count must be in 1..100000 and --reps in 1..100")
    loop = args.loop or ("both" if lanes.uvloop_installed() else "asyncio")
    if loop != "asyncio" and not lanes.uvloop_installed():
        ap.error("uvloop is not installed: pip install 'iac[uvloop]'")
    args.loop = loop
    loops = lanes.LOOPS if loop == "both" else (loop,)
    if args.only:
        args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    else:
        args.only = list(contenders(loops))
    unknown = [n for n in args.only if n not in CONTENDERS]
    if unknown:
        ap.error(f"unknown contender(s) {unknown}; choose from {', '.join(CONTENDERS)}")
    if any(loop_kind(n) == "uvloop" for n in args.only) and not lanes.uvloop_installed():
        ap.error("uvloop is not installed: pip install 'iac[uvloop]'")
    if args.profile and args.profile not in args.only:
        ap.error("--profile NAME must be one of the contenders run")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve:
        serve_main(args)
        return
    report = asyncio.run(run(args))
    if not args.json_only:
        from iac.bench.reports.live import print_rendered

        print_rendered(("node-results", "node-floors"), "iac.bench.scenarios.node", report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
