"""``iac bench``: run the benchmark suite (:mod:`iac.bench`), shipped with the package.

The suite's contenders need the ``bench`` extra (``pip install 'iac[bench]'``); without it the
verb prints one line naming the extra and what is missing. The suite runs in a child process
(``python -m iac.bench``) with the same Python, so a failure there cannot take the caller down;
the verb returns its exit status.
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from iac.errors import ConfigError

#: What the ``bench`` extra installs: (import name, distribution name).
EXTRA = (
    ("aiohttp", "aiohttp"),
    ("grpc", "grpcio"),
    ("matplotlib", "matplotlib"),
    ("nats", "nats-py"),
    ("zmq", "pyzmq"),
)


def missing_extra() -> list[str]:
    """The distributions of the ``bench`` extra that are not installed."""
    return [dist for module, dist in EXTRA if importlib.util.find_spec(module) is None]


def suite_argv(args: argparse.Namespace) -> list[str]:
    """The suite's own arguments for the parsed ``iac bench`` arguments."""
    out: list[str] = []
    if args.quick:
        out.append("--quick")
    if getattr(args, "smoke", False):
        out.append("--smoke")
    for name in args.only or ():
        out += ["--only", name]
    if args.json_only:
        out.append("--json-only")
    if args.out is not None:
        out += ["--out", str(args.out)]
    if args.list:
        out.append("--list")
    return out


def scenarios() -> list[str]:
    """The scenario names the suite knows."""
    from iac.bench.main import SCENARIOS

    return [s.name for s in SCENARIOS]


def _cmd_bench(args: argparse.Namespace) -> int:
    missing = missing_extra()
    if missing:
        print(
            f"iac bench needs the bench extra ({', '.join(missing)} missing): pip install 'iac[bench]'",
            file=sys.stderr,
        )
        return 2
    if args.only:
        known = scenarios()
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
    child = [sys.executable, "-m", "iac.bench", *argv, "--command", command]
    return subprocess.run(child, check=False).returncode


def register(sub: Any) -> None:
    """Add the ``bench`` verb to the ``iac`` sub-command parsers."""
    p = sub.add_parser("bench", help="run the benchmark suite (needs the extra: pip install 'iac[bench]')")
    p.add_argument("--quick", action="store_true", help="small counts: every scenario in a few minutes")
    p.add_argument("--smoke", action="store_true", help="the harness on a tiny plan only (about a second)")
    p.add_argument("--only", action="append", metavar="NAME", help="run only this scenario (repeatable)")
    p.add_argument("--json-only", action="store_true", help="write results.json only, no progress output")
    p.add_argument("--out", default=None, help="output directory (default: ./bench-results)")
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.set_defaults(func=_cmd_bench)
