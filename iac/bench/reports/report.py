"""The suite's own report from its results document: the headline, Markdown and plots."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from iac.bench.reports import ccreport
from iac.bench.reports.figures_results import Results, Sheet
from iac.bench.reports.figures_results import headline as headline
from iac.bench.reports.figures_tables import scenario_table, suite_headline


def headline_markdown(doc: dict[str, Any]) -> list[str]:
    """The run's headline table, as ``RESULTS.md`` shows it."""
    return (
        ["", "## Headline", "", *suite_headline(Sheet(), Results("results.json", doc))]
        if headline(doc)
        else []
    )


def markdown(doc: dict[str, Any]) -> str:
    """``report.md``: the run's environment, its headline and every scenario's rows, in the
    tables ``RESULTS.md`` shows."""
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
    res, sheet = Results("results.json", doc), Sheet()
    for sc in doc["scenarios"]:
        lines += ["", f"## {sc['name']} — {sc['title']}", ""]
        if sc["status"] != "ok":
            lines.append(f"**{sc['status']}**: {sc['reason']}")
            continue
        lines += [*scenario_table(sheet, res, sc["name"]), *secures_lines(sc)]
        for note in sc["notes"]:
            lines += ["", f"* {note}"]
    if doc.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{p}]({p})" for p in doc["plots"]]
    return "\n".join(lines) + "\n"


def secures_lines(sc: dict[str, Any]) -> list[str]:
    """What each contender of ``sc`` secures, and the contenders skipped here and why."""
    seen: dict[str, str] = {}
    for r in sc["rows"]:
        if r.get("secures"):
            seen.setdefault(r["contender"], r["secures"])
    lines = [f"* **{who}** — {what}" for who, what in seen.items()]
    lines += [f"* **{who}** — skipped: {why}" for who, why in sc.get("skipped", {}).items()]
    return ["", "What each contender secures:", "", *lines] if lines else []


#: Plot data: (label, x values, y values) per line.
Lines = Iterable[tuple[str, Sequence[float], Sequence[float]]]


def cdf(series: dict[str, list[float]]) -> Lines:
    for name, xs in series.items():
        yield name, sorted(xs), [(i + 1) / len(xs) for i in range(len(xs))]


def by_x(series: dict[str, dict[str, float]]) -> Lines:
    """Points keyed by their x (``"16"``, or ``"3%"`` for a loss level), in the order of x."""
    for name, pts in series.items():
        xs = sorted(pts, key=lambda k: float(k.rstrip("%")))
        yield name, [float(x.rstrip("%")) for x in xs], [pts[x] for x in xs]


#: The plots: (scenario, series, file, title, x label, y label, lines of the series, x scale,
#: marker).
PLOTS: tuple[tuple[str, str, str, str, str, str, Any, dict[str, Any] | None, str | None], ...] = (
    ("requests", "latency_cdf_us", "latency_cdf.png", "Latency CDF",
     "RTT (µs), 1 in flight, loopback", "fraction of requests", cdf, {"value": "log"}, None),
    ("requests", "rps_vs_in_flight", "rps_vs_in_flight.png", "Requests/s vs in-flight (loopback)",
     "requests in flight", "requests/s", by_x, {"value": "log", "base": 2}, "o"),
    ("broadcast", "completion_vs_agents_ms", "broadcast_completion.png",
     "Broadcast completion vs agents (one process, UNIX sockets)", "agents",
     "completion (ms), last agent reached", by_x, None, "o"),
    ("loss", "p99_vs_loss_ms", "p99_vs_loss.png", "p99 vs loss, 64 concurrent requests, 20 ms RTT",
     "packet loss per direction (%)", "p99 latency (ms)", by_x, None, "o"),
    ("loss", "latency_cdf_ms_at_max_loss", "loss_latency_cdf.png",
     "Latency CDF at the highest loss", "latency (ms)", "fraction of requests", cdf, None, None),
    ("smoke", "per_round_us", "smoke_rounds.png", "Smoke test: µs per message per round",
     "round", "µs per message", by_x, None, "o"),
)  # fmt: skip


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
    for name, key, fname, title, xlabel, ylabel, lines, xscale, marker in PLOTS:
        series = by.get(name, {}).get("series", {}).get(key)
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, xs, ys in lines(series):
            ax.plot(xs, ys, marker=marker, label=label)
        if xscale:
            ax.set_xscale(**xscale)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        made.append(fname)
    return made + ccreport.plots(plt, by.get("cc"), out)
