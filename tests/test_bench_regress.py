"""iac/bench/scenarios/regress.py's verdicts: a figure is within the earlier commit's run-to-run range (or
1 % of it), or beyond its best or its worst in the metric's direction; CPU per request is held to
after ÷ before ≤ 1.05, with the baselines' own ratio beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from iac.bench.scenarios.regress import compare, cpu_summary, verdict

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("before", "after", "better", "expect"),
    [
        ([10.0, 12.0, 11.0], 11.5, "lower", "within"),
        ([10.0, 12.0, 11.0], 12.0, "lower", "within"),  # the range's ends are in it
        ([10.0, 12.0, 11.0], 13.0, "lower", "worse"),
        ([10.0, 12.0, 11.0], 9.0, "lower", "better"),
        ([10.0, 12.0, 11.0], 13.0, "higher", "better"),
        ([10.0, 12.0, 11.0], 9.0, "higher", "worse"),
        ([326.0, 327.0], 328.0, "lower", "within"),  # 0.3 % off a tight range: within 1 %
        ([326.0, 327.0], 331.0, "lower", "worse"),
    ],
)
def test_verdict(before: list[float], after: float, better: str, expect: str) -> None:
    assert verdict(before, after, better) == expect


def results(cpu_iac: float, cpu_http: float, extra: bool = False) -> dict[str, Any]:
    def row(contender: str, metric: str, median: float, iac: bool) -> dict[str, Any]:
        return {"contender": contender, "metric": metric, "median": median, "unit": "µs", "better": "lower",
                "iac": iac}  # fmt: skip

    rows = [
        row("IAC-TLS/TCP", "server CPU per request, 64 in flight", cpu_iac, True),
        row("HTTP+Ed25519 JSON", "server CPU per request, 64 in flight", cpu_http, False),
    ]
    if extra:  # a figure only one side has is left out
        rows.append(row("IAC-TLS/TCP", "a new figure", 1.0, True))
    failed = {"name": "loss", "status": "failed"}  # a scenario that failed gives no figures
    return {"scenarios": [{"name": "cpu", "status": "ok", "rows": rows}, failed]}


def test_compare_and_the_cpu_target() -> None:
    runs = {
        "before": [results(100.0, 120.0), results(102.0, 122.0), results(101.0, 121.0)],
        "after": [results(104.0, 121.0, extra=True), results(106.0, 120.0), results(105.0, 119.0)],
    }
    rows = compare(runs)
    assert [(r["contender"], r["verdict"]) for r in rows] == [
        ("IAC-TLS/TCP", "worse"),
        ("HTTP+Ed25519 JSON", "within"),
    ]
    iac = rows[0]
    assert iac["before"] == [100.0, 102.0, 101.0] and iac["after_median"] == 105.0
    assert iac["ratio"] == pytest.approx(105 / 101)
    cpu = cpu_summary(rows)
    assert cpu["met"]  # 1.04 <= 1.05
    assert cpu["baselines_median_ratio"] == pytest.approx(120 / 121)
    runs["after"] = [results(107.0, 121.0)] * 3
    assert not cpu_summary(compare(runs))["met"]  # 1.06
