"""Did anything else regress? The suite's scenarios run on an earlier commit and on this tree,
in turns, on this machine, and every figure is compared with its run-to-run range.

    .venv/bin/python -m iac.bench.scenarios.regress --before e972342            # full scenarios, 3 rounds
    .venv/bin/python -m iac.bench.scenarios.regress --before e972342 --quick    # the suite's quick forms
    .venv/bin/python -m iac.bench.scenarios.regress --before e972342 --json out.json

The earlier commit runs from a temporary git worktree with this tree's virtual environment;
the verdicts (``within``, ``better``, ``worse``) and the CPU target are in
benchmarks/README.md, "Nothing else regresses"."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import ROOT
from iac.bench.harness.stats import median
from iac.bench.reports import live

SCENARIOS = ("cpu", "bytes", "setup", "loss", "broadcast", "filetransfer")
#: Where the issue's "within 5 %" applies: CPU per request, after ÷ before.
CPU_TARGET = 1.05
#: A change this small (relative) is within, whatever the before side's range.
TOLERANCE = 0.01
SIDES = ("before", "after")


def worktree(commit: str, where: Path) -> str:
    """Check ``commit`` out at ``where`` (detached); return its full hash."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), commit],
                   check=True, capture_output=True)  # fmt: skip
    out = subprocess.run(
        ["git", "-C", str(where), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def drop_worktree(where: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(where)], capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


def run_suite(tree: Path, scenarios: tuple[str, ...], quick: bool, out: Path) -> dict[str, Any]:
    """``python -m iac bench --only …`` in ``tree`` with its own library; its results.json."""
    argv = [sys.executable, "-m", "iac", "bench", "--out", str(out)]
    for s in scenarios:
        argv += ["--only", s]
    if quick:
        argv.append("--quick")
    env = dict(os.environ, PYTHONPATH=str(tree))
    subprocess.run(argv, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    return data


def figures(results: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Every row of a suite results file by (scenario, contender, metric)."""
    out = {}
    for s in results["scenarios"]:
        if s.get("status") != "ok":
            continue
        for r in s.get("rows", []):
            out[(s["name"], r["contender"], r["metric"])] = r
    return out


def verdict(before: list[float], after: float, better: str) -> str:
    lo, hi = min(before), max(before)
    mid = median(before)
    if lo <= after <= hi or abs(after - mid) <= TOLERANCE * abs(mid):
        return "within"
    higher_is_better = better == "higher"
    return "better" if (after > hi) == higher_is_better else "worse"


def compare(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per figure both sides gave in every round."""
    per_side = {side: [figures(r) for r in runs[side]] for side in SIDES}
    keys = [k for k in per_side["before"][0] if all(k in f for side in SIDES for f in per_side[side])]
    rows = []
    for key in keys:
        b = [f[key]["median"] for f in per_side["before"]]
        a = [f[key]["median"] for f in per_side["after"]]
        mb, ma = median(b), median(a)
        row = per_side["after"][0][key]
        rows.append(
            {
                "scenario": key[0],
                "contender": key[1],
                "metric": key[2],
                "unit": row["unit"],
                "better": row["better"],
                "iac": bool(row.get("iac")),
                "before": b,
                "after": a,
                "before_median": mb,
                "after_median": ma,
                "ratio": ma / mb if mb else None,
                "verdict": verdict(b, ma, row["better"]),
            }
        )
    return rows


def cpu_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """CPU per request after ÷ before: IAC contenders against the target, baselines as drift."""
    cpu = [r for r in rows if r["scenario"] == "cpu" and "CPU per request" in r["metric"]]
    drift = [r["ratio"] for r in cpu if not r["iac"] and r["ratio"]]
    iac = {f"{r['contender']} / {r['metric']}": r["ratio"] for r in cpu if r["iac"]}
    return {
        "target": CPU_TARGET,
        "iac": iac,
        "baselines_median_ratio": median(drift) if drift else None,
        "met": all(v is not None and v <= CPU_TARGET for v in iac.values()),
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    scenarios = tuple(args.only.split(",")) if args.only else SCENARIOS
    tmp = Path(tempfile.mkdtemp(prefix="iac-regress-"))
    before_tree = tmp / "before"
    started = time.time()
    try:
        commit = worktree(args.before, before_tree)
        trees = {"before": before_tree, "after": ROOT}
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for rnd in range(args.rounds):
            for side in SIDES if rnd % 2 == 0 else SIDES[::-1]:
                print(f"  .. round {rnd + 1}/{args.rounds}: {side}", file=sys.stderr, flush=True)
                runs[side].append(run_suite(trees[side], scenarios, args.quick, tmp / f"{side}-{rnd}"))
    finally:
        drop_worktree(before_tree)
        shutil.rmtree(tmp, ignore_errors=True)
    rows = compare(runs)
    return {
        "benchmark": "regress",
        "config": {
            "before": commit,
            "rounds": args.rounds,
            "quick": args.quick,
            "scenarios": list(scenarios),
        },
        "duration_s": round(time.time() - started, 1),
        "rows": rows,
        "cpu": cpu_summary(rows),
    }


def cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", help=f"comma-separated scenarios (default: {','.join(SCENARIOS)})")
    ap.add_argument("--quick", action="store_true", help="the scenarios' quick forms")
    ap.add_argument("--json", type=Path, help="write every number as JSON here")
    args = ap.parse_args()
    report = main(args)
    live.print_rendered(("regress",), "iac.bench.scenarios.regress", report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    cli()
