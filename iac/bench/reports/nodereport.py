"""The report of ``iac/bench/scenarios/node.py``: figures, targets with verdicts, and the printed tables.

Targets are ratios of medians of one run. Those that need client and server on two cores at
once (latency, requests/s, one-way rate: :data:`TWO_CORE`) use only the repetitions whose
two-process scaling was at least ``calibrate.MIN_SCALING``; with none left they are shown
with ``met: null`` and a note. CPU per request and bytes use every repetition.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from iac.bench.harness.calibrate import MIN_SCALING, PIECES
from iac.bench.harness.environment import environment
from iac.bench.harness.paths import RESULTS
from iac.bench.harness.results import summarize
from iac.bench.harness.stats import median, median_of

REFERENCE = "http-ed25519"
HTTP_BASELINES = ("http-sha256", "http-ed25519")
TWO_CORE = ("rtt_p50_us", "rtt_p99_us", "requests_per_s_at_64", "oneway_per_s")
#: A floor whose CPU per request is above this many times (primitives + echo) does more than it must.
FLOOR_SLACK = 1.15
#: Targets (op, limit) per transport.
P50_VS_FLOOR = 1.5
VS_REFERENCE = {
    "tls": ((">=", 1.6), ("<=", 0.7)),
    "unix": ((">=", 1.6), ("<=", 0.7)),
    "quic": ((">=", 1.1), ("<=", 1.0)),
}
ONEWAY_VS_DECODE = {"tls": 1.3, "unix": 1.3, "quic": 0.6}
BYTES_VS_HTTP = 0.4
CPU_VS_PREVIOUS = 1.05  # "CPU µs per request within 5 %"

#: What a contender runs over and what it secures (a floor: as the IAC contender of its transport).
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


def _summary(values: list[float], digits: int = 1) -> dict[str, float] | None:
    """The median, min and max of per-repetition ``values``, rounded."""
    return {k: round(summarize(values)[k], digits) for k in ("median", "min", "max")} if values else None


def _sum_medians(a: list[float], b: list[float]) -> float | None:
    return round(median(a) + median(b), 1) if a and b else None


def calibration(measurements: list[dict[str, Any]], reps: int) -> dict[str, Any]:
    """Per repetition: the lower scaling of the calibrations before and after it."""
    rows = []
    for i in range(reps):
        before, after = measurements[i], measurements[min(i + 1, len(measurements) - 1)]
        worse = min(before, after, key=lambda m: m["scaling"])
        scaling = worse["scaling"]
        rows.append(
            {
                "rep": i + 1,
                "scaling": scaling,
                "throughput_scaling": worse.get("throughput_scaling"),
                "cpu_share": worse.get("cpu_share"),
                "valid": scaling >= MIN_SCALING,
                "loadavg_1m": (after.get("loadavg") or {}).get("1m"),
                "busy_cores": (after.get("since_previous") or {}).get("busy_cores"),
                "steal_pct": (after.get("since_previous") or {}).get("steal_pct"),
            }
        )
    return {
        "min_scaling": MIN_SCALING,
        "reps": rows,
        "valid_reps": [r["rep"] - 1 for r in rows if r["valid"]],
        "measurements": measurements,
    }


def load_previous(path: Path | None) -> tuple[str, dict[str, Any]] | None:
    """The newest committed ``results/*-benchmarks-node.json`` (or ``path``): ``(name, contenders)``."""
    if path is None:
        files = sorted(RESULTS.glob("*-benchmarks-node.json"))
        if not files:
            return None
        path = files[-1]
    import json

    data = json.loads(path.read_text())
    data = data.get("result", data)  # iac/bench/harness/record.py wraps the script's JSON
    return path.name, data.get("contenders", {})


def build_report(
    args: Any,
    plan: Any,
    results: dict[str, Any],
    extra: Any,
    roles: dict[str, dict[str, Any]],
    n_payloads: int,
) -> dict[str, Any]:
    cal = calibration(extra.calibrations, plan.reps)
    contenders: dict[str, Any] = {}
    for name, r in results.items():
        role = roles[name]
        transport, security = TRANSPORT[role["base"].replace("floor-", "iac-")]
        if role["loop"] != "asyncio":
            transport += f", {role['loop']}"
        cpu = [s + c for s, c in zip(r.server_cpu_us, r.client_cpu_us, strict=False)]
        c: dict[str, Any] = {
            "role": role["role"],
            "loop": role["loop"],
            "transport": transport,
            "security": security,
            "rtt_p50_us": _summary(r.p50_us),
            "rtt_p99_us": _summary(r.p99_us),
            "requests_per_s_at_64": _summary(r.rps, 0),
            "server_cpu_us_per_request_at_64": _summary(r.server_cpu_us),
            "client_cpu_us_per_request_at_64": _summary(r.client_cpu_us),
            "cpu_us_per_request_at_64": _sum_medians(r.server_cpu_us, r.client_cpu_us),
            "bytes_per_request": r.wire.get("per_request"),
            "bytes_up": r.wire.get("up"),
            "bytes_down": r.wire.get("down"),
            "setup_bytes": r.wire.get("setup"),
            "iac_frame_bytes_per_request": r.wire.get("iac_frame_bytes"),
            "per_rep": {
                "rtt_p50_us": r.p50_us,
                "rtt_p99_us": r.p99_us,
                "requests_per_s_at_64": r.rps,
                "cpu_us_per_request_at_64": cpu,
            },
        }
        if role["role"] == "iac":
            c["floor"] = role["floor"]
            c["oneway_per_s"] = _summary(r.oneway_rate, 0)
            c["per_rep"]["oneway_per_s"] = r.oneway_rate
        if role["role"] == "floor":
            c["echo_requests_per_s_at_64"] = _summary(r.echo_rps, 0)
            echo = [a + b for a, b in zip(r.echo_server_cpu_us, r.echo_client_cpu_us, strict=False)]
            c["per_rep"]["echo_cpu_us_per_request_at_64"] = echo
            c["per_rep"]["primitives_in_sequence_us"] = r.primitives_us
            echo_cpu = _sum_medians(r.echo_server_cpu_us, r.echo_client_cpu_us)
            c["echo_cpu_us_per_request_at_64"] = echo_cpu
        contenders[name] = c
    prims: dict[str, Any] = {}
    for way in ("alone", "in_sequence"):
        prims[way] = {p: round(median([m[way][p] for m in extra.primitives]), 1) for p in (*PIECES, "sum")}
        prims[f"{way}_per_rep_sum_us"] = [round(m[way]["sum"], 1) for m in extra.primitives]
    decode = {"per_s": _summary(extra.decode_rates, 0), "per_rep": extra.decode_rates}
    previous = load_previous(getattr(args, "previous", None))
    report: dict[str, Any] = {
        "benchmark": "node",
        "command": "python -m iac.bench.scenarios.node " + " ".join(sys.argv[1:]),
        "machine": environment(),
        "config": {
            "sequential_per_rep": plan.count,
            "concurrent_per_rep": plan.concurrent,
            "oneway_per_rep": plan.concurrent,
            "in_flight": 64,
            "reps": plan.reps,
            "payloads": n_payloads,
            "bytes_requests": plan.bytes_requests,
            "reference": REFERENCE,
            "loop": args.loop,
        },
        "calibration": cal,
        "primitives": prims,
        "codec_decode": decode,
        "contenders": contenders,
    }
    report["floor_check"] = floor_check(contenders, prims["alone"]["sum"], cal["valid_reps"])
    report["iac_ratios"] = iac_ratios(contenders, cal["valid_reps"])
    report["previous"] = cpu_vs_previous(contenders, previous)
    report["targets"] = targets(contenders, decode["per_rep"], cal["valid_reps"], report["previous"])
    return report


# --- ratios and targets -----------------------------------------------------------------------


def ratio(
    a: dict[str, Any], b: dict[str, Any] | list[float], key: str, valid: list[int]
) -> tuple[float | None, int]:
    """The ratio of medians of ``key``, ``a`` over ``b`` (a contender, or per-repetition values).

    Returns ``(ratio, used)``. A two-core metric (:data:`TWO_CORE`) takes the valid repetitions
    only, ``used`` = how many; with none valid it takes them all and ``used`` = 0 (shown, not
    judged). Any other metric: the medians over every repetition, ``used`` = -1."""
    if key not in TWO_CORE:
        am, bm = median_of(a, key), (median_of(b, key) if isinstance(b, dict) else median(b) if b else None)
        return (am / bm, -1) if am is not None and bm else (None, -1)
    av = a.get("per_rep", {}).get(key, [])
    bv = b if isinstance(b, list) else b.get("per_rep", {}).get(key, [])
    if valid:
        av, bv = [av[i] for i in valid if i < len(av)], [bv[i] for i in valid if i < len(bv)]
    if not av or not bv or not median(bv):
        return None, 0
    return median(av) / median(bv), len(valid)


def targets(
    contenders: dict[str, Any], decode: list[float], valid: list[int], previous: dict[str, Any] | None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, base: str, key: str, op: str | None, limit: float | None, b: Any = None) -> None:
        if name not in contenders or (b is None and base not in contenders):
            return
        r, used = ratio(contenders[name], contenders[base] if b is None else b, key, valid)
        if r is None:
            return
        judged = op is not None and limit is not None and used != 0
        met = (r >= limit if op == ">=" else r <= limit) if judged and limit is not None else None
        row = {
            "contender": name,
            "baseline": base,
            "metric": key,
            "ratio": round(r, 3),
            "target": f"{op} {limit}" if op else None,
            "met": met,
        }
        if key in TWO_CORE:
            row["reps_used"] = used
            if used == 0 and op:
                row["note"] = f"not judged: no repetition had two cores (scaling >= {MIN_SCALING})"
        rows.append(row)

    iac = [n for n, c in contenders.items() if c["role"] == "iac"]
    for name in iac:
        t = _transport(name)
        add(name, contenders[name]["floor"], "rtt_p50_us", "<=", P50_VS_FLOOR)
        (op_r, lim_r), (op_p, lim_p) = VS_REFERENCE[t]
        add(name, REFERENCE, "requests_per_s_at_64", op_r, lim_r)
        add(name, REFERENCE, "rtt_p50_us", op_p, lim_p)
        add(name, "codec-decode", "oneway_per_s", ">=", ONEWAY_VS_DECODE[t], b=decode)
    for name in iac:
        for base in HTTP_BASELINES:
            add(name, base, "bytes_per_request", "<=", BYTES_VS_HTTP)
    if previous:
        for name in iac:
            p = previous["contenders"].get(name)
            if p and p.get("previous"):
                # against the reference's own change when it ran in both (the machine's drift)
                r = p["adjusted_ratio"] or p["now"] / p["previous"]
                rows.append(
                    {
                        "contender": name,
                        "baseline": "previous",
                        "metric": "cpu_us_per_request_at_64",
                        "ratio": round(r, 3),
                        "target": f"<= {CPU_VS_PREVIOUS}",
                        "met": r <= CPU_VS_PREVIOUS,
                        "previous_file": previous["file"],
                        "adjusted_by_reference": p["adjusted_ratio"] is not None,
                    }
                )
    for name, base in (
        ("iac-tls", "http-ed25519-tls"),
        ("iac-unix", "http-ed25519-unix"),
        ("iac-tls", "grpc"),
    ):
        for key in ("requests_per_s_at_64", "rtt_p50_us", "bytes_per_request"):
            add(name, base, key, None, None)
    for name in iac:  # CPU time is the figure a loaded machine disturbs least
        add(name, REFERENCE, "cpu_us_per_request_at_64", None, None)
        if name.endswith("-uvloop") and name.removesuffix("-uvloop") in contenders:
            for key in ("rtt_p50_us", "requests_per_s_at_64", "cpu_us_per_request_at_64", "oneway_per_s"):
                add(name, name.removesuffix("-uvloop"), key, None, None)
    return rows


def _transport(name: str) -> str:
    return name.split("-")[1]


#: A floor's per-repetition series that :func:`floor_check` compares.
FLOOR_SERIES = ("cpu_us_per_request_at_64", "echo_cpu_us_per_request_at_64", "primitives_in_sequence_us")


def floor_check(contenders: dict[str, Any], alone_us: float, valid: list[int]) -> list[dict[str, Any]]:
    """Each floor's CPU per request against what its work must cost: the codec primitives timed
    in sequence right before its phase, plus its echo's CPU (the transport, the loop, the
    harness), per repetition; the median of the per-repetition ratios over the valid
    repetitions (two processes on one core cost more CPU each: switches, cold caches) is the
    verdict. The ratio to the primitives timed alone (``timeit``) is shown beside it."""
    out = []
    for name, c in contenders.items():
        rep = c.get("per_rep", {})
        cpu, echo, prims = (rep.get(k, []) for k in FLOOR_SERIES)
        if c["role"] != "floor" or not cpu or not echo or not prims:
            continue
        ratios = [a / (p + e) for a, e, p in zip(cpu, echo, prims, strict=False)]
        use = [ratios[i] for i in valid if i < len(ratios)] or ratios
        r = median(use)
        out.append(
            {
                "floor": name,
                "cpu_us": c["cpu_us_per_request_at_64"],
                "primitives_alone_us": alone_us,
                "primitives_in_sequence_us": round(median(prims), 1),
                "echo_cpu_us": c["echo_cpu_us_per_request_at_64"],
                "vs_primitives_alone": round(c["cpu_us_per_request_at_64"] / alone_us, 3),
                "vs_primitives_in_sequence_and_echo": round(r, 3),
                "per_rep": [round(x, 3) for x in ratios],
                "ok": r <= FLOOR_SLACK if valid else None,
            }
        )
    return out


IAC_FIGURES = ("rtt_p50_us", "rtt_p99_us", "requests_per_s_at_64", "cpu_us_per_request_at_64")


def iac_ratios(contenders: dict[str, Any], valid: list[int]) -> dict[str, Any]:
    """Every IAC figure over its floor's and over the reference's (two-core ones: valid reps)."""
    out: dict[str, Any] = {}
    for name, c in contenders.items():
        if c["role"] != "iac":
            continue
        row: dict[str, Any] = {}
        for key in IAC_FIGURES:
            cell: dict[str, Any] = {"value": median_of(c, key)}
            for label, base in (("floor", c["floor"]), ("reference", REFERENCE)):
                if base in contenders:
                    r, _ = ratio(c, contenders[base], key, valid)
                    cell[label] = None if r is None else round(r, 3)
            row[key] = cell
        out[name] = row
    return out


def cpu_vs_previous(
    contenders: dict[str, Any], previous: tuple[str, dict[str, Any]] | None
) -> dict[str, Any] | None:
    """Every contender's CPU per request beside the previous file's, with the change; and the
    change once the machine's own drift is taken out: the reference's code did not change, so
    its ratio (now / previous) is how much the machine moved; ``adjusted`` divides by it."""
    if previous is None:
        return None
    file, prev = previous

    def ratio(name: str) -> tuple[float | None, float | None, float | None]:
        now = contenders.get(name, {}).get("cpu_us_per_request_at_64")
        before = (prev.get(name) or {}).get("cpu_us_per_request_at_64")
        return now, before, (now / before if now and before else None)

    machine = ratio(REFERENCE)[2]
    rows = {}
    for name in contenders:
        now, before, r = ratio(name)
        adjusted = r / machine if r and machine else None
        rows[name] = {
            "now": now,
            "previous": before,
            "change_pct": round((r - 1) * 100, 1) if r else None,
            "adjusted_ratio": round(adjusted, 3) if adjusted else None,
            "adjusted_change_pct": round((adjusted - 1) * 100, 1) if adjusted else None,
        }
    return {"file": file, "machine_ratio": round(machine, 3) if machine else None, "contenders": rows}


# --- cProfile ---------------------------------------------------------------------------------


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
    )
    by_module: dict[str, float] = {}
    for key, v in raw.items():
        by_module[_module(key[0])] = by_module.get(_module(key[0]), 0.0) + v[2]
    return {
        "server": name,
        "busy_s": round(busy, 3),
        "top_tottime": [row(k, v) for k, v in by_tottime],
        "top_cumtime_iac": [row(k, v) for k, v in iac_cum[:top]],
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
