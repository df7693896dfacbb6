"""The suite's scenarios that wrap one script or one in-process bench each (``run(ctx, res)``)."""

from __future__ import annotations

import asyncio
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from iac.bench.contenders import brokers, endpoints
from iac.bench.harness.environment import quic_name
from iac.bench.harness.results import Context, Result, interleave_async, run_script
from iac.bench.harness.stats import median
from iac.bench.reports.figures_tables import BYTES_METRIC, SIZE_ROWS
from iac.bench.scenarios.requests import oneway_between_processes


def codec_json(ctx: Context) -> dict[str, Any]:
    if "codec" not in ctx.cache:
        ctx.progress("codec.py")
        ctx.cache["codec"] = run_script(ctx, "codec.py", ["--quick"] if ctx.quick else [], 900)
    out: dict[str, Any] = ctx.cache["codec"]
    return out


def transport_json(ctx: Context, part: str) -> dict[str, Any]:
    from iac.bench.scenarios import transport

    ctx.progress(f"transport: {part}")
    return asyncio.run(transport.run(ctx.quick, part))


# --- scenarios ----------------------------------------------------------------------------------


def sc_codec(ctx: Context, res: Result) -> None:
    data = codec_json(ctx)
    sp = data["speed"]["us_per_msg"]
    res.baseline = "bare PyNaCl Ed25519"
    for metric, codec, bare in (
        ("send: encode vs sign", "encode", "sign"),
        ("receive: decode vs verify", "decode", "verify"),
    ):
        res.add("IAC codec", f"{metric} (µs/msg)", "µs", sp[codec], iac=True)
        res.add("bare PyNaCl Ed25519", f"{metric} (µs/msg)", "µs", sp[bare], iac=False)
    s = data["speed"]
    res.notes.append(
        f"{data['speed']['messages']} messages x {data['speed']['repetitions']} repetitions; "
        f"codec ratio (t_sign+t_verify)/(t_encode+t_decode) = {s['ratio']:.3f} "
        f"[{s['ratio_min']:.3f} .. {s['ratio_max']:.3f}] (target >= 0.80)"
    )
    res.raw = data


def sc_bytes(ctx: Context, res: Result) -> None:
    data = codec_json(ctx)
    res.baseline = SIZE_ROWS["http_json_sha256"]
    for key, name in SIZE_ROWS.items():  # the rows the report shows beside codec.py's own
        res.add(name, BYTES_METRIC, "B", [data["sizes"]["rows"][key]["mean"]])
    res.notes.append(
        "Frame bytes as sent (signed Message + frame header), each message compressed alone; HTTP is "
        "the request line, four headers and the JSON body (a lower bound: real clients add headers). "
        "TLS/QUIC/TCP/IP overhead is in neither; the `loss` scenario counts whole IP packets at 0 % "
        "loss, and `requests` counts IAC frames both ways per request."
    )
    res.raw = data["sizes"]


def sc_rtt(ctx: Context, res: Result) -> None:
    data = transport_json(ctx, "rtt")["rtt"]
    res.baseline = "bare aioquic echo"
    for who, c in data["cases"].items():
        base = "bare TLS echo" if who in ("IAC-TLS", "IAC-UNIX") else "bare aioquic echo"
        res.add(who, "RTT p50, 1 in flight", "µs", c["p50_us"], baseline=base)
        res.add(who, "RTT p99, 1 in flight", "µs", c["p99_us"], baseline=base)
        res.add(who, "requests/s, 64 in flight", "req/s", c["rps_64"], better="higher", baseline=base)
    res.notes.append(
        f"scenarios/transport.py, part rtt: {data['rounds']} rounds x "
        f"{data['round_trips_per_round']} round trips and {data['requests_per_round_at_64']} "
        "requests at 64 in flight; one process, one event loop. "
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
        "scenarios/transport.py, part handshake: start of dial to the server's first delivered "
        f"message, {data['dials_per_case']} dials per case; 20 ms RTT through the UDP relay / TCP "
        "delay proxy. "
        f"0-RTT dials that resumed: {data.get('resumed')}. Targets: 0-RTT <= 0.6 x 1-RTT, "
        "QUIC 1-RTT <= 0.75 x TLS/TCP (at 20 ms)."
    )
    res.raw = data


