#!/usr/bin/env python3
"""The IAC benchmark suite: every scenario, side by side with its baselines, in one report.

    .venv/bin/python benchmarks/suite.py                 # full run (= iac bench = make bench)
    .venv/bin/python benchmarks/suite.py --quick         # smoke test (under 2 minutes on 2 cores)
    .venv/bin/python benchmarks/suite.py --only loss     # one scenario (repeatable)
    .venv/bin/python benchmarks/suite.py --out DIR       # where results.json, report.md, *.png go
    .venv/bin/python benchmarks/suite.py --list          # the scenarios

Every scenario runs its contenders in the same run, taking turns (A B C C B A …) after a
warm-up, for several rounds; a figure is the median of the per-round figures with their
min and max, and every IAC figure carries its ratio to the scenario's baseline. The JSON
schema is documented in ``benchmarks/README.md`` (section "Suite").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from stats import median, percentile  # noqa: E402

SCHEMA = "iac-bench/1"
LIBRARIES = ("iac", "aioquic", "qh3", "pynacl", "zstandard", "protobuf", "aiohttp", "grpcio", "matplotlib")
MAX_SAMPLES = 2000  # latency samples kept per contender in the JSON (for the CDF plot)


# --- statistics and interleaving (pure) ---------------------------------------------------------


def summarize(values: Sequence[float]) -> dict[str, float | int]:
    """``{"median", "min", "max", "n"}`` of per-round figures."""
    if not values:
        raise ValueError("no values to summarize")
    return {
        "median": float(median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "n": len(values),
    }


def turn_order(names: Sequence[str], rounds: int) -> list[list[str]]:
    """Contenders' turns per round: forward on even rounds, reversed on odd ones (A B B A …),
    so that no contender always runs first or right after the same neighbour."""
    return [list(names) if r % 2 == 0 else list(reversed(names)) for r in range(rounds)]


def interleave(
    steps: dict[str, Callable[[], float]],
    rounds: int,
    warmup: int = 1,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Run every step ``warmup`` times (results discarded), then ``rounds`` rounds in
    :func:`turn_order`; returns each step's per-round figures."""
    for _ in range(warmup):
        for fn in steps.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in steps}
    for r, order in enumerate(turn_order(list(steps), rounds)):
        if on_round is not None:
            on_round(r)
        for name in order:
            out[name].append(steps[name]())
    return out


async def interleave_async(
    steps: dict[str, Callable[[], Awaitable[float]]],
    rounds: int,
    warmup: int = 1,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """:func:`interleave` for coroutine steps sharing one event loop (nodes that live across rounds)."""
    for _ in range(warmup):
        for fn in steps.values():
            await fn()
    out: dict[str, list[float]] = {name: [] for name in steps}
    for r, order in enumerate(turn_order(list(steps), rounds)):
        if on_round is not None:
            on_round(r)
        for name in order:
            out[name].append(await steps[name]())
    return out


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base


def downsample(samples: Sequence[float], limit: int = MAX_SAMPLES) -> list[float]:
    """At most ``limit`` evenly spaced order statistics (enough for a CDF)."""
    s = sorted(samples)
    if len(s) <= limit:
        return s
    step = (len(s) - 1) / (limit - 1)
    return [s[round(i * step)] for i in range(limit)]


# --- results ------------------------------------------------------------------------------------


@dataclass
class Result:
    """What one scenario produced (see the schema in benchmarks/README.md)."""

    name: str
    title: str
    baseline: str | None = None
    status: str = "ok"  # ok | skipped | unavailable | error
    reason: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    series: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    raw: Any = None
    duration_s: float = 0.0

    def add(
        self,
        contender: str,
        metric: str,
        unit: str,
        values: Sequence[float] | dict[str, Any],
        *,
        better: str = "lower",
        baseline: str | None = None,
        iac: bool | None = None,
    ) -> None:
        """One figure: per-round ``values`` (or an already summarized dict)."""
        stats = dict(values) if isinstance(values, dict) else summarize(values)
        stats.setdefault("n", 1)
        self.rows.append(
            {
                "contender": contender,
                "metric": metric,
                "unit": unit,
                "better": better,
                **{k: stats[k] for k in ("median", "min", "max", "n")},
                "baseline": baseline,
                "iac": contender.startswith("IAC") if iac is None else iac,
                "ratio": None,
            }
        )

    def finish(self) -> None:
        """Fill each IAC row's ratio to its baseline's row of the same metric."""
        index = {(r["contender"], r["metric"]): r for r in self.rows}
        for row in self.rows:
            base_name = row["baseline"] or self.baseline
            row["baseline"] = base_name
            if not row["iac"] or base_name is None or base_name == row["contender"]:
                row["ratio"] = None
                continue
            base = index.get((base_name, row["metric"]))
            row["ratio"] = ratio(row["median"], base["median"]) if base else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "baseline": self.baseline,
            "duration_s": round(self.duration_s, 3),
            "rows": self.rows,
            "series": self.series,
            "notes": self.notes,
            "raw": self.raw,
        }


@dataclass
class Context:
    quick: bool
    tmp: Path
    progress: Callable[[str], None]
    cache: dict[str, Any] = field(default_factory=dict)
    backends: list[str] = field(default_factory=list)


# --- helpers ------------------------------------------------------------------------------------


