"""The cc scenario's figures (``iac/bench/scenarios/cc.py``): medians per setting and contender, the
targets as same-run ratios with verdicts (a setting where a contender was CPU-limited in most runs
is left out of the targets that compare with the kernel), the suite's rows, and the plots;
``python -m iac.bench.reports.ccreport save DIR/results.json`` keeps a run in benchmarks/results/
(benchmarks/README.md, "Congestion control: results")."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import RESULTS
from iac.bench.harness.results import ratio, summarize
from iac.bench.harness.stats import median, median_of

CUBIC, BBR, RENO = "IAC-QUIC CUBIC", "IAC-QUIC BBR", "IAC-QUIC Reno"
TCP_CUBIC, TCP_BBR = "IAC-TLS/TCP cubic", "IAC-TLS/TCP bbr"
BASELINE = CUBIC


def label(s: dict[str, Any]) -> str:
    return f"{s['rate_mbit']:g} Mbit/s, {s['rtt'] * 1e3:.0f} ms, {s['loss']:.0%} loss, {s['buffer']}"


def _summary(values: list[float]) -> dict[str, Any] | None:
    return dict(summarize(values)) if values else None


def aggregate(res: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``{setting label: {contender: figures}}`` in the order the runs came."""
    raw: dict[str, dict[str, dict[str, list[Any]]]] = {}
    settings: dict[str, dict[str, Any]] = {}
    for run in res["runs"]:
        key = label(run["setting"])
        settings[key] = run["setting"]
        g = raw.setdefault(key, {}).setdefault(run["contender"], {})
        flow = run["flows"][0]
        g.setdefault("goodput", []).append(flow["goodput_mbit"])
        req = run.get("requests") or {}
        if req.get("p99_ms") is not None:
            g.setdefault("p99", []).append(req["p99_ms"])
            g.setdefault("p50", []).append(req["p50_ms"])
        if flow.get("sent_bytes"):
            g.setdefault("retrans", []).append(flow["retrans_bytes"] / flow["sent_bytes"])
        g.setdefault("cpu_limited", []).append(bool(run["cpu_limited"]))
        g.setdefault("cpu_max", []).append(max(run["cpu_percent"].values(), default=0.0))
        g.setdefault("machine", []).append(run.get("machine_busy_percent"))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for key, by in raw.items():
        for who, g in by.items():
            limited = g["cpu_limited"]
            machine = [m for m in g["machine"] if m is not None]
            out.setdefault(key, {})[who] = {
                "setting": settings[key],
                "goodput": _summary(g["goodput"]),
                "p99": _summary(g.get("p99", [])),
                "p50": _summary(g.get("p50", [])),
                "retrans_ratio": median(g["retrans"]) if g.get("retrans") else None,
                "cpu_limited": sum(limited) * 2 > len(limited),
                "cpu_limited_runs": sum(limited),
                "cpu_max_percent": max(g["cpu_max"]),
                "machine_busy_percent": median(machine) if machine else None,
            }
    return out


