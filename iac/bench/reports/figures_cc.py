"""The README section ``cc`` (``figures.py``): the congestion-control scenario of a
``<date>-iac-bench-cc.json`` results file (``iac bench --only cc``) -- goodput and request p99
per setting and contender, the targets with their verdicts, the sharing runs. Every figure is
computed by ``ccreport.py`` from the runs the file keeps."""

from __future__ import annotations

from typing import Any

from iac.bench.reports import ccreport
from iac.bench.reports.figures_results import Results, Sheet, section, table, verdict


def _cell(sheet: Sheet, r: Results, who: str, metric: str, f: dict[str, Any] | None, what: str) -> str:
    if f is None or f.get(what) is None:
        return "—"
    text = sheet.put(r, f"cc/{who}/{metric}/median", f[what]["median"])
    return text + (" ‡" if f["cpu_limited"] else "")


@section("cc", scenario="cc")
def render_cc(sheet: Sheet, r: Results) -> list[str]:
    out: list[str] = []
    raw = r.raw("cc")
    assert raw is not None
    agg = ccreport.aggregate(raw)
    who = list(dict.fromkeys(c for by in agg.values() for c in by))
    plan = raw["plan"]
    busy = [
        f["machine_busy_percent"] for by in agg.values() for f in by.values() if f["machine_busy_percent"]
    ]
    out.append(
        f"{plan['seconds']:g} s per run, {plan['reps']} runs per setting and contender (median shown); "
        f"shallow = {plan['shallow_bdp']:g} BDP, deep = {plan['deep_bdp']:g} BDP of queue; ‡ = CPU-limited "
        f"(a process above {plan['cpu_limit_percent']:g} % CPU in most runs)"
        + (
            f"; the whole machine was {min(busy):.0f}–{max(busy):.0f} % busy during the runs."
            if busy
            else "."
        )
    )
    for title, metric, what in (
        ("Goodput (Mbit/s)", "goodput", "goodput"),
        ("Request p99 while the bulk transfer runs (ms)", "request p99 during bulk", "p99"),
    ):
        rows = [
            [where, *(_cell(sheet, r, c, f"{metric}, {where}", by.get(c), what) for c in who)]
            for where, by in agg.items()
        ]
        out += ["", f"**{title}**", "", *table(["setting", *who], "l" + "r" * len(who), rows)]
    shares = ccreport.shares(raw)
    if shares:
        rows = []
        for sh in shares:
            key = f"cc/{sh['pair']}/sharing, {sh['setting']}"
            rows.append(
                [
                    sh["setting"],
                    sh["pair"],
                    sheet.put(r, f"{key}: first flow/median", sh["first_mbit"]),
                    sheet.put(r, f"{key}: second flow/median", sh["second_mbit"]),
                    sheet.put(r, f"{key}/min over max", sh["min_over_max"], "ratio"),
                ]
            )
        head = ["setting", "flows", "first (Mbit/s)", "second (Mbit/s)", "min / max"]
        out += ["", f"**Two flows through one bottleneck** ({plan['share_seconds']:g} s, median of "]
        out[-1] += f"{plan['share_reps']} runs)"
        out += ["", *table(head, "llrrr", rows)]
    rows = []
    for t in ccreport.target_summary(ccreport.targets(raw)):
        met = None if not t["measured"] else t["met"] == t["measured"]
        worst = "—" if t["worst"] is None else sheet.put(r, f"cc/target {t['id']}/worst", t["worst"], "ratio")
        missed = "; ".join(t["missed"]) or "—"
        left = f" ({len(t['left_out'])} CPU-limited left out)" if t["left_out"] else ""
        rows.append([t["id"], t["text"], f"{t['met']}/{t['measured']}{left}", worst, verdict(met), missed])
    head = ["", "target", "settings met", "worst", "verdict", "missed at"]
    out += ["", "**Targets** (same-run ratios of medians)", "", *table(head, "llrrll", rows)]
    return out
