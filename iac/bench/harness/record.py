"""Run one benchmark command and keep its results as ``benchmarks/results/<UTC date>-<name>.json``
(``python -m iac.bench.harness.record NAME [ARGS…]``; benchmarks/README.md, "Refreshing the
figures" and "results.json", says what is kept): the suite's ``results.json`` without its plot
samples, or a script's JSON wrapped with the command, the start, the environment and the commit,
machine paths removed."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from iac.bench.harness.environment import environment, git
from iac.bench.harness.paths import RESULTS, ROOT

EXCLUDE = ":(exclude)benchmarks/results"  # git_dirty: the results files are not the code
SCRATCH = Path("bench-results")  # relative to ROOT, where every command runs
SCHEMA = "iac-bench-record/1"
#: Plot samples of the suite's results.json that are not kept (the medians and ranges are).
SAMPLE_SERIES = ("latency_cdf_us", "latency_cdf_ms_at_max_loss")
SCRIPTS = ("node", "mesh", "codec", "nat", "scaleout", "roundtrip", "flood", "regress")
NAMES = ("iac-bench", *SCRIPTS)


def file_name(name: str, date: dt.date) -> str:
    """``2026-12-01-iac-bench.json`` or ``2026-12-01-benchmarks-node.json``."""
    stem = name if name == "iac-bench" else f"benchmarks-{name}"
    return f"{date.isoformat()}-{stem}.json"


def git_dirty() -> bool | None:
    """Whether tracked files under ``iac/`` or ``benchmarks/`` (results aside) differ from ``HEAD``;
    None if unknown."""
    r = git("--no-optional-locks", "status", "--porcelain", "-uno", "--", "iac", "benchmarks", EXCLUDE)
    return bool(r.stdout.strip()) if r is not None and r.returncode == 0 else None


def record_suite(extra: list[str]) -> dict[str, Any]:
    out = SCRATCH / "suite"
    argv = [sys.executable, "-m", "iac", "bench", "--out", str(out), *extra]
    rc = subprocess.run(argv, cwd=ROOT, check=False).returncode
    doc: dict[str, Any] = json.loads((ROOT / out / "results.json").read_text(encoding="utf-8"))
    if rc != 0:
        print(f"iac bench exited with {rc}; its results.json is kept as it is", file=sys.stderr)
    return without_samples(doc)


def without_samples(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without the plot samples of :data:`SAMPLE_SERIES`, which it lists under ``left_out``."""
    left_out = []
    for sc in doc["scenarios"]:
        for name in SAMPLE_SERIES:
            if sc["series"].pop(name, None) is not None:
                left_out.append(f"scenarios[{sc['name']}].series.{name}")
    if left_out:
        doc["left_out"] = left_out
    return doc


def without_paths(text: str) -> str:
    """``text`` with this machine's directories (tracebacks in a failed scenario's reason name
    files) replaced by ``<python>``, ``<venv>`` or made relative to the repository."""
    text = text.replace(str(ROOT) + "/", "")
    for prefix, name in ((sys.prefix, "<venv>"), (sys.base_prefix, "<python>"), (str(Path.home()), "~")):
        if len(prefix) > 1:
            text = text.replace(prefix + "/", name + "/")
    return text


def record_script(name: str, extra: list[str]) -> dict[str, Any]:
    out = SCRATCH / f"{name}.json"
    command = ["python", "-m", f"iac.bench.scenarios.{name}", *extra, "--json", str(out)]
    env = environment()
    env["git_dirty"] = git_dirty()
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    (ROOT / SCRATCH).mkdir(parents=True, exist_ok=True)
    rc = subprocess.run([sys.executable, *command[1:]], cwd=ROOT, check=False).returncode
    if rc != 0:
        raise SystemExit(f"{shlex.join(command)} failed with exit status {rc}; nothing recorded")
    return {
        "schema": SCHEMA,
        "command": shlex.join(command),
        "started": started.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "environment": env,
        "result": json.loads((ROOT / out).read_text(encoding="utf-8")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    ap.add_argument("name", choices=NAMES, help="the command to run")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="passed on to the command")
    args = ap.parse_args(argv)
    if "--quick" in args.args:
        ap.error("--quick runs are smoke tests, not results; run the command itself")
    doc = record_suite(args.args) if args.name == "iac-bench" else record_script(args.name, args.args)
    date = dt.datetime.fromisoformat(doc["started"]).date()
    path = keep(doc, RESULTS / file_name(args.name, date))
    print(f"recorded {path.relative_to(ROOT)}", file=sys.stderr)
    return 0


def keep(doc: dict[str, Any], path: Path) -> Path:
    """Write ``doc`` to ``path`` (in ``benchmarks/results/``) without machine paths, whole or not at all."""
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(without_paths(json.dumps(doc, indent=1, ensure_ascii=False)) + "\n", encoding="utf-8")
    shutil.move(tmp, path)
    return path


if __name__ == "__main__":
    sys.exit(main())