def sc_oneway(ctx: Context, res: Result) -> None:
    data = transport_json(ctx, "oneway")["oneway"]
    base = "receiver decode-only (codec)"
    res.baseline = base
    res.add(base, "messages/s", "msg/s", data["decode_rate"], better="higher", iac=False)
    for how, key in (("signed ahead", "presigned"), ("signing in loop", "signing")):
        rate = data[f"oneway_{key}_rate"]
        res.add(f"IAC-QUIC one-way, {how}", "messages/s", "msg/s", rate, better="higher")
    res.notes.append(
        f"scenarios/transport.py, part oneway: {data['messages_per_round']} messages per round, "
        "one process. Target: one-way >= 0.5 x the decode-only rate."
    )
    res.raw = data
    oneway_between_processes(ctx, res)


#: What each broadcast contender secures (all on UNIX sockets or loopback TCP, none encrypted).
_IAC_LOCAL = "encryption: none (local socket); per-message authentication: Ed25519, replay check"
BROADCAST_SECURES = {
    "IAC broadcast (mesh flood)": _IAC_LOCAL,
    "IAC fan-out (N-1 sends)": _IAC_LOCAL,
    "HTTP+Ed25519 JSON fan-out": "encryption: none; per-message authentication: Ed25519",
    "HTTP+JSON+SHA-256 fan-out": "encryption: none; per-message authentication: SHA-256 + shared password",
    "NATS+Ed25519 subject fan-out": "encryption: none; per-message authentication: Ed25519",
    "NATS subject fan-out": "encryption: none; per-message authentication: none",
}


def sc_broadcast(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import mesh

    sizes, rounds = ((10,), 5) if ctx.quick else ((10, 50, 100), 25)
    res.raw = {"sizes": list(sizes), "rounds": rounds, "links": {}}
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
                steps, rounds, warmup, lambda r: ctx.progress(f"{n} agents: round {r + 1}/{rounds}")
            )
            for label in sent:  # the first entries are the warm-ups
                sent[label] = sent[label][warmup:]
            return figs, sent, len(bench.edges)
        finally:
            await bench.close()
            shutil.rmtree(work, ignore_errors=True)

    base = mesh.HTTP_ED25519 if endpoints.have_aiohttp() else mesh.IAC_FANOUT
    res.baseline = base
    for n in sizes:
        figs, sent, links = asyncio.run(one_size(n))
        res.raw["links"][str(n)] = links
        for label, values in figs.items():
            res.add(label, f"completion, {n} agents", "ms", values, secures=BROADCAST_SECURES.get(label))
            series.setdefault(label, {})[str(n)] = median(values)
        metric = f"IAC frame bytes sent per broadcast, all agents, {n} agents"
        for label, values in sent.items():
            if values:
                res.add(label, metric, "B", values, baseline=mesh.IAC_FANOUT)
    res.series["completion_vs_agents_ms"] = series
    if base != mesh.HTTP_ED25519:
        res.notes.append("No HTTP baselines: aiohttp is not installed; IAC fan-out is the baseline.")
    res.notes.append(
        "Completion = from the origin's first call to the handler of the last of the N-1 other agents, "
        'all in this process on UNIX sockets (benchmarks/README.md, "Broadcast"); graph: '
        + ", ".join(f"{n} agents {k} links" for n, k in res.raw["links"].items())
        + f"; {rounds} rounds after 2 warm-ups, turns A B … B A."
    )
    why = brokers.missing("nats")
    if why:
        res.skipped.update({mesh.NATS_ED25519: why, mesh.NATS_FANOUT: why})


