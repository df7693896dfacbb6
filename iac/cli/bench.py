"""``iac bench``: run the benchmark suite (``benchmarks/suite.py``) of a source checkout.

The suite and its scripts live in the repository's ``benchmarks/`` directory, which is not
part of the installed package. The verb finds it, in this order: ``$IAC_BENCH_DIR``, the
checkout this package was imported from (an editable install), ``./benchmarks``. It runs
the suite in a child process with the same Python, so a failure there cannot take the
caller down, and returns its exit status.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from iac.errors import ConfigError

SUITE = "suite.py"


def find_benchmarks() -> Path:
    """The ``benchmarks/`` directory holding ``suite.py``; :class:`ConfigError` when there is none."""
    candidates: list[Path] = []
    env = os.environ.get("IAC_BENCH_DIR")
    if env:
        candidates.append(Path(env))
    candidates.append(Path(__file__).resolve().parents[2] / "benchmarks")
    candidates.append(Path.cwd() / "benchmarks")
    for c in candidates:
        if (c / SUITE).is_file():
            return c
    raise ConfigError(
        "iac bench runs the benchmark suite of an IAC source checkout, and none was found: this IAC is "
        "installed without its benchmarks/ directory. Clone the repository and run `make bench` (or "
        "`iac bench`) there, or point IAC_BENCH_DIR at its benchmarks/ directory."
    )


def suite_argv(args: argparse.Namespace) -> list[str]:
    """The suite's own arguments for the parsed ``iac bench`` arguments."""
    out: list[str] = []
    if args.quick:
        out.append("--quick")
    for name in args.only or ():
        out += ["--only", name]
    if args.json_only:
        out.append("--json-only")
    if args.out is not None:
        out += ["--out", str(args.out)]
    if args.list:
        out.append("--list")
    return out


def scenarios(bench_dir: Path) -> list[str]:
    """The scenario names the suite knows (``suite.py --list``, first column)."""
    run = subprocess.run(
        [sys.executable, str(bench_dir / SUITE), "--list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if run.returncode != 0:
        raise ConfigError(
            f"{bench_dir / SUITE} --list failed (exit {run.returncode}); run it by hand to see why, or point "
            "IAC_BENCH_DIR at a working checkout's benchmarks/"
        )
    return [line.split()[0] for line in run.stdout.splitlines() if line.strip()]


def _cmd_bench(args: argparse.Namespace) -> int:
    bench_dir = find_benchmarks()
    if args.only:
        known = scenarios(bench_dir)
        bad = [name for name in args.only if name not in known]
        if bad:
            raise ConfigError(
                f"--only {' '.join(bad)}: no such scenario; choose from {', '.join(known)} "
                "(`iac bench --list` describes them)"
            )
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(
            f"--out {args.out}: is a file; give a directory for the results (created if missing)"
        )
    argv = suite_argv(args)
    command = shlex.join(["iac", "bench", *argv])
    child = [sys.executable, str(bench_dir / SUITE), *argv, "--command", command]
    return subprocess.run(child, check=False).returncode


def register(sub: Any) -> None:
    """Add the ``bench`` verb to the ``iac`` sub-command parsers."""
    p = sub.add_parser("bench", help="run the benchmark suite (needs a source checkout)")
    p.add_argument("--quick", action="store_true", help="smoke test: small counts, under 2 minutes")
    p.add_argument("--only", action="append", metavar="NAME", help="run only this scenario (repeatable)")
    p.add_argument("--json-only", action="store_true", help="write results.json only, no progress output")
    p.add_argument("--out", default=None, help="output directory (default: ./bench-results)")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.set_defaults(func=_cmd_bench)
