"""Fuzz every target (or those named) for a while each: ``python -m tests.fuzz [--seconds N] [TARGET ...]``.

Each target runs under atheris (:mod:`tests.fuzz.run`) in its own process, one after the other,
for ``--seconds`` (default: ``$FUZZ_SECONDS``, else 60). The inputs libFuzzer keeps go to
``build/fuzz/<target>/`` (kept between runs, so a campaign picks up where the last one ended; the
committed corpus is read, never written), its log to ``build/fuzz/<target>.log``, and an input
that broke a bound to ``build/fuzz/crashes/``. At the end a table shows, per target, the inputs
run, the coverage when the corpus was loaded and at the end, and what broke; the exit status is 1
when something did. Copy a crash into ``tests/fuzz/corpus/<target>/`` (named ``crash-<what>``)
once it is understood, and add a regression test.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.fuzz.instrument import INSTRUMENT

ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "build" / "fuzz"
CORPUS = Path(__file__).resolve().parent / "corpus"

_STATUS = re.compile(r"^#(\d+)\s+(INITED|DONE|NEW|REDUCE|pulse)\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


@dataclass
class Result:
    target: str
    seconds: float
    execs: int = 0
    cov_start: int = 0
    ft_start: int = 0
    cov_end: int = 0
    ft_end: int = 0
    corpus: int = 0
    bounds: str = ""
    crash: str = ""
    returncode: int = 0


def read_log(target: str, log: str, seconds: float, returncode: int) -> Result:
    res = Result(target, seconds, returncode=returncode)
    for line in log.splitlines():
        m = _STATUS.match(line)
        if m:
            execs, kind, cov, ft, corp = m.groups()
            if kind == "INITED":
                res.cov_start, res.ft_start = int(cov), int(ft)
            res.execs, res.cov_end, res.ft_end, res.corpus = int(execs), int(cov), int(ft), int(corp)
        elif line.startswith("iac-fuzz:"):
            res.bounds = line.split(": ", 2)[2]
        elif "Test unit written to" in line:
            res.crash = line.rsplit(" ", 1)[1]
        elif line.startswith("Finding:") and not res.crash:
            res.crash = line
    return res


def fuzz(target: str, seconds: int, extra: list[str]) -> Result:
    work = WORK / target
    work.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "tests.fuzz.run",
        target,
        f"-max_total_time={seconds}",
        "-print_final_stats=1",
        *extra,
        str(work),
        str(CORPUS / target),
    ]
    print(f"== {target}: {seconds} s", flush=True)
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    (WORK / f"{target}.log").write_text(log, encoding="utf-8")
    res = read_log(target, log, time.monotonic() - start, proc.returncode)
    if proc.returncode:
        print("\n".join(line for line in log.splitlines()[-30:] if "Instrumenting" not in line))
    return res


def table(results: list[Result]) -> str:
    rows = [("target", "inputs", "cov start→end", "ft start→end", "corpus", "result")]
    for r in results:
        verdict = f"BROKE A BOUND: {r.crash}" if r.returncode else f"ok; {r.bounds}"
        rows.append(
            (
                r.target,
                str(r.execs),
                f"{r.cov_start}→{r.cov_end}",
                f"{r.ft_start}→{r.ft_end}",
                str(r.corpus),
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row[:5], widths, strict=True)) + "  " + row[5] for row in rows
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "targets", nargs="*", metavar="TARGET", help=f"default: all ({', '.join(INSTRUMENT)})"
    )
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS") or 60))
    parser.add_argument("--libfuzzer", action="append", default=[], metavar="OPTION", help="e.g. -jobs=2")
    args = parser.parse_args(argv)
    unknown = [t for t in args.targets if t not in INSTRUMENT]
    if unknown:
        parser.error(f"unknown targets {unknown}; targets: {', '.join(INSTRUMENT)}")
    results = [fuzz(t, args.seconds, args.libfuzzer) for t in args.targets or INSTRUMENT]
    print(table(results))
    return 1 if any(r.returncode for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
