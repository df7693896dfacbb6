"""The README sections ``roundtrip``, ``scaleout``, ``flood`` and ``regress`` (``figures.py``): the
per-request path with both nodes in one process (``iac/bench/scenarios/roundtrip.py``), one identity served
by one or two processes sharing the replay store and nonce cache (``iac/bench/scenarios/scaleout.py``), an
honest peer under a flood (``iac/bench/scenarios/flood.py``), and the suite's figures on an earlier commit
and on this one (``iac/bench/scenarios/regress.py``)."""

from __future__ import annotations

from typing import Any

from iac.bench.harness.stats import median
from iac.bench.reports.figures_results import Results, Sheet, section, table


@section("roundtrip")
def render_roundtrip(sheet: Sheet, r: Results) -> list[str]:
    d = r.data
    c, cfg = d["contenders"], d["config"]
    rows = []
    for name, v in c.items():  # in the order roundtrip.py's MATRIX ran them
        rows.append(
            [
                f"`{name}`",
                *(sheet.put(r, f"{name}/{k}", v[f"{k}_median"]) for k in ("cpu_us_1", "cpu_us_64")),
                sheet.put(r, f"{name}/rps_64", v["rps_64_median"]) if "rps_64_median" in v else "—",
                *(sheet.put(r, f"{name}/{k}", v[k]) for k in ("loop_turns", "python_calls")),
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
    out = [
        head,
        "",
        *table(cols, "lrrrrrr", rows),
        "",
        "CPU per round trip: " + "; ".join(ratios) + ".",
    ]
    counted = d.get("instructions") or {}
    if counted:
        n = cfg["callgrind_counts"]
        figs = ", ".join(
            f"`{k}` {sheet.put(r, f'{k}/instructions', v, 'millions')}" for k, v in counted.items()
        )
        out += [
            "",
            f"Instructions per round trip at 1 in flight (callgrind: a run of {n[1]} round trips less "
            f"one of {n[0]}, over {n[1] - n[0]}): {figs}.",
        ]
    return out


@section("scaleout")
def render_scaleout(sheet: Sheet, r: Results) -> list[str]:
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
        f"{cfg['reps']} repetitions, {cfg['count_per_client']} requests per client process at "
        f"{cfg['in_flight']} in flight; two-process calibration scaling per repetition: {scaling} "
        "(valid: ≥ 1.8).",
        "",
        *table(["", "requests/s, all", "requests/s, valid", "server CPU µs/request"], "lrrr", rows),
        "",
        f"Two processes over one, both on the shared store: **{two}×** the requests/s. "
        f"Server CPU per request with the shared SQLite store over the in-memory one: **{shared}×**.",
    ]


@section("flood")
def render_flood(sheet: Sheet, r: Results) -> list[str]:
    """``iac/bench/scenarios/flood.py``: the honest peer's p50 with and without the flood, per case."""
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


def _regress_shown(row: dict[str, Any]) -> bool:
    """The figures that must not regress: IAC's CPU and bytes per request, set-up, p99 under loss,
    broadcast completion, file-transfer MB/s."""
    if not row["iac"]:
        return False
    scenario, metric = row["scenario"], row["metric"]
    if scenario == "loss":
        return bool("p99" in metric)
    if scenario == "broadcast":
        return bool(metric.startswith("completion"))
    return True


@section("regress")
def render_regress(sheet: Sheet, r: Results) -> list[str]:
    """``iac/bench/scenarios/regress.py``: before and after, per figure, with the verdict."""
    d = r.data
    cfg = d["config"]
    # The unchanged baselines' own after ÷ before, per (scenario, metric): how far the machine moved.
    drifts: dict[tuple[str, str], list[float]] = {}
    for x in d["rows"]:
        if not x["iac"] and x["ratio"] is not None:
            drifts.setdefault((x["scenario"], x["metric"]), []).append(x["ratio"])
    rows = []
    for row in (x for x in d["rows"] if _regress_shown(x)):
        key = f"regress/{row['scenario']}/{row['contender']}/{row['metric']}"
        drift = drifts.get((row["scenario"], row["metric"]))
        rows.append(
            [
                row["scenario"],
                row["contender"],
                row["metric"],
                sheet.put(r, f"{key}/before", row["before_median"]),
                sheet.put(r, f"{key}/after", row["after_median"]),
                sheet.put(r, f"{key}/ratio", row["ratio"], "ratio") if row["ratio"] is not None else "—",
                sheet.put(r, f"{key}/drift", median(drift), "ratio") if drift else "—",
                row["verdict"] if row["verdict"] != "worse" else "**worse**",
            ]
        )
    cols = ["scenario", "contender", "metric", "before", "after", "after ÷ before", "baselines' ÷", "verdict"]
    cpu = d["cpu"]
    worst = max(cpu["iac"].values(), default=None)
    drift = cpu["baselines_median_ratio"]
    return [
        f"Before: commit `{cfg['before'][:7]}`; after: the commit above. {cfg['rounds']} rounds of the "
        f"suite's {', '.join(f'`{s}`' for s in cfg['scenarios'])} scenarios"
        f"{' (quick forms)' if cfg['quick'] else ''}, the two sides in turns; each figure the median "
        "of its rounds' medians. Verdict: within the before side's run-to-run range (or 1 %), or "
        "beyond its best (better) or its worst (worse). \"Baselines' ÷\": the same metric's after ÷ "
        "before for the scenario's non-IAC contenders (median), which did not change between the "
        "two sides: how far the machine itself moved.",
        "",
        *table(cols, "lllrrrrl", rows),
        "",
        f"CPU per request, after ÷ before, at most **{sheet.put(r, 'regress/cpu/worst', worst, 'ratio')}×** "
        f"(target ≤ {cpu['target']}: {'met' if cpu['met'] else '**missed**'})"
        + (
            f"; the unchanged baselines (HTTP, gRPC) moved "
            f"{sheet.put(r, 'regress/cpu/drift', drift, 'ratio')}× (median) between the two sides."
            if drift
            else "."
        ),
    ]


@section("node-floors")
def render_node_floors(sheet: Sheet, r: Results) -> list[str]:
    """``iac/bench/scenarios/node.py``: where each floor stands against the HTTP reference (the most the
    node could reach), and the node's CPU per request over its floor's."""
    d = r.data
    c, cal, ref = d["contenders"], d["calibration"], d["config"]["reference"]
    reps = cal["valid_reps"] or list(range(len(c[ref]["per_rep"]["rtt_p50_us"])))

    def over_reps(name: str, k: str) -> float:
        return float(median([c[name]["per_rep"][k][i] for i in reps]))

    rows = []
    for name in (n for n in c if n.startswith("floor-")):
        iac = "iac-" + name.removeprefix("floor-")
        p50 = over_reps(name, "rtt_p50_us") / over_reps(ref, "rtt_p50_us")
        rps = over_reps(name, "requests_per_s_at_64") / over_reps(ref, "requests_per_s_at_64")
        cpu = c[iac]["cpu_us_per_request_at_64"] / c[name]["cpu_us_per_request_at_64"]
        rows.append(
            [
                f"`{name}`",
                sheet.put(r, f"floors/{name}/p50_vs_ref", p50, "ratio"),
                sheet.put(r, f"floors/{name}/rps_vs_ref", rps, "ratio"),
                sheet.put(r, f"floors/{iac}/cpu_vs_floor", cpu, "ratio"),
            ]
        )
    which = (
        f"the {len(reps)} repetition(s) with both cores (calibration ≥ {cal['min_scaling']})"
        if cal["valid_reps"]
        else "all repetitions (none had both cores)"
    )
    cols = ["floor", f"p50 ÷ `{ref}`", f"req/s at 64 ÷ `{ref}`", "IAC CPU/request at 64 ÷ the floor's"]
    return [
        f"Floors against `{ref}` over {which}, ratios of medians; IAC's CPU per request (both "
        "sides, at 64 in flight) over its floor's, over all repetitions.",
        "",
        *table(cols, "lrrr", rows),
    ]