def quic_backends() -> list[str]:
    """QUIC backends to run the QUIC scenarios on: aioquic always; an accelerated backend
    (qh3) when IAC's backend switch (``iac.transport.quic.backend.available()``) lists it.
    The name reaches the endpoints as ``IAC_QUIC_BACKEND``."""
    try:  # the backend switch of the QUIC adapter, when this IAC has one
        from iac.transport.quic import backend as _quic_backend

        found = [b for b in _quic_backend.available() if b in _quic_backend.BACKENDS]
        return ["aioquic", *[b for b in found if b != "aioquic"]]
    except ImportError:
        pass
    out = ["aioquic"]
    if importlib.util.find_spec("qh3") is not None:
        try:
            from iac.transport import quic

            if "qh3" in getattr(quic, "BACKENDS", ()):
                out.append("qh3")
        except ImportError:
            pass
    return out


def quic_name(backend: str) -> str:
    return "IAC-QUIC" if backend == "aioquic" else f"IAC-QUIC[{backend}]"


def run_script(ctx: Context, script: str, args: Sequence[str], timeout: float) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` with ``--json`` and return what it wrote."""
    out = ctx.tmp / f"{script}-{len(ctx.cache)}-{time.monotonic_ns()}.json"
    argv = [sys.executable, str(HERE / script), *args, "--json", str(out)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0 or not out.exists():
        tail = (res.stderr or res.stdout).strip()[-1500:]
        raise RuntimeError(f"{script} {' '.join(args)} failed ({res.returncode}): {tail}")
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


def codec_json(ctx: Context) -> dict[str, Any]:
    if "codec" not in ctx.cache:
        ctx.progress("codec.py")
        ctx.cache["codec"] = run_script(ctx, "codec.py", ["--quick"] if ctx.quick else [], 900)
    out: dict[str, Any] = ctx.cache["codec"]
    return out


def transport_json(ctx: Context, part: str) -> dict[str, Any]:
    ctx.progress(f"transport.py --only {part}")
    return run_script(ctx, "transport.py", ["--only", part, *(["--quick"] if ctx.quick else [])], 900)


# --- scenarios ----------------------------------------------------------------------------------


def sc_codec(ctx: Context, res: Result) -> None:
    data = codec_json(ctx)
    sp = data["speed"]["us_per_msg"]
    res.baseline = "bare PyNaCl Ed25519"
    res.add("IAC codec", "send: encode vs sign (µs/msg)", "µs", sp["encode"])
    res.add("bare PyNaCl Ed25519", "send: encode vs sign (µs/msg)", "µs", sp["sign"])
    res.add("IAC codec", "receive: decode vs verify (µs/msg)", "µs", sp["decode"])
    res.add("bare PyNaCl Ed25519", "receive: decode vs verify (µs/msg)", "µs", sp["verify"])
    for r in res.rows:
        r["iac"] = r["contender"] == "IAC codec"
    s = data["speed"]
    res.notes.append(
        f"{data['speed']['messages']} messages x {data['speed']['repetitions']} repetitions; "
        f"codec ratio (t_sign+t_verify)/(t_encode+t_decode) = {s['ratio']:.3f} "
        f"[{s['ratio_min']:.3f} .. {s['ratio_max']:.3f}] (target >= 0.80)"
    )
    res.raw = data


def sc_bytes(ctx: Context, res: Result) -> None:
    data = codec_json(ctx)
    rows = data["sizes"]["rows"]
    base = "HTTP/1.1 POST + JSON + SHA-256"
    res.baseline = base
    metric = "bytes per message (test.jsonl)"
    one = {"n": 1}
    for name, key in (
        ("IAC frame, zstd + dictionary", "frame_zstd_dict"),
        ("IAC frame, zstd without dictionary", "frame_zstd"),
        ("IAC frame, uncompressed", "frame_raw"),
        (base, "http_json_sha256"),
    ):
        m = rows[key]["mean"]
        res.add(name, metric, "B", {"median": m, "min": m, "max": m, **one}, iac=name.startswith("IAC"))
    res.notes.append(
        "Frame bytes as sent (signed Message + frame header), each message compressed alone; HTTP is "
        "the request line, four headers and the JSON body (a lower bound: real clients add headers). "
        "TLS/QUIC/TCP/IP overhead is in neither; the `loss` scenario counts whole IP packets at 0 % "
        "loss, and `requests` counts IAC frames both ways per request."
    )
    res.raw = data["sizes"]


def sc_rtt(ctx: Context, res: Result) -> None:
    data = transport_json(ctx, "rtt")["rtt"]
    cases = data["cases"]
    rename = {"bare aioquic echo": "bare aioquic echo", "bare TLS echo": "bare TLS echo"}
    res.baseline = "bare aioquic echo"
    for name, c in cases.items():
        who = rename.get(name, name)
        base = "bare TLS echo" if name in ("IAC-TLS", "IAC-UNIX") else "bare aioquic echo"
        res.add(who, "RTT p50, 1 in flight", "µs", c["p50_us"], baseline=base)
        res.add(who, "RTT p99, 1 in flight", "µs", c["p99_us"], baseline=base)
        res.add(who, "requests/s, 64 in flight", "req/s", c["rps_64"], better="higher", baseline=base)
    res.notes.append(
        f"benchmarks/transport.py --only rtt: {data['rounds']} rounds x {data['round_trips_per_round']} "
        f"round trips and {data['requests_per_round_at_64']} requests at 64 in flight; one process, "
        "one event loop. "
        "IAC-QUIC is compared with bare aioquic, IAC-TLS and IAC-UNIX with the bare TLS echo. "
        "Target: IAC-QUIC p50 <= 1.8 x bare aioquic."
    )
    res.raw = data


def sc_setup(ctx: Context, res: Result) -> None:
    data = transport_json(ctx, "handshake")["handshake"]
    res.baseline = "IAC TLS/TCP"
    for case, s in data["cases_ms"].items():
        where, what = case.split(" ", 1)
        metric = "first delivery, loopback" if where == "loopback" else "first delivery, 20 ms RTT"
        res.add(f"IAC {what}", metric, "ms", s)
    res.notes.append(
        f"benchmarks/transport.py --only handshake: start of dial to the server's first delivered message, "
        f"{data['dials_per_case']} dials per case; 20 ms RTT through the UDP relay / TCP delay proxy. "
        f"0-RTT dials that resumed: {data.get('resumed')}. Targets: 0-RTT <= 0.6 x 1-RTT, "
        "QUIC 1-RTT <= 0.75 x TLS/TCP (at 20 ms)."
    )
    res.raw = data


def sc_oneway(ctx: Context, res: Result) -> None:
    data = transport_json(ctx, "oneway")["oneway"]
    base = "receiver decode-only (codec)"
    res.baseline = base
    res.add(base, "messages/s", "msg/s", data["decode_rate"], better="higher", iac=False)
    res.add(
        "IAC-QUIC one-way, signed ahead",
        "messages/s",
        "msg/s",
        data["oneway_presigned_rate"],
        better="higher",
    )
    res.add(
        "IAC-QUIC one-way, signing in loop",
        "messages/s",
        "msg/s",
        data["oneway_signing_rate"],
        better="higher",
    )
    res.notes.append(
        f"benchmarks/transport.py --only oneway: {data['messages_per_round']} messages per round. "
        "Target: one-way >= 0.5 x the decode-only rate."
    )
    res.raw = data


@dataclass(frozen=True)
class RequestPlan:
    rounds: int
    counts: dict[int, int]  # in flight -> requests per turn


def _request_contenders(ctx: Context) -> list[tuple[str, str, str | None]]:
    """(label, endpoint contender, QUIC backend)."""
    import loss

    out: list[tuple[str, str, str | None]] = [(quic_name(b), "iac-quic", b) for b in ctx.backends]
    out += [("IAC-TLS/TCP", "iac-tls", None), ("IAC-UNIX", "iac-unix", None)]
    if loss.have_aiohttp():
        out += [
            (loss.NAMES[c], c, None)
            for c in ("http", "http-ed25519", "http-ed25519-tls", "http-ed25519-unix")
        ]
    if loss.have_grpc():
        out.append((loss.NAMES["grpc"], "grpc", None))
    return out


#: Transport-matched, equal-security pairs of the ``requests`` scenario: (IAC, HTTP+Ed25519 variant).
SAME_TRANSPORT = (("IAC-TLS/TCP", "HTTPS+Ed25519 JSON"), ("IAC-UNIX", "HTTP+Ed25519 JSON/UNIX"))


def same_transport_ratios(res: Result) -> dict[str, dict[str, float]]:
    """IAC over HTTP+Ed25519 on the same transport, per metric (ratio of medians)."""
    index = {(r["contender"], r["metric"]): r["median"] for r in res.rows}
    out: dict[str, dict[str, float]] = {}
    for iac_name, http_name in SAME_TRANSPORT:
        for (who, metric), value in index.items():
            base = index.get((http_name, metric))
            r = ratio(value, base) if who == iac_name else None
            if r is not None:
                out.setdefault(f"{iac_name} / {http_name}", {})[metric] = round(r, 3)
    return out


def _requests(ctx: Context, res: Result, plan: RequestPlan, cpu_only: bool) -> None:
    import loss

    contenders = _request_contenders(ctx)
    res.baseline = "HTTP+Ed25519 JSON" if loss.have_aiohttp() else None
    if not loss.have_aiohttp():
        res.notes.append(
            "No HTTP baseline: aiohttp is not installed (pip install aiohttp); ratios are empty."
        )
    pairs: dict[str, Any] = {}
    figs: dict[tuple[str, str], list[float]] = {}
    samples: dict[str, list[float]] = {}
    depths = sorted(plan.counts)
    try:
        for label, cont, backend in contenders:
            ctx.progress(f"starting {label}")
            pairs[label] = loss.start_pair(cont, "127.0.0.1", ctx.tmp, backend=backend)
        for label in pairs:  # warm-up
            pairs[label].run(16, 200)
        order = turn_order([c[0] for c in contenders], plan.rounds)
        for r, turn in enumerate(order):
            ctx.progress(f"round {r + 1}/{plan.rounds}")
            for label in turn:
                for depth in depths:
                    n = plan.counts[depth]
                    out = pairs[label].run(depth, n)
                    lat = out["lat_us"]
                    if out["errors"] or not lat:
                        raise RuntimeError(f"{label}: {out['errors']} failed requests at {depth} in flight")
                    done = len(lat)
                    if depth == 1 and not cpu_only:
                        figs.setdefault((label, "RTT p50, 1 in flight"), []).append(median(lat))
                        figs.setdefault((label, "RTT p99, 1 in flight"), []).append(percentile(lat, 99))
                        samples.setdefault(label, []).extend(lat)
                    if not cpu_only:
                        figs.setdefault((label, f"requests/s, {depth} in flight"), []).append(
                            done / out["elapsed_s"]
                        )
                    if depth == max(depths):
                        figs.setdefault((label, f"client CPU per request, {depth} in flight"), []).append(
                            out["cpu_s"] * 1e6 / done
                        )
                        figs.setdefault((label, f"server CPU per request, {depth} in flight"), []).append(
                            out["server_cpu_s"] * 1e6 / done
                        )
                        if out["frame_bytes"] is not None:
                            figs.setdefault((label, "IAC frame bytes per request, both ways"), []).append(
                                out["frame_bytes"] / done
                            )
    finally:
        for pair in pairs.values():
            pair.close()
    for (label, metric), values in figs.items():
        if metric.startswith("RTT"):
            unit, better = "µs", "lower"
        elif metric.startswith("requests/s"):
            unit, better = "req/s", "higher"
        elif "CPU" in metric:
            unit, better = "µs", "lower"
        else:
            unit, better = "B", "lower"
        res.add(label, metric, unit, values, better=better)
    if samples:
        res.series["latency_cdf_us"] = {k: downsample(v) for k, v in samples.items()}
    if not cpu_only:
        res.series["rps_vs_in_flight"] = {
            label: {str(d): median(figs[(label, f"requests/s, {d} in flight")]) for d in depths}
            for label, _, _ in contenders
        }
    res.notes.append(
        "Each contender is a server process and a client process on loopback "
        f"(benchmarks/loss.py serve/client); {plan.rounds} rounds, turns A B … B A; per turn "
        + ", ".join(f"{n} requests at {d} in flight" for d, n in plan.counts.items())
        + ". CPU is time.process_time() of each process over the turn, divided by the requests. "
        "IAC = Node.request (sign, compress, verify, replay check both ways). HTTP+Ed25519 signs and "
        "verifies both ways too (equal security); HTTPS+Ed25519 (TLS 1.3) and HTTP+Ed25519/UNIX are "
        "the same code over IAC-TLS's and IAC-UNIX's transports. HTTP/1.1 holds up to 64 keep-alive "
        "connections at 64 in flight; IAC and gRPC multiplex one. gRPC (benchmarks/baselines.py: "
        "grpcio aio unary, bytes in/out, insecure channel) has no authentication at all."
    )
    same = same_transport_ratios(res)
    if same:
        res.raw = {"same_transport_ratios": same}
        keys = ("RTT p50, 1 in flight", f"requests/s, {max(depths)} in flight")
        for pair, by_metric in same.items():
            shown = [f"{m} {by_metric[m]:.2f}" for m in keys if m in by_metric]
            cpu = [m for m in by_metric if "CPU" in m]
            shown += [f"{m} {by_metric[m]:.2f}" for m in cpu]
            res.notes.append(f"Same transport, equal security: {pair} = " + "; ".join(shown) + ".")


def sc_requests(ctx: Context, res: Result) -> None:
    counts = {1: 200, 16: 600, 64: 1000} if ctx.quick else {1: 1000, 16: 3000, 64: 5000}
    _requests(ctx, res, RequestPlan(rounds=3 if ctx.quick else 7, counts=counts), cpu_only=False)


def sc_cpu(ctx: Context, res: Result) -> None:
    counts = {64: 1000} if ctx.quick else {64: 5000}
    _requests(ctx, res, RequestPlan(rounds=3 if ctx.quick else 7, counts=counts), cpu_only=True)


@dataclass(frozen=True)
class BroadcastPlan:
    sizes: tuple[int, ...]
    rounds: int


def sc_broadcast(ctx: Context, res: Result) -> None:
    import mesh

    from iac.node.node import Node

    if not hasattr(Node, "broadcast"):
        res.status = "unavailable"
        res.reason = "iac.Node has no broadcast() in this version"
        return
    plan = BroadcastPlan((10,), 5) if ctx.quick else BroadcastPlan((10, 50, 100), 25)
    res.raw = {"sizes": list(plan.sizes), "rounds": plan.rounds, "links": {}}
    series: dict[str, dict[str, float]] = {}
    warmup = 2

    async def one_size(n: int) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
        work = Path(tempfile.mkdtemp(prefix=f"b{n}-", dir=ctx.tmp))
        bench = mesh.BroadcastBench(n, work)
        sent: dict[str, list[float]] = {}
        try:
            ctx.progress(f"{n} agents: setting up")
            await bench.setup()

            def counted(label: str, fn: Callable[[], Awaitable[float]]) -> Callable[[], Awaitable[float]]:
                async def step() -> float:
                    b0 = bench.sent_bytes()
                    ms = await fn()
                    if label.startswith("IAC"):
                        sent.setdefault(label, []).append(float(bench.sent_bytes() - b0))
                    return ms

                return step

            steps = {label: counted(label, fn) for label, fn in bench.contenders().items()}
            figs = await interleave_async(
                steps,
                plan.rounds,
                warmup=warmup,
                on_round=lambda r: ctx.progress(f"{n} agents: round {r + 1}/{plan.rounds}"),
            )
            for label in sent:  # the first entries are the warm-ups
                sent[label] = sent[label][warmup:]
            return figs, sent, len(bench.edges)
        finally:
            await bench.close()
            shutil.rmtree(work, ignore_errors=True)

    base = mesh.HTTP_ED25519 if mesh._have_aiohttp() else mesh.IAC_FANOUT
    res.baseline = base
    for n in plan.sizes:
        figs, sent, links = asyncio.run(one_size(n))
        res.raw["links"][str(n)] = links
        for label, values in figs.items():
            res.add(label, f"completion, {n} agents", "ms", values)
            series.setdefault(label, {})[str(n)] = median(values)
        for label, values in sent.items():
            if values:
                res.add(
                    label,
                    f"IAC frame bytes sent per broadcast, all agents, {n} agents",
                    "B",
                    values,
                    baseline=mesh.IAC_FANOUT,
                )
    res.series["completion_vs_agents_ms"] = series
    if base != mesh.HTTP_ED25519:
        res.notes.append("No HTTP baselines: aiohttp is not installed; IAC fan-out is the baseline.")
    res.notes.append(
        "Completion = from the origin's first call to the handler of the last of the N-1 other agents. "
        "All agents run in this one process on one event loop, on UNIX sockets, so the figure is the "
        "CPU of every hop on one core. IAC broadcast: Node.broadcast flooded over a seeded random "
        "connected graph (spanning tree + N/2 extra links: "
        + ", ".join(f"{n} agents {k} links" for n, k in res.raw["links"].items())
        + "), signed once by the origin, verified and deduplicated by each agent, forwarded to every "
        "other neighbour; the origin rotates. IAC fan-out: one origin connected to all N-1 agents, "
        "one signed Node.send each. HTTP fan-out: aiohttp, a keep-alive connection to each agent's "
        "server, one body (Ed25519-signed once, or hashed once) POSTed to all N-1 at once; each server "
        f"verifies it. {plan.rounds} rounds after 2 warm-ups, turns A B … B A."
    )


def sc_filetransfer(ctx: Context, res: Result) -> None:
    import mesh

    from iac.node.node import Node

    if not hasattr(Node, "send_file"):
        res.status = "unavailable"
        res.reason = "iac.Node has no send_file() in this version"
        return
    mib, rounds = (8, 3) if ctx.quick else (48, 5)
    work = Path(tempfile.mkdtemp(prefix="files-", dir=ctx.tmp))  # private: it holds UNIX sockets
    src = mesh.make_file(work / "payload.bin", mib)
    base = "bare aioquic, one stream"
    res.baseline = base
    steps: dict[str, Callable[[], Awaitable[float]]] = {}

    def over(url: str, backend: str | None = None) -> Callable[[], Awaitable[float]]:
        return lambda: mesh.bench_iac_file(src, work, url, None, backend=backend)

    def bare(lib: str) -> Callable[[], Awaitable[float]]:
        return lambda: mesh.bench_bare_aioquic(src, work, lib)

    steps[base] = bare("aioquic")

    bases: dict[str, str] = {}
    for b in ctx.backends:
        label = f"{quic_name(b)} send_file"
        steps[label] = over("quic://127.0.0.1:0", b)
        if b != "aioquic" and importlib.util.find_spec(b) is not None:  # that backend's own ceiling
            bases[label] = f"bare {b}, one stream"
            steps[bases[label]] = bare(b)
    steps["IAC-TLS/TCP send_file"] = over("tls://127.0.0.1:0")
    steps["IAC-UNIX send_file"] = over("unix://")
    figs = asyncio.run(
        interleave_async(steps, rounds, warmup=1, on_round=lambda r: ctx.progress(f"round {r + 1}/{rounds}"))
    )
    for label, values in figs.items():
        res.add(label, f"MB/s, {mib} MiB file", "MB/s", values, better="higher", baseline=bases.get(label))
    res.raw = {"file_mib": mib, "rounds": rounds, "mb_s": figs}
    res.notes.append(
        f"One {mib} MiB file of seeded random bytes, sent once per turn by each contender on loopback "
        f"({rounds} rounds after a warm-up, turns A B … B A); MB/s = 10^6 bytes/s from the first byte "
        "to the receiver's confirmation; the connection is set up before the clock starts. "
        "IAC: Node.send_file (chunks as signed FILE_TRANSFER messages, default window, the receiver "
        "checks the SHA-256 and renames the file into its inbox; durable_files off). Bare aioquic: "
        "one QUIC stream, the server writes the bytes to disk and hashes them, nothing signed: the "
        "ceiling of the QUIC stack IAC-QUIC runs on (IAC-QUIC[qh3] is compared with bare qh3, when "
        "installed). TLS and UNIX rows are compared with bare aioquic too (a different transport)."
    )


def sc_loss(ctx: Context, res: Result) -> None:
    import loss

    plan = loss.QUICK_PLAN if ctx.quick else loss.FULL_PLAN
    out = loss.run_loss(plan, ctx.progress)
    if out["status"] != "ok":
        res.status = "skipped"
        res.reason = out["reason"]
        return
    names = out["names"]
    res.baseline = names["http"] if "http" in names else names["iac-tls"]
    p99_series: dict[str, dict[str, float]] = {}
    for level in out["levels"]:
        pc = f"{level['loss']:.0%}"
        for c, label in names.items():
            if level["p50_ms"][c]:
                res.add(label, f"p50 at {pc} loss", "ms", level["p50_ms"][c])
                res.add(label, f"p99 at {pc} loss", "ms", level["p99_ms"][c])
                p99_series.setdefault(label, {})[pc] = median(level["p99_ms"][c])
            if level["errors"][c]:
                res.notes.append(f"{label} at {pc} loss: {level['errors'][c]} requests failed")
            if level["loss"] == 0.0:
                res.add(
                    label,
                    "IP bytes on the wire per request (0 % loss)",
                    "B",
                    level["wire_bytes_per_request"][c],
                )
        if level["loss"] == max(plan.losses):
            res.series["latency_cdf_ms_at_max_loss"] = {
                names[c]: downsample(v) for c, v in level["samples_ms"].items() if v
            }
        del level["samples_ms"]
    res.series["p99_vs_loss_ms"] = p99_series
    res.notes.append(
        f"64 concurrent independent requests, {out['plan']['requests_per_turn']} per turn, "
        f"{plan.rounds} rounds per loss level; 20 ms RTT ({plan.one_way_delay * 1e3:.0f} ms each way); loss "
        "applies to every IP packet in each direction (TUN link between two network namespaces, "
        "benchmarks/netem.py); IAC endpoints run inside the namespaces. HTTP/1.1 uses 64 keep-alive "
        "connections, IAC one connection."
    )
    res.notes.extend(out["notes"])
    res.raw = out


def sc_cc(ctx: Context, res: Result) -> None:
    import cc
    import ccreport

    plan = cc.QUICK_PLAN if ctx.quick else cc.plan_named(os.environ.get("IAC_CC_PLAN", "full"))
    out = cc.run_cc(plan, ctx.progress)
    if out["status"] != "ok":
        res.status, res.reason = "skipped", out["reason"]
        return
    ccreport.fill_result(out, res)


def sc_a2a(ctx: Context, res: Result) -> None:
    import a2a_calls

    a2a_calls.scenario(ctx, res, run_script)


def sc_reconnect(ctx: Context, res: Result) -> None:
    import reconnect

    reconnect.scenario(ctx, res, run_script)


def sc_nat(ctx: Context, res: Result) -> None:
    import nat

    nat.scenario(ctx, res, run_script)


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[Context, Result], None]


SCENARIOS: list[Scenario] = [
    Scenario("codec", "Codec: encode/decode vs bare Ed25519", sc_codec),
    Scenario("bytes", "Bytes on the wire per message, with and without the dictionary", sc_bytes),
    Scenario("rtt", "Transport request/reply vs bare aioquic and TLS echoes", sc_rtt),
    Scenario("requests", "Node requests: RTT, requests/s at 1/16/64 in flight, CPU, bytes", sc_requests),
    Scenario("cpu", "CPU µs per request on each side (64 in flight)", sc_cpu),
    Scenario("setup", "Connection set-up to first delivered message", sc_setup),
    Scenario("oneway", "One-way messages/s vs the receiver's decode rate", sc_oneway),
    Scenario("loss", "64 concurrent requests under loss at 20 ms RTT", sc_loss),
    Scenario("broadcast", "Broadcast completion for N agents", sc_broadcast),
    Scenario("filetransfer", "File transfer MB/s", sc_filetransfer),
    Scenario("a2a", "A2A calls: JSON-RPC over HTTP vs the IAC binding (QUIC, TLS, UNIX)", sc_a2a),
    Scenario("reconnect", "First delivery after a reconnect through the Node API, 20 ms RTT", sc_reconnect),
    Scenario("cc", "Congestion control over a bottleneck: goodput and request p99 during bulk", sc_cc),
    Scenario("nat", "Through NATs: time to a direct path, RTT direct vs relayed, relay bytes saved", sc_nat),
]
#: In a full run the ``cpu`` figures come from ``requests``; ``cpu`` alone is for ``--only cpu``.
DEFAULT_SKIP_WHEN_ALL = {"cpu"}


def select(only: Sequence[str] | None) -> list[Scenario]:
    if not only:
        return [s for s in SCENARIOS if s.name not in DEFAULT_SKIP_WHEN_ALL]
    known = {s.name: s for s in SCENARIOS}
    bad = [n for n in only if n not in known]
    if bad:
        raise SystemExit(f"unknown scenario {', '.join(bad)}; known: {', '.join(known)}")
    return [known[n] for n in only]


# --- environment --------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def environment() -> dict[str, Any]:
    libs: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            libs[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            libs[name] = None
    with contextlib.suppress(ImportError):
        from google.protobuf.internal import api_implementation

        libs["protobuf_backend"] = api_implementation.Type()
    commit = None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        r = subprocess.run(
            ["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
        commit = r.stdout.strip() or None
    return {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "libraries": libs,
        "quic_backends": quic_backends(),
        "git_commit": commit,
    }


# --- report -------------------------------------------------------------------------------------


def _fmt(x: float | None) -> str:
    if x is None:
        return "—"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.0f}"
    if a >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


#: The headline table's metrics per scenario (``None``: the metric of the largest N).
HEADLINE: dict[str, tuple[str, ...] | None] = {
    "codec": ("send: encode vs sign (µs/msg)", "receive: decode vs verify (µs/msg)"),
    "bytes": ("bytes per message (test.jsonl)",),
    "rtt": ("RTT p50, 1 in flight",),
    "requests": ("RTT p50, 1 in flight", "requests/s, 64 in flight", "server CPU per request, 64 in flight"),
    "setup": ("first delivery, 20 ms RTT",),
    "oneway": ("messages/s",),
    "loss": ("p99 at 0% loss", "p99 at 3% loss"),
    "broadcast": None,
    "filetransfer": None,
    "a2a": ("SendMessage p50, 1 in flight", "SendMessage calls/s, 64 in flight"),
    "reconnect": ("first delivery after a reconnect, 20 ms RTT (Node API)",),
}


def headline(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per IAC figure worth a headline: its baseline, its ratio, whether IAC is ahead,
    and the best other (non-IAC) contender for the same metric."""
    out: list[dict[str, Any]] = []
    for sc in doc["scenarios"]:
        if sc["status"] != "ok" or sc["name"] not in HEADLINE:
            continue
        wanted = HEADLINE[sc["name"]]
        rows = sc["rows"]
        if wanted is None:  # the first metric of the last (largest) size
            timed = [r["metric"] for r in rows if r["unit"] != "B"]
            wanted = (timed[-1],) if timed else ()
        for r in rows:
            if not r["iac"] or r["metric"] not in wanted or r["ratio"] is None:
                continue
            higher = r["better"] == "higher"
            others = [o for o in rows if o["metric"] == r["metric"] and not o["iac"]]
            best = max(others, key=lambda o: o["median"] * (1 if higher else -1), default=None)
            base = next(
                (o for o in rows if o["contender"] == r["baseline"] and o["metric"] == r["metric"]), None
            )
            out.append(
                {
                    "scenario": sc["name"],
                    "metric": r["metric"],
                    "unit": r["unit"],
                    "contender": r["contender"],
                    "median": r["median"],
                    "baseline": r["baseline"],
                    "baseline_median": base["median"] if base else None,
                    "ratio": r["ratio"],
                    "ahead": r["ratio"] > 1 if higher else r["ratio"] < 1,
                    "best_other": best["contender"] if best else None,
                    "best_other_median": best["median"] if best else None,
                }
            )
    return out


def headline_markdown(doc: dict[str, Any]) -> list[str]:
    rows = headline(doc)
    if not rows:
        return []
    lines = [
        "",
        "## Headline",
        "",
        "| scenario | metric | IAC | median | baseline | baseline median | × baseline | IAC | best other |",
        "|---|---|---|---:|---|---:|---:|---|---|",
    ]
    for h in rows:
        best = "—" if h["best_other"] is None else f"{h['best_other']} ({_fmt(h['best_other_median'])})"
        lines.append(
            f"| {h['scenario']} | {h['metric']} | {h['contender']} | {_fmt(h['median'])} {h['unit']} | "
            f"{h['baseline']} | {_fmt(h['baseline_median'])} | {h['ratio']:.2f} | "
            f"{'ahead' if h['ahead'] else '**behind**'} | {best} |"
        )
    return lines


def markdown(doc: dict[str, Any]) -> str:
    env = doc["environment"]
    libs = ", ".join(f"{k} {v}" for k, v in env["libraries"].items() if v)
    lines = [
        "# IAC benchmark report",
        "",
        f"* command: `{doc['command']}`",
        f"* date: {doc['started']}, {doc['duration_s']:.0f} s, {'quick' if doc['quick'] else 'full'} run",
        f"* machine: {env['cpu_model']}, {env['cores']} cores, {env['system']} ({env['machine']})",
        f"* Python {env['python']} ({env['implementation']}); {libs}",
        f"* QUIC backends: {', '.join(env['quic_backends'])}; git commit {env['git_commit'] or 'unknown'}",
        "",
        "Figures are the median [min .. max] of the per-round figures; contenders took turns in the "
        "same run. "
        "**× baseline** is an IAC figure over the scenario's baseline for the same metric "
        "(for `higher is better` metrics above 1 means IAC is ahead, otherwise below 1 does).",
    ]
    lines += headline_markdown(doc)
    for sc in doc["scenarios"]:
        lines += ["", f"## {sc['name']} — {sc['title']}", ""]
        if sc["status"] != "ok":
            lines.append(f"**{sc['status']}**: {sc['reason']}")
            continue
        if sc["baseline"]:
            lines.append(f"Baseline: **{sc['baseline']}**. Took {sc['duration_s']:.1f} s.")
            lines.append("")
        lines.append("| metric | contender | median | min .. max | unit | × baseline |")
        lines.append("|---|---|---:|---:|---|---:|")
        for r in sc["rows"]:
            rr = "—" if r["ratio"] is None else f"{r['ratio']:.2f}"
            if r["ratio"] is not None and r["baseline"] != sc["baseline"]:
                rr += f" (vs {r['baseline']})"
            lines.append(
                f"| {r['metric']} | {r['contender']} | {_fmt(r['median'])} | "
                f"{_fmt(r['min'])} .. {_fmt(r['max'])} | {r['unit']} ({r['better']} is better) | {rr} |"
            )
        for note in sc["notes"]:
            lines += ["", f"* {note}"]
    if doc.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{p}]({p})" for p in doc["plots"]]
    return "\n".join(lines) + "\n"


#: Plot data: (label, x values, y values) per line.
Lines = Iterable[tuple[str, Sequence[float], Sequence[float]]]


def plots(doc: dict[str, Any], out: Path) -> list[str]:
    """PNG plots when matplotlib is installed; the file names written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made: list[str] = []
    by = {s["name"]: s for s in doc["scenarios"] if s["status"] == "ok"}

    def figure(
        fname: str,
        title: str,
        xlabel: str,
        ylabel: str,
        lines: Lines,
        xscale: dict[str, Any] | None = None,
        marker: str | None = "o",
    ) -> None:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, xs, ys in lines:
            ax.plot(xs, ys, marker=marker, label=label)
        if xscale:
            ax.set_xscale(**xscale)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)

    def cdf(series: dict[str, list[float]]) -> Lines:
        for name, xs in series.items():
            yield name, sorted(xs), [(i + 1) / len(xs) for i in range(len(xs))]

    def by_int_x(series: dict[str, dict[str, float]]) -> Lines:
        for name, pts in series.items():
            xs = sorted(int(k) for k in pts)
            yield name, xs, [pts[str(x)] for x in xs]

    req = by.get("requests")
    if req and req["series"].get("latency_cdf_us"):
        figure(
            "latency_cdf.png",
            "Latency CDF",
            "RTT (µs), 1 in flight, loopback",
            "fraction of requests",
            cdf(req["series"]["latency_cdf_us"]),
            {"value": "log"},
            marker=None,
        )
    if req and req["series"].get("rps_vs_in_flight"):
        figure(
            "rps_vs_in_flight.png",
            "Requests/s vs in-flight (loopback)",
            "requests in flight",
            "requests/s",
            by_int_x(req["series"]["rps_vs_in_flight"]),
            {"value": "log", "base": 2},
        )
    bc = by.get("broadcast")
    if bc and bc["series"].get("completion_vs_agents_ms"):
        figure(
            "broadcast_completion.png",
            "Broadcast completion vs agents (one process, UNIX sockets)",
            "agents",
            "completion (ms), last agent reached",
            by_int_x(bc["series"]["completion_vs_agents_ms"]),
        )
    lo = by.get("loss")
    if lo and lo["series"].get("p99_vs_loss_ms"):
        loss = lo["series"]["p99_vs_loss_ms"]
        figure(
            "p99_vs_loss.png",
            "p99 vs loss, 64 concurrent requests, 20 ms RTT",
            "packet loss per direction (%)",
            "p99 latency (ms)",
            ((name, [float(x.rstrip("%")) for x in pts], list(pts.values())) for name, pts in loss.items()),
        )
    if lo and lo["series"].get("latency_cdf_ms_at_max_loss"):
        figure(
            "loss_latency_cdf.png",
            "Latency CDF at the highest loss",
            "latency (ms)",
            "fraction of requests",
            cdf(lo["series"]["latency_cdf_ms_at_max_loss"]),
            marker=None,
        )
    import ccreport

    made += ccreport.plots(by.get("cc"), out)
    return made


# --- runner -------------------------------------------------------------------------------------


class Progress:
    """``[i/n] scenario: what   elapsed`` lines on stderr (nothing when quiet)."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.t0 = time.monotonic()
        self.i, self.name = 0, ""

    def scenario(self, i: int, name: str) -> None:
        self.i, self.name = i, name
        self("start")

    def __call__(self, what: str) -> None:
        if not self.quiet:
            el = time.monotonic() - self.t0
            print(f"[{self.i}/{self.total}] {self.name}: {what}  ({el:.0f} s)", file=sys.stderr, flush=True)


def run(argv: Sequence[str] | None = None, command: str | None = None) -> int:
    ap = argparse.ArgumentParser(description="IAC benchmark suite")
    ap.add_argument("--quick", action="store_true", help="smoke test: small counts (under 2 minutes)")
    ap.add_argument("--only", action="append", metavar="NAME", help="run this scenario (repeatable)")
    ap.add_argument("--json-only", action="store_true", help="no progress, no Markdown, no plots")
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)  # as the user typed it (iac bench)
    args = ap.parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:<13} {s.title}")
        return 0
    chosen = select(args.only)
    # SIGTERM ends the run through sys.exit, so finally blocks and atexit (netem.Link) clean up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    prog = Progress(len(chosen), args.json_only)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": args.command
        or command
        or shlex.join([Path(sys.executable).name, "benchmarks/suite.py", *(argv or sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "environment": environment(),
        "scenarios": [],
    }
    with tempfile.TemporaryDirectory(prefix="iac-bench-") as tmp:
        ctx = Context(args.quick, Path(tmp), prog, backends=doc["environment"]["quic_backends"])
        for i, sc in enumerate(chosen, 1):
            prog.scenario(i, sc.name)
            res = Result(sc.name, sc.title)
            t = time.monotonic()
            try:
                sc.run(ctx, res)
            except Exception as exc:  # one scenario failing does not stop the suite
                res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"
            res.duration_s = time.monotonic() - t
            res.finish()
            doc["scenarios"].append(res.to_json())
            prog(f"{res.status} in {res.duration_s:.1f} s")
    doc["duration_s"] = time.monotonic() - t0
    doc["plots"] = [] if args.json_only else plots(doc, args.out)
    doc["headline"] = headline(doc)
    (args.out / "results.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not args.json_only:
        (args.out / "report.md").write_text(markdown(doc), encoding="utf-8")
        print_summary(doc, args.out)
    return 1 if any(s["status"] == "error" for s in doc["scenarios"]) else 0


def print_summary(doc: dict[str, Any], out: Path) -> None:
    for sc in doc["scenarios"]:
        print(f"\n== {sc['name']}: {sc['title']} [{sc['status']}]")
        if sc["status"] != "ok":
            print(f"   {sc['reason']}")
            continue
        for r in sc["rows"]:
            rr = "" if r["ratio"] is None else f"  x{r['ratio']:.2f} vs {r['baseline']}"
            print(
                f"   {r['metric'][:42]:<42} {r['contender'][:34]:<34} {_fmt(r['median']):>9} {r['unit']:<5}"
                f" [{_fmt(r['min'])} .. {_fmt(r['max'])}]{rr}"
            )
    print(
        f"\nWrote {out / 'results.json'}, {out / 'report.md'}" + "".join(f", {out / p}" for p in doc["plots"])
    )


if __name__ == "__main__":
    sys.exit(run())
