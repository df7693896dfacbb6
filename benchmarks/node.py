#!/usr/bin/env python3
"""Node benchmark: IAC ``node.request`` over QUIC, TLS/TCP and UNIX next to HTTP and gRPC.

    .venv/bin/python benchmarks/node.py                    # full run (~2 minutes)
    .venv/bin/python benchmarks/node.py --quick            # smoke test (well under a minute)
    .venv/bin/python benchmarks/node.py --json out.json    # also write every number as JSON
    .venv/bin/python benchmarks/node.py --only iac-tls,http-ed25519 --reps 5 --count 300
    .venv/bin/python benchmarks/node.py --profile iac-tls  # cProfile the IAC-TLS server process

Contenders (one run, all side by side):

* ``iac-quic``, ``iac-tls``, ``iac-unix`` — ``Node.request`` with a RUN message whose payload
  is the corpus object; the full pipeline both ways: build, sign, compress with the shipped
  dictionary, frame; on receipt decompress, verify, freshness and replay/dedup checks,
  dispatch to the handler (inline, ``sync_in_thread=False``), and the same for the signed
  REPLY. QUIC runs on aioquic, and as ``iac-quic-qh3`` on qh3 when it is installed (the
  accelerated backend of ``iac.transport.quic.backend``; selected with ``set_backend`` in
  the server's process and for the client's dial).
* the baselines of ``benchmarks/baselines.py``: ``http-sha256`` (Agent Zero style),
  ``http-ed25519`` (equal security; the reference), ``http-ed25519-tls`` and
  ``http-ed25519-unix`` (transport-matched, supplementary), ``grpc`` (aio unary, bytes
  in/out, no auth).

Method:

* Every server runs in its own process (started once, idle while others are measured);
  every client runs in this process on one asyncio event loop. On a 2-core machine the
  client and the active server each get a core.
* Payloads: ``--count`` objects sampled (seed 7) from ``corpus/test.jsonl``; request ``i``
  of every phase sends payload ``i mod count``, so each contender sends the same sequence.
* Warm-up: per contender 50 sequential requests and 4 × 64 at 64 in flight (opens all the
  HTTP keep-alive connections, fills caches).
* Each repetition runs, for every contender in turn (the order reverses every other
  repetition): ``--count`` sequential requests (RTT of each: p50 and p99 of that
  repetition), then ``4 × --count`` requests by 64 workers (requests/s at 64 in flight, and
  the CPU time of the server process and of this process per request). Tables give the
  median over repetitions with [min .. max].
* Bytes on the wire, in a separate untimed pass after the timed ones: a fresh client connects
  through a counting relay — TCP/UNIX: ``baselines.CountingProxy`` (bytes each side writes
  to its stream socket: TLS records, HTTP headers, HTTP/2 and IAC frames; not TCP/IP
  headers or pure ACKs); QUIC: ``iac.testing.relay.UdpRelay`` with no impairment, also summing
  UDP payloads (every QUIC packet, ACK-only ones included). ``setup`` = bytes until the
  first reply arrived (connection, TLS, HELLO, first request); per request = the mean over
  ``min(count, 200)`` sequential requests after 20 more warm-up requests. For IAC the
  frame bytes (``NodeStats``, before TLS/QUIC) are given too.
* CPU: user+system time of the server process (all threads, ``/proc/PID/task/*/schedstat``)
  and of this process (``time.process_time``) over the 64-in-flight phase, per request. Wall
  times suffer when other programs share the machine; CPU per request much less so (the
  ``sum`` column: server + client). This process hosts every client at once; idle, they
  cost ~1.5 ms of CPU per second in all (under 1 µs per request).
* Targets against ``http-ed25519``: IAC-TLS and IAC-UNIX req/s at 64 >= 1.5×
  and p50 <= 0.8×; IAC-QUIC (each backend) p50 <= 1.0× and req/s >= 1.0×; bytes per request <= 0.4× each
  HTTP baseline (``http-sha256`` and ``http-ed25519``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import baselines  # noqa: E402
from baselines import Client, CountingProxy, ServerProcess  # noqa: E402
from stats import median, percentile  # noqa: E402

TEST = HERE / "corpus" / "test.jsonl"
IAC = ("iac-quic", "iac-tls", "iac-unix")
if importlib.util.find_spec("qh3") and importlib.util.find_spec("iac.transport.quic.backend"):
    IAC = ("iac-quic", "iac-quic-qh3", "iac-tls", "iac-unix")  # the accelerated QUIC backend
QUIC_BACKEND = {"iac-quic": "aioquic", "iac-quic-qh3": "qh3"}
CONTENDERS = (*IAC, *baselines.BASELINES)
REFERENCE = "http-ed25519"
HTTP_BASELINES = ("http-sha256", "http-ed25519")
IN_FLIGHT = 64
SEED = 7
BYTES_WARMUP = 20
BYTES_MAX = 200


# --- IAC contender ---------------------------------------------------------------------------


async def start_iac(name: str, workdir: Path) -> baselines.Server:
    from iac.node.config import NodeConfig
    from iac.node.node import Context, Node
    from iac.wire._pb.iac_pb2 import MessageType

    transport = name.split("-")[1]
    if name in QUIC_BACKEND:  # this process serves one contender: select its backend for good
        _set_quic_backend(QUIC_BACKEND[name])
    url = f"unix://{workdir / name / 's.sock'}" if transport == "unix" else f"{transport}://127.0.0.1:0"
    node = Node(listen=[url], config=NodeConfig(sync_in_thread=False))

    @node.on(MessageType.RUN)
    def handler(ctx: Context) -> object:
        return baselines.answer(ctx.payload)

    await node.start()
    return baselines.Server({"name": name, "agent_id": node.agent_id, "url": node.addresses[0]}, node.close)


def _set_quic_backend(name: str | None) -> None:
    with contextlib.suppress(ImportError):
        from iac.transport.quic.backend import set_backend

        set_backend(name)


class IacClient(Client):
    def __init__(self, payloads: list[Any], info: dict[str, Any], *, url: str | None = None) -> None:
        super().__init__(payloads)
        self.name = info["name"]
        self.peer = info["agent_id"]
        self.url = url or info["url"]
        self.node: Any = None

    async def start(self) -> None:
        from iac.node.node import Node
        from iac.wire._pb.iac_pb2 import MessageType

        self.run_type = MessageType.RUN
        self.node = Node()
        await self.node.start()
        self.node.add_peer(self.peer, self.url)
        if self.name in QUIC_BACKEND:  # a connection keeps the backend it was dialed with
            _set_quic_backend(QUIC_BACKEND[self.name])
            try:
                await self.request(0)
            finally:
                _set_quic_backend(None)

    async def request(self, i: int) -> None:
        reply = await self.node.request(self.peer, self.run_type, self.payloads[i % len(self.payloads)])
        if reply.payload.get("ok") is not True:
            raise RuntimeError(f"{self.name}: bad reply {reply.payload!r}")

    def frame_bytes(self) -> int:
        s = self.node.stats()
        return int(s.bytes_sent + s.bytes_received)

    async def close(self) -> None:
        if self.node is not None:
            await self.node.close()


def make_client(payloads: list[Any], info: dict[str, Any], via: tuple[Any, ...] | None = None) -> Client:
    if info["name"] in IAC:
        url = None
        if via is not None:
            scheme = info["name"].split("-")[1]
            url = f"unix://{via[1]}" if via[0] == "unix" else f"{scheme}://{via[1]}:{via[2]}"
        return IacClient(payloads, info, url=url)
    return baselines.baseline_client(payloads, info, via=via)


# --- measuring --------------------------------------------------------------------------------


@dataclass
class Series:
    """One figure per repetition."""

    values: list[float] = field(default_factory=list)

    def summary(self, digits: int = 1) -> dict[str, float] | None:
        if not self.values:
            return None
        return {
            "median": round(median(self.values), digits),
            "min": round(min(self.values), digits),
            "max": round(max(self.values), digits),
        }


@dataclass
class Result:
    name: str
    p50_us: Series = field(default_factory=Series)
    p99_us: Series = field(default_factory=Series)
    rps: Series = field(default_factory=Series)
    server_cpu_us: Series = field(default_factory=Series)
    client_cpu_us: Series = field(default_factory=Series)
    wire: dict[str, float] = field(default_factory=dict)


async def sequential(client: Client, n: int) -> list[float]:
    rtts = []
    clock = time.perf_counter
    for i in range(n):
        t = clock()
        await client.request(i)
        rtts.append(clock() - t)
    return rtts


async def concurrent(client: Client, n: int, in_flight: int = IN_FLIGHT) -> float:
    """Run ``n`` requests with ``in_flight`` workers; return the elapsed seconds."""
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            await client.request(i)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return time.perf_counter() - t


async def measure_rep(client: Client, server: ServerProcess, count: int, result: Result) -> None:
    gc.collect()
    rtts = await sequential(client, count)
    result.p50_us.values.append(median(rtts) * 1e6)
    result.p99_us.values.append(percentile(rtts, 99) * 1e6)
    n = 4 * count
    gc.collect()
    s0, c0 = server.cpu_seconds(), time.process_time()
    elapsed = await concurrent(client, n)
    s1, c1 = server.cpu_seconds(), time.process_time()
    result.rps.values.append(n / elapsed)
    if s0 is not None and s1 is not None:
        result.server_cpu_us.values.append((s1 - s0) / n * 1e6)
    result.client_cpu_us.values.append((c1 - c0) / n * 1e6)


async def measure_wire(
    name: str, info: dict[str, Any], payloads: list[Any], workdir: Path, n: int
) -> dict[str, float]:
    """Bytes at the socket per request, through a counting relay (see the module docstring)."""
    relay: Any
    if name in QUIC_BACKEND:
        host, port = info["url"].removeprefix("quic://").rsplit(":", 1)
        relay = baselines.counting_udp_relay((host, int(port)))
        rhost, rport = await relay.start()
        via: tuple[Any, ...] = ("udp", rhost, rport)
    else:
        if name in IAC:
            url = info["url"]
            target: tuple[Any, ...] = (
                ("unix", url.removeprefix("unix://"))
                if url.startswith("unix://")
                else ("tcp", *_host_port(url.removeprefix("tls://")))
            )
        else:
            target = baselines.server_target(info)
        relay = CountingProxy(target, listen_path=str(workdir / f"proxy-{name}.sock"))
        via = await relay.start()
    client = make_client(payloads, info, via)
    try:
        await client.start()
        await client.request(0)
        setup = relay.total
        for i in range(BYTES_WARMUP):
            await client.request(i)
        await asyncio.sleep(0.05)  # let trailing ACKs / window updates land before the snapshot
        up0, down0 = relay.up, relay.down
        f0 = client.frame_bytes() if isinstance(client, IacClient) else 0
        await sequential(client, n)
        await asyncio.sleep(0.05)
        up, down = (relay.up - up0) / n, (relay.down - down0) / n
        out = {"up": round(up, 1), "down": round(down, 1), "per_request": round(up + down, 1), "setup": setup}
        if isinstance(client, IacClient):
            out["iac_frame_bytes"] = round((client.frame_bytes() - f0) / n, 1)
        return out
    finally:
        await client.close()
        await relay.close()


def _host_port(s: str) -> tuple[str, int]:
    host, port = s.rsplit(":", 1)
    return host, int(port)


# --- the run ----------------------------------------------------------------------------------


def load_payloads(count: int) -> list[Any]:
    lines = [line for line in TEST.read_text(encoding="utf-8").splitlines() if line.strip()]
    rng = random.Random(SEED)
    return [json.loads(line) for line in rng.sample(lines, min(count, len(lines)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    names = args.only
    payloads = load_payloads(args.count)
    workdir = Path(tempfile.mkdtemp(prefix="iacbench-"))
    profile_file = str(workdir / "server.pstats") if args.profile else None
    servers: dict[str, ServerProcess] = {}
    clients: dict[str, Client] = {}
    results = {name: Result(name) for name in names}
    wire: dict[str, dict[str, float]] = {}
    try:
        started = await asyncio.gather(
            *(
                baselines.spawn_server(
                    Path(__file__), n, workdir, profile_file if n == args.profile else None
                )
                for n in names
            )
        )
        servers = {s.name: s for s in started}
        for name in names:
            clients[name] = make_client(payloads, servers[name].info)
            await clients[name].start()
        say(args, f"warm-up: {len(names)} contenders")
        for name in names:
            await sequential(clients[name], 50)
            await concurrent(clients[name], 4 * IN_FLIGHT)
        for rep in range(args.reps):
            order = names if rep % 2 == 0 else names[::-1]
            say(args, f"repetition {rep + 1}/{args.reps}: {' '.join(order)}")
            for name in order:
                await measure_rep(clients[name], servers[name], args.count, results[name])
        for name in names:
            await clients[name].close()
        clients.clear()
        say(args, "bytes on the wire")
        for name in names:
            wire[name] = await measure_wire(
                name, servers[name].info, payloads, workdir, min(args.count, BYTES_MAX)
            )
            results[name].wire = wire[name]
    finally:
        for c in clients.values():
            with contextlib.suppress(Exception):
                await c.close()
        await asyncio.gather(*(s.stop() for s in servers.values()), return_exceptions=True)
    report = build_report(args, results, len(payloads))
    if profile_file:
        report["profile"] = profile_summary(profile_file, args.profile)
    shutil.rmtree(workdir, ignore_errors=True)
    return report


def say(args: argparse.Namespace, text: str) -> None:
    if not args.json_only:
        print(f"  .. {text}", file=sys.stderr, flush=True)


def versions() -> dict[str, str]:
    out = {}
    for dist in ("aioquic", "pynacl", "zstandard", "protobuf", "aiohttp", "grpcio"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[dist] = metadata.version(dist)
    return out


TRANSPORT = {
    "iac-quic": ("QUIC (aioquic)", "Ed25519 both ways + TLS 1.3"),
    "iac-quic-qh3": ("QUIC (qh3)", "Ed25519 both ways + TLS 1.3"),
    "iac-tls": ("TLS 1.3 / TCP", "Ed25519 both ways + TLS 1.3"),
    "iac-unix": ("UNIX socket", "Ed25519 both ways"),
    "http-sha256": ("HTTP/1.1 / TCP", "SHA-256(payload+password)"),
    "http-ed25519": ("HTTP/1.1 / TCP", "Ed25519 both ways"),
    "http-ed25519-tls": ("HTTPS 1.1 / TLS 1.3", "Ed25519 both ways + TLS 1.3"),
    "http-ed25519-unix": ("HTTP/1.1 / UNIX", "Ed25519 both ways"),
    "grpc": ("HTTP/2 / TCP", "none"),
}


def build_report(args: argparse.Namespace, results: dict[str, Result], n_payloads: int) -> dict[str, Any]:
    contenders: dict[str, Any] = {}
    for name, r in results.items():
        transport, security = TRANSPORT[name]
        contenders[name] = {
            "transport": transport,
            "security": security,
            "rtt_p50_us": r.p50_us.summary(),
            "rtt_p99_us": r.p99_us.summary(),
            "requests_per_s_at_64": r.rps.summary(0),
            "server_cpu_us_per_request_at_64": r.server_cpu_us.summary(),
            "client_cpu_us_per_request_at_64": r.client_cpu_us.summary(),
            "cpu_us_per_request_at_64": _sum_medians(r.server_cpu_us, r.client_cpu_us),
            "bytes_per_request": r.wire.get("per_request"),
            "bytes_up": r.wire.get("up"),
            "bytes_down": r.wire.get("down"),
            "setup_bytes": r.wire.get("setup"),
            "iac_frame_bytes_per_request": r.wire.get("iac_frame_bytes"),
        }
    return {
        "benchmark": "node",
        "command": "python benchmarks/node.py " + " ".join(sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "versions": versions(),
        },
        "config": {
            "sequential_per_rep": args.count,
            "concurrent_per_rep": 4 * args.count,
            "in_flight": IN_FLIGHT,
            "reps": args.reps,
            "payloads": n_payloads,
            "bytes_requests": min(args.count, BYTES_MAX),
            "reference": REFERENCE,
        },
        "contenders": contenders,
        "targets": targets(contenders),
    }


def _sum_medians(a: Series, b: Series) -> float | None:
    if not a.values or not b.values:
        return None
    return round(median(a.values) + median(b.values), 1)


def _med(c: dict[str, Any], key: str) -> float | None:
    v = c.get(key)
    if isinstance(v, dict):
        return float(v["median"])
    return float(v) if isinstance(v, int | float) else None


def targets(contenders: dict[str, Any]) -> list[dict[str, Any]]:
    """Ratios of medians against the reference (and transport-matched rows without a target)."""
    rows: list[dict[str, Any]] = []

    def add(name: str, base: str, key: str, op: str | None, limit: float | None) -> None:
        if name not in contenders or base not in contenders:
            return
        a, b = _med(contenders[name], key), _med(contenders[base], key)
        if a is None or not b:
            return
        ratio = a / b
        met = None if op is None or limit is None else (ratio >= limit if op == ">=" else ratio <= limit)
        rows.append(
            {
                "contender": name,
                "baseline": base,
                "metric": key,
                "ratio": round(ratio, 3),
                "target": f"{op} {limit}" if op else None,
                "met": met,
            }
        )

    for name in ("iac-tls", "iac-unix"):
        add(name, REFERENCE, "requests_per_s_at_64", ">=", 1.5)
        add(name, REFERENCE, "rtt_p50_us", "<=", 0.8)
    for name in QUIC_BACKEND:
        add(name, REFERENCE, "requests_per_s_at_64", ">=", 1.0)
        add(name, REFERENCE, "rtt_p50_us", "<=", 1.0)
    for name in IAC:
        for base in HTTP_BASELINES:
            add(name, base, "bytes_per_request", "<=", 0.4)
    for name, base in (
        ("iac-tls", "http-ed25519-tls"),
        ("iac-unix", "http-ed25519-unix"),
        ("iac-tls", "grpc"),
    ):
        for key in ("requests_per_s_at_64", "rtt_p50_us", "bytes_per_request"):
            add(name, base, key, None, None)
    for name in IAC:  # CPU time is the figure a loaded machine disturbs least
        add(name, REFERENCE, "cpu_us_per_request_at_64", None, None)
    return rows


def profile_summary(path: str, name: str, top: int = 25) -> dict[str, Any]:
    """Where the profiled server's CPU went. Waiting in epoll is idle time (the server sits idle
    while other contenders run): it is left out, and shares are of the busy time."""
    import pstats

    if not Path(path).exists():
        return {"server": name, "error": "no profile written"}
    st = pstats.Stats(path)
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    raw = {k: v for k, v in raw.items() if not (k[0] == "~" and "poll" in k[2])}
    busy = sum(v[2] for v in raw.values()) or 1.0

    def row(key: Any, v: Any) -> dict[str, Any]:
        fn, line, func = key
        return {
            "function": f"{_module(fn)}:{line}({func})",
            "calls": v[1],
            "tottime_s": round(v[2], 4),
            "cumtime_s": round(v[3], 4),
            "share": round(v[2] / busy, 4),
            "cum_share": round(v[3] / busy, 4),
        }

    by_tottime = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    iac_cum = sorted(
        ((k, v) for k, v in raw.items() if _module(k[0]).startswith("iac/")), key=lambda kv: -kv[1][3]
    )[:top]
    by_module: dict[str, float] = {}
    for key, v in raw.items():
        by_module[_module(key[0])] = by_module.get(_module(key[0]), 0.0) + v[2]
    return {
        "server": name,
        "busy_s": round(busy, 3),
        "top_tottime": [row(k, v) for k, v in by_tottime],
        "top_cumtime_iac": [row(k, v) for k, v in iac_cum],
        "by_module": {
            k: round(v / busy, 4) for k, v in sorted(by_module.items(), key=lambda kv: -kv[1])[:15]
        },
    }


def _module(filename: str) -> str:
    if filename == "~":
        return "<builtin>"
    p = Path(filename)
    parts = p.parts
    for anchor in ("site-packages", "iac"):
        if anchor in parts:
            i = parts.index(anchor)
            return "/".join(parts[i + (1 if anchor == "site-packages" else 0) :])
    if "python3" in filename or "lib/python" in filename:
        return "stdlib/" + p.name
    return p.name


# --- printing ---------------------------------------------------------------------------------


def _fmt(s: dict[str, float] | None, width: int = 7, digits: int = 0) -> str:
    if not s:
        return "-"
    return f"{s['median']:>{width}.{digits}f} [{s['min']:.{digits}f}..{s['max']:.{digits}f}]"


def print_report(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(
        f"\nIAC node.request vs HTTP and gRPC, loopback, {cfg['reps']} repetitions interleaved; "
        f"per repetition {cfg['sequential_per_rep']} sequential + {cfg['concurrent_per_rep']} at "
        f"{cfg['in_flight']} in flight; median [min..max]\n"
    )
    head = (
        f"{'contender':<18} {'RTT p50 µs':>20} {'RTT p99 µs':>20} {'req/s @64':>22} "
        f"{'srv CPU µs/req':>20} {'cli CPU µs/req':>20} {'sum':>5}"
    )
    print(head)
    for name, c in report["contenders"].items():
        print(
            f"{name:<18} {_fmt(c['rtt_p50_us']):>20} {_fmt(c['rtt_p99_us']):>20} "
            f"{_fmt(c['requests_per_s_at_64']):>22} {_fmt(c['server_cpu_us_per_request_at_64']):>20} "
            f"{_fmt(c['client_cpu_us_per_request_at_64']):>20} {_n(c['cpu_us_per_request_at_64']):>5}"
        )
    print(
        f"\nBytes at the socket per request ({cfg['bytes_requests']} sequential requests after warm-up; "
        "TCP/UNIX: stream bytes both ways, QUIC: UDP payloads)\n"
    )
    cols = f"{'up':>7} {'down':>7} {'total':>7} {'setup':>7} {'IAC frames':>10}"
    print(f"{'contender':<18} {'transport':<20} {cols}")
    for name, c in report["contenders"].items():
        frames = c["iac_frame_bytes_per_request"]
        print(
            f"{name:<18} {c['transport']:<20} {_n(c['bytes_up']):>7} {_n(c['bytes_down']):>7} "
            f"{_n(c['bytes_per_request']):>7} {_n(c['setup_bytes']):>7} {_n(frames):>10}"
        )
    if report["targets"]:
        print(f"\nRatios of medians (IAC / baseline); targets against {cfg['reference']}\n")
        print(f"{'contender':<12} {'baseline':<18} {'metric':<26} {'ratio':>7} {'target':>8}  verdict")
        for t in report["targets"]:
            verdict = "-" if t["met"] is None else ("met" if t["met"] else "MISSED")
            print(
                f"{t['contender']:<12} {t['baseline']:<18} {t['metric']:<26} {t['ratio']:>7.3f} "
                f"{t['target'] or '':>8}  {verdict}"
            )
    if "profile" in report:
        p = report["profile"]
        print(
            f"\ncProfile of the {p['server']} server process ({p.get('busy_s')} s busy, epoll waits left out)"
        )
        print("  own time (tottime):")
        for row in p.get("top_tottime", [])[:20]:
            share = row["share"] * 100
            print(f"  {share:5.1f}%  {row['tottime_s']:8.3f} s  {row['calls']:>8}  {row['function']}")
        print("  IAC functions by cumulative time:")
        for row in p.get("top_cumtime_iac", [])[:20]:
            share = row["cum_share"] * 100
            print(f"  {share:5.1f}%  {row['cumtime_s']:8.3f} s  {row['calls']:>8}  {row['function']}")
        print("  by module: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in p.get("by_module", {}).items()))
    m = report["machine"]
    print(
        f"\n{m['platform']}, Python {m['python']}, {m['cpus']} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    )


def _n(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


# --- entry points -----------------------------------------------------------------------------


def serve_main(args: argparse.Namespace) -> None:
    name = args.serve
    workdir = Path(args.workdir)
    start: Callable[[], Any]
    if name in IAC:
        start = lambda: start_iac(name, workdir)  # noqa: E731
    else:
        start = lambda: baselines.start_baseline(name, workdir)  # noqa: E731
    asyncio.run(baselines.serve(start, profile=args.profile_out))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="smoke test: --count 100 --reps 3")
    ap.add_argument("--json", type=Path, help="write every number as JSON here")
    ap.add_argument("--json-only", action="store_true", help="print nothing (with --json)")
    ap.add_argument("--only", help=f"comma-separated contenders (of {', '.join(CONTENDERS)})")
    ap.add_argument("--count", type=int, help="sequential requests per repetition (4x at 64 in flight)")
    ap.add_argument("--reps", type=int, help="repetitions")
    ap.add_argument("--profile", metavar="NAME", help="run this contender's server under cProfile")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        return args
    args.count = args.count or (100 if args.quick else 500)
    args.reps = args.reps or (3 if args.quick else 7)
    if not 1 <= args.count <= 100_000 or not 1 <= args.reps <= 100:
        ap.error("--count must be in 1..100000 and --reps in 1..100")
    args.only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else list(CONTENDERS)
    unknown = [n for n in args.only if n not in CONTENDERS]
    if unknown:
        ap.error(f"unknown contender(s) {unknown}; choose from {', '.join(CONTENDERS)}")
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
        print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