def shares(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Per sharing setting and pair: each flow's median goodput and the median of min/max."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in res.get("shares", []):
        groups.setdefault((label(run["setting"]), " + ".join(run["pair"])), []).append(run)
    out = []
    for (where, pair), runs in groups.items():
        a = [r["flows"][0]["goodput_mbit"] for r in runs]
        b = [r["flows"][1]["goodput_mbit"] for r in runs]
        fair = [min(x, y) / max(x, y) if max(x, y) > 0 else 0.0 for x, y in zip(a, b, strict=True)]
        out.append(
            {
                "setting": where,
                "pair": pair,
                "first_mbit": median(a),
                "second_mbit": median(b),
                "min_over_max": median(fair),
                "runs": len(runs),
                "cpu_limited_runs": sum(bool(r["cpu_limited"]) for r in runs),
            }
        )
    return out


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """Every target and guard, one entry per setting it applies to."""
    out: list[dict[str, Any]] = []

    def add(tid: str, text: str, at: str, value: float | None, limit: float, why: str = "") -> None:
        op = ">=" if ">=" in text else "<="
        why = why or ("not measured" if value is None else "")
        met = None if why or value is None else (value >= limit if op == ">=" else value <= limit)
        target = {"id": tid, "text": text, "setting": at, "value": value, "bound": limit}
        out.append({**target, "op": op, "met": met, "why": why})

    def cpu_why(*figs: dict[str, Any] | None) -> str:
        return "CPU-limited" if any(f is not None and f["cpu_limited"] for f in figs) else ""

    for where, by in aggregate(res).items():
        s = by[next(iter(by))]["setting"]
        bbr, cubic, tbbr, tcubic = (by.get(c) for c in (BBR, CUBIC, TCP_BBR, TCP_CUBIC))
        g = ratio(median_of(bbr, "goodput"), median_of(cubic, "goodput"))
        if s["rate_mbit"] == 50 and abs(s["rtt"] - 0.02) < 1e-9 and abs(s["loss"] - 0.01) < 1e-9:
            add("T1", "BBR goodput >= 2x CUBIC at 50 Mbit/s, 20 ms, 1% loss", where, g, 2.0)
        if s["buffer"] == "deep" and s["loss"] == 0:
            p = ratio(median_of(bbr, "p99"), median_of(cubic, "p99"))
            add("T2", "deep buffer, bulk + requests: request p99 BBR <= 0.5x CUBIC", where, p, 0.5)
        if s["loss"] == 0:
            add("T3", "no loss: BBR goodput >= 0.9x CUBIC", where, g, 0.9)
        k = ratio(median_of(tbbr, "goodput"), median_of(bbr, "goodput"))
        text = "kernel TCP BBR goodput <= 1.2x IAC-QUIC BBR (CPU not the limit)"
        add("T5", text, where, k, 1.2, cpu_why(bbr, tbbr))
        if s["loss"] == 0:
            kc = ratio(median_of(tcubic, "goodput"), median_of(cubic, "goodput"))
            text = "kernel cubic goodput <= 1.3x aioquic CUBIC at 0% loss"
            add("G1", text, where, kc, 1.3, cpu_why(cubic, tcubic))
        else:
            r = ratio(median_of(bbr, "retrans_ratio"), median_of(cubic, "retrans_ratio"))
            text = "BBR retransmitted share of bytes sent <= 2x CUBIC's at the same loss"
            add("G2", text, where, r, 2.0)
    for sh in shares(res):
        if sh["pair"] == f"{BBR} + {BBR}":
            why = "CPU-limited" if sh["cpu_limited_runs"] * 2 > sh["runs"] else ""
            text = "two BBR flows share within 30% (min/max >= 0.7)"
            add("T4", text, sh["setting"], sh["min_over_max"], 0.7, why)
    return out


def target_summary(found: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per target: how many settings met it, the worst value among those measured."""
    by: dict[str, list[dict[str, Any]]] = {}
    for t in found:
        by.setdefault(t["id"], []).append(t)
    out = []
    for tid, ts in sorted(by.items()):
        measured = [t for t in ts if t["met"] is not None]
        values = [t["value"] for t in measured]
        worst = None
        if values:
            worst = min(values) if ts[0]["op"] == ">=" else max(values)
        out.append(
            {
                "id": tid,
                "text": ts[0]["text"],
                "met": sum(bool(t["met"]) for t in measured),
                "measured": len(measured),
                "left_out": [t["setting"] for t in ts if t["why"] == "CPU-limited"],
                "worst": worst,
                "values": values,
                "missed": [t["setting"] for t in measured if not t["met"]],
            }
        )
    return out


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def verdict_line(t: dict[str, Any]) -> str:
    if not t["measured"]:
        return f"{t['id']} {t['text']}: not measured" + (
            f" ({len(t['left_out'])} left out)" if t["left_out"] else ""
        )
    state = "met" if t["met"] == t["measured"] else "MISSED"
    line = f"{t['id']} {t['text']}: {state} in {t['met']}/{t['measured']} settings, worst {_fmt(t['worst'])}"
    if t["missed"]:
        line += f"; missed at {'; '.join(t['missed'])}"
    if t["left_out"]:
        line += f"; left out (CPU-limited): {len(t['left_out'])}"
    return line


def fill_result(data: dict[str, Any], result: Any) -> None:
    """Rows, series and notes of the suite's ``Result`` for the cc scenario."""
    result.baseline = BASELINE
    agg = aggregate(data)
    for where, by in agg.items():
        for who, f in by.items():
            if f["goodput"] is not None:
                result.add(who, f"goodput, {where}", "Mbit/s", f["goodput"], better="higher")
            if f["p99"] is not None:
                result.add(who, f"request p99 during bulk, {where}", "ms", f["p99"])
    for sh in shares(data):
        for which in ("first", "second"):
            v = sh[f"{which}_mbit"]
            result.add(
                sh["pair"],
                f"sharing, {sh['setting']}: {which} flow",
                "Mbit/s",
                {"median": v, "min": v, "max": v, "n": sh["runs"]},
                better="higher",
                iac=False,
            )
    sizes: dict[tuple[str, str], list[float]] = {}
    for run in data["runs"]:
        size = run["flows"][0].get("datagram_bytes")
        if size is not None:
            sizes.setdefault((run["contender"], label(run["setting"])), []).append(size)
    for (who, where), values in sizes.items():
        result.add(who, f"datagram size PMTUD settled on, {where}", "B", values)
    summary = target_summary(targets(data))
    for t in summary:
        if t["worst"] is not None:
            v = t["values"]
            result.add(
                BBR,
                f"target {t['id']}: {t['text']} (worst setting)",
                "×",
                {"median": t["worst"], "min": min(v), "max": max(v), "n": len(v)},
                better="higher" if ">=" in t["text"] else "lower",
                iac=False,
            )
    for key, what in (("goodput_mbit", "goodput"), ("p99_ms", "p99")):
        result.series[key] = {w: {c: median_of(f, what) for c, f in by.items()} for w, by in agg.items()}
    plan = data["plan"]
    limited = sorted({w for w, by in agg.items() for f in by.values() if f["cpu_limited"]})
    result.notes.append(
        f"iac/bench/scenarios/cc.py: bulk transfer for {plan['seconds']:g} s per run "
        f"({plan['frame_bytes'] // 1024} KiB frames back to back), requests (one at a time, echoed) "
        "on a second connection from "
        f"{plan['warmup_s']:g} s into the transfer, through a bottleneck between two namespaces "
        f"(iac/testing/netem.py: rate limit, drop-tail queue of {plan['shallow_bdp']:g} (shallow) or "
        f"{plan['deep_bdp']:g} (deep) BDP, then delay and random loss in each direction); "
        f"{plan['reps']} runs per setting and contender, in turns; sharing: two flows at once for "
        f"{plan['share_seconds']:g} s, {plan['share_reps']} runs. Figures are medians over the runs; "
        "ratios (× baseline) are to IAC-QUIC CUBIC in the same run."
    )
    if limited:
        result.notes.append(
            f"CPU-limited (a process above {plan['cpu_limit_percent']:g} % CPU in most runs): "
            + "; ".join(limited)
        )
    for t in summary:
        result.notes.append(verdict_line(t))
    result.raw = {**data, "targets": targets(data), "target_summary": summary, "aggregate": agg}


def plots(plt: Any, sc: dict[str, Any] | None, out: Path) -> list[str]:
    """Goodput and request p99 against loss, one panel per rate and RTT, per buffer depth, drawn
    with ``plt`` (``matplotlib.pyplot``) from the cc scenario's results ``sc`` when it ran."""
    if sc is None or sc.get("status") != "ok" or not sc.get("raw"):
        return []
    agg = sc["raw"]["aggregate"]
    made = []
    figs = list(agg.values())
    rates = sorted({by[next(iter(by))]["setting"]["rate_mbit"] for by in figs})
    rtts = sorted({by[next(iter(by))]["setting"]["rtt"] for by in figs})
    buffers = sorted({by[next(iter(by))]["setting"]["buffer"] for by in figs}, reverse=True)
    contenders = list(dict.fromkeys(c for by in figs for c in by))
    for metric, ylabel, log in (
        ("goodput", "goodput (Mbit/s)", False),
        ("p99", "request p99 during bulk (ms)", True),
    ):
        for buf in buffers:
            fig, axes = plt.subplots(
                len(rates), len(rtts), figsize=(4.2 * len(rtts), 3.4 * len(rates)), squeeze=False
            )
            for i, rate in enumerate(rates):
                for j, rtt in enumerate(rtts):
                    ax = axes[i][j]
                    for who in contenders:
                        here = [by[who] for by in figs if who in by and _where(by[who]) == (rate, rtt, buf)]
                        pts = [(f["setting"]["loss"] * 100, median_of(f, metric)) for f in here]
                        if pts := sorted(p for p in pts if p[1] is not None):
                            ax.plot(*zip(*pts, strict=True), marker="o", label=who)
                    if log:
                        ax.set_yscale("log")
                    ax.set_title(f"{rate:g} Mbit/s, {rtt * 1e3:.0f} ms RTT", fontsize=9)
                    ax.set_xlabel("random loss per direction (%)")
                    ax.set_ylabel(ylabel)
                    ax.grid(True, alpha=0.3)
            axes[0][0].legend(fontsize=7)
            fig.suptitle(f"{'Goodput' if metric == 'goodput' else 'Request p99'}, {buf} buffer")
            fig.tight_layout()
            name = f"cc_{metric}_{buf}.png"
            fig.savefig(out / name, dpi=100)
            plt.close(fig)
            made.append(name)
    return made


def _where(f: dict[str, Any]) -> tuple[float, float, str]:
    """The rate, RTT and buffer of a contender's figures at a setting (a panel of :func:`plots`)."""
    s = f["setting"]
    return s["rate_mbit"], s["rtt"], s["buffer"]


def save(results_json: Path) -> Path:
    """Keep the suite's ``results.json`` of a cc run as ``benchmarks/results/<date>-iac-bench-cc.json``
    (without machine paths, as ``record.py`` keeps the suite's)."""
    from iac.bench.harness import record

    doc = json.loads(results_json.read_text(encoding="utf-8"))
    if doc.get("quick"):
        raise SystemExit("a --quick run is a smoke test, not results")
    if [s["name"] for s in doc["scenarios"]] != ["cc"]:
        raise SystemExit("expected the results of `iac bench --only cc`")
    date = dt.datetime.fromisoformat(doc["started"]).date()
    sc = doc["scenarios"][0]
    name = ((sc.get("raw") or {}).get("plan") or {}).get("name", "full")
    suffix = "" if name == "full" else f"-{name}"  # IAC_CC_PLAN=targets: ...-iac-bench-cc-targets.json
    path = RESULTS / f"{date.isoformat()}-iac-bench-cc{suffix}.json"
    if suffix:  # the plan came from the environment: say so in the command
        doc["command"] = f"IAC_CC_PLAN={name} {doc['command']}"
    # an --out directory outside the repository is a machine path: keep only that it was given
    doc["command"] = re.sub(r"(--out )/\S+", r"\1<dir>", doc["command"])
    return record.keep(record.without_samples(doc), path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("save", help="keep a full run's results.json in benchmarks/results/").add_argument("path")
    print(f"saved {save(Path(ap.parse_args(argv).path))}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
