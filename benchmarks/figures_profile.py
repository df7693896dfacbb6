"""The README sections ``roundtrip`` and ``scaleout`` (``figures.py``): the per-request path
with both nodes in one process (``benchmarks/roundtrip.py``), and one identity served by one
or two processes sharing the replay store and nonce cache (``benchmarks/scaleout.py``)."""

from __future__ import annotations

from pathlib import Path

from figures_results import Results, Sheet, table
from stats import median

ROUNDTRIP = (
    "iac-quic",
    "floor-quic",
    "iac-tls",
    "floor-tls",
    "iac-unix",
    "floor-unix",
    "iac-tls-thread",
    "iac-tls-signw",
)


def render_roundtrip(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    (r,) = res
    d = r.data
    c, cfg = d["contenders"], d["config"]
    rows = []
    for name in (n for n in ROUNDTRIP if n in c):
        v = c[name]
        rows.append(
            [
                f"`{name}`",
                sheet.put(r, f"{name}/cpu_us_1", v["cpu_us_1_median"]),
                sheet.put(r, f"{name}/cpu_us_64", v["cpu_us_64_median"]),
                sheet.put(r, f"{name}/rps_64", v["rps_64_median"]) if "rps_64_median" in v else "—",
                sheet.put(r, f"{name}/loop_turns", v["loop_turns"]),
                sheet.put(r, f"{name}/python_calls", v["python_calls"]),
                sheet.put(r, f"{name}/quic_transmits", v["quic_transmits"]) if "quic" in name else "—",
            ]
        )
    head = (
        f"Both ends in one process; CPU µs per round trip (both ends), median of {cfg['reps']} "
        f"repetitions of {cfg['count']} at 1 in flight and {2 * cfg['count']} at 64; counts per "
        "round trip at 1 in flight (one cProfile pass); requests/s at 64 by the wall clock."
    )
    ratios = [
        f"{k}: {sheet.put(r, f'ratio/{k}/cpu_1', v['cpu_1'], 'ratio')}× at 1 in flight, "
        f"{sheet.put(r, f'ratio/{k}/cpu_64', v['cpu_64'], 'ratio')}× at 64"
        + (
            f", requests/s at 64 {sheet.put(r, f'ratio/{k}/rps_64', v['rps_64'], 'ratio')}×"
            if "rps_64" in v
            else ""
        )
        for k, v in d["ratios"].items()
    ]
    cols = ["contender", "CPU µs @1", "CPU µs @64", "req/s @64", "loop turns", "Python calls", "QUIC flushes"]
    return [
        r.source_line(doc),
        "",
        head,
        "",
        *table(cols, "lrrrrrr", rows),
        "",
        "CPU per round trip: " + "; ".join(ratios) + ".",
    ]


def render_scaleout(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    (r,) = res
    d = r.data
    cfg = d["config"]
    scaling = ", ".join(sheet.put(r, f"scaling/{i}", s, "ratio") for i, s in enumerate(d["scaling"]))
    rows = []
    for name, v in d["contenders"].items():
        valid = v["requests_per_s_valid"]
        rows.append(
            [
                name,
                sheet.put(r, f"{name}/requests_per_s", v["requests_per_s"]),
                "—" if valid is None else sheet.put(r, f"{name}/requests_per_s_valid", valid),
                sheet.put(r, f"{name}/server_cpu_us", v["server_cpu_us_per_request"]),
            ]
        )
    two = sheet.put(r, "two_over_one", d["two_over_one"], "ratio")
    shared = sheet.put(r, "shared_over_memory_cpu", d["shared_over_memory_cpu"], "ratio")
    return [
        r.source_line(doc),
        "",
        f"{cfg['reps']} repetitions, {cfg['count_per_client']} requests per client process at "
        f"{cfg['in_flight']} in flight; two-process calibration scaling per repetition: {scaling} "
        "(valid: ≥ 1.8).",
        "",
        *table(["", "requests/s, all", "requests/s, valid", "server CPU µs/request"], "lrrr", rows),
        "",
        f"Two processes over one, both on the shared store: **{two}×** the requests/s. "
        f"Server CPU per request with the shared SQLite store over the in-memory one: **{shared}×**.",
    ]


def render_flood(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    """``benchmarks/flood.py``: the honest peer's p50 with and without the flood, per case."""
    (r,) = res
    d = r.data
    rows = []
    for case in d["cases"]:
        ms = case["handler_ms"]
        what = (
            f"{case['rate']:,.0f}/s to handlers blocking {ms:g} ms"
            if ms
            else f"{case['rate']:,.0f}/s to quick handlers"
        )
        key = f"flood/{case['rate']:g}/{ms:g}"
        quiet = median([x["p50_quiet_us"] for x in case["reps"]])
        loaded = median([x["p50_flood_us"] for x in case["reps"]])
        ratio = case["ratio_median"]
        rows.append(
            [
                what,
                sheet.put(r, f"{key}/quiet", quiet),
                sheet.put(r, f"{key}/flood", loaded),
                sheet.put(r, f"{key}/ratio", ratio, "ratio"),
                "met" if ratio <= d["target"] else "**missed**",
                f"{case['server']['handled']:,}",
                f"{case['server']['throttled']:,}",
            ]
        )
    n = len(d["cases"][0]["reps"])
    return [
        r.source_line(doc),
        "",
        f"{n} repetitions of {d['cases'][0]['seconds']:g} s each way; medians; ratio = median over "
        f"repetitions of p50 with the flood ÷ p50 without (target ≤ {d['target']:g}).",
        "",
        *table(
            ["flood", "p50 µs, quiet", "p50 µs, flood", "ratio", "verdict", "handled", "throttled"],
            "lrrrlrr",
            rows,
        ),
        "",
        "Handled: the node's handled messages over the whole run (the flood's and the honest "
        "requests); throttled: reads that waited for a peer's verify budget.",
    ]