def sc_filetransfer(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import filetransfer
    from iac.transport.quic.pmtud import DEFAULT_MAX_PLPMTU

    mib, rounds = (8, 3) if ctx.quick else (48, 5)
    work = Path(tempfile.mkdtemp(prefix="files-", dir=ctx.tmp))  # private: it holds UNIX sockets
    src = filetransfer.make_file(work / "payload.bin", mib)
    base = "bare aioquic, one stream"
    res.baseline = base
    steps: dict[str, Callable[[], Awaitable[float]]] = {}

    reports: dict[str, dict[str, list[float]]] = {}

    def over(
        url: str, backend: str | None = None, link: dict[str, Any] | None = None, label: str = ""
    ) -> Callable[[], Awaitable[float]]:
        report = reports.setdefault(label, {}) if label else None
        return lambda: filetransfer.bench_iac_file(
            src, work, url, None, backend=backend, link=link, report=report
        )

    def bare(lib: str, datagram: int = 1200) -> Callable[[], Awaitable[float]]:
        return lambda: filetransfer.bench_bare_aioquic(src, work, lib, datagram)

    steps[base] = bare("aioquic")
    for size in (1472, DEFAULT_MAX_PLPMTU):  # a 1,500-byte path's, and loopback's (the default ceiling)
        steps[f"{base}, {size:,}-byte datagrams"] = bare("aioquic", size)

    bases: dict[str, str] = {}
    for b in ctx.backends:
        label = f"{quic_name(b)} send_file"
        steps[label] = over("quic://127.0.0.1:0", b, label=label)
        if b == "aioquic":  # the link mechanisms on and off; compared with bare aioquic, same datagrams
            bases[label] = f"{base}, {DEFAULT_MAX_PLPMTU:,}-byte datagrams"
            for suffix, link in filetransfer.LINK_VARIANTS.items():
                steps[f"{label}, {suffix}"] = over("quic://127.0.0.1:0", b, link, label=f"{label}, {suffix}")
                if "quic_max_datagram_size" in link:
                    bases[f"{label}, {suffix}"] = f"{base}, {link['quic_max_datagram_size']:,}-byte datagrams"
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
    for label, report in reports.items():
        if report.get("datagram_bytes"):
            res.add(label, "datagram size PMTUD settled on", "B", report["datagram_bytes"])
            res.add(label, "CPU s per MB, both ends", "s", report["cpu_s_per_mb"])
            if report.get("ack_frames_per_mb"):
                res.add(label, "ACK frames the sender processed per MB", "", report["ack_frames_per_mb"])
            trains, segments = sum(report["gso_trains"]), sum(report["gso_segments"])
            if trains:
                res.add(label, "datagrams per GSO sendmsg", "datagrams", [segments / trains])
    res.raw = {"file_mib": mib, "rounds": rounds, "mb_s": figs, "link": reports}
    res.notes.append(
        f"One {mib} MiB file of seeded random bytes per turn on loopback, {rounds} rounds after a warm-up, "
        "turns A B … B A; MB/s = 10^6 bytes/s to the receiver's confirmation (benchmarks/README.md, "
        '"File transfer").'
    )


def sc_loss(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import loss

    out = loss.run_loss(loss.QUICK_PLAN if ctx.quick else loss.FULL_PLAN, ctx.progress)
    if out["status"] != "ok":
        res.status, res.reason = "skipped", out["reason"]
        return
    loss.loss_rows(res, out)


def sc_cc(ctx: Context, res: Result) -> None:
    from iac.bench.reports import ccreport
    from iac.bench.scenarios import cc

    plan = cc.QUICK_PLAN if ctx.quick else cc.plan_named(os.environ.get("IAC_CC_PLAN", "full"))
    out = cc.run_cc(plan, ctx.progress)
    if out["status"] != "ok":
        res.status, res.reason = "skipped", out["reason"]
        return
    ccreport.fill_result(out, res)


def sc_a2a(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import a2a_calls

    a2a_calls.scenario(ctx, res)


def sc_reconnect(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import reconnect

    reconnect.scenario(ctx, res)


def sc_scale(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import scale

    scale.scenario(ctx, res, run_script)


def sc_nat(ctx: Context, res: Result) -> None:
    from iac.bench.scenarios import nat

    nat.scenario(ctx, res, run_script)
