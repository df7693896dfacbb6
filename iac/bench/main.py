"""The IAC benchmark suite, ``iac bench`` (= ``python -m iac.bench``): every scenario, side by side
with its baselines, in one report (benchmarks/README.md, "Suite", gives the options and the method).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.bench.harness.environment import environment
from iac.bench.harness.results import SCHEMA, Context, Result
from iac.bench.reports.figures_results import fmt_num
from iac.bench.reports.report import headline, markdown, plots
from iac.bench.scenarios.catalog import (
    sc_a2a,
    sc_broadcast,
    sc_bytes,
    sc_cc,
    sc_codec,
    sc_filetransfer,
    sc_loss,
    sc_nat,
    sc_oneway,
    sc_reconnect,
    sc_rtt,
    sc_scale,
    sc_setup,
)
from iac.bench.scenarios.requests import sc_cpu, sc_requests
from iac.bench.scenarios.smoke import sc_smoke


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    run: Callable[[Context, Result], None]


SCENARIOS: list[Scenario] = [
    Scenario("codec", "Codec: encode/decode vs bare Ed25519", sc_codec),
    Scenario("bytes", "Bytes on the wire per message, with and without the dictionary", sc_bytes),
    Scenario("rtt", "Transport request/reply vs bare aioquic and TLS echoes", sc_rtt),
    Scenario("requests", "Node requests: RTT, requests/s at 1/16/64 in flight, CPU, bytes", sc_requests),
    Scenario("cpu", "CPU µs per request on each side (64 in flight)", sc_cpu),
    Scenario("setup", "Connection set-up to first delivered message", sc_setup),
    Scenario("oneway", "One-way messages/s vs the receiver's decode rate", sc_oneway),
    Scenario("loss", "64 concurrent requests under loss at 20 ms RTT", sc_loss),
    Scenario("broadcast", "Broadcast completion for N agents", sc_broadcast),
    Scenario("filetransfer", "File transfer MB/s", sc_filetransfer),
    Scenario("a2a", "A2A calls: JSON-RPC over HTTP vs the IAC binding (QUIC, TLS, UNIX)", sc_a2a),
    Scenario("reconnect", "First delivery after a reconnect through the Node API, 20 ms RTT", sc_reconnect),
    Scenario("cc", "Congestion control over a bottleneck: goodput and request p99 during bulk", sc_cc),
    Scenario("nat", "Through NATs: time to a direct path, RTT direct vs relayed, relay bytes saved", sc_nat),
    Scenario(
        "scale",
        "Scale: server RSS per peer, CPU per request, idle CPU, dial bursts, 1-10,000 peers",
        sc_scale,
    ),
    Scenario("smoke", "The harness on a tiny plan (make test): codec vs bare Ed25519, 50 messages", sc_smoke),
]
#: In a full run the ``cpu`` figures come from ``requests``; ``cpu`` alone is for ``--only cpu``;
#: ``smoke`` is the harness's own test (``--smoke``).
DEFAULT_SKIP_WHEN_ALL = {"cpu", "smoke"}


def select(only: Sequence[str] | None) -> list[Scenario]:
    if not only:
        return [s for s in SCENARIOS if s.name not in DEFAULT_SKIP_WHEN_ALL]
    known = {s.name: s for s in SCENARIOS}
    bad = [n for n in only if n not in known]
    if bad:
        raise SystemExit(f"unknown scenario {', '.join(bad)}; known: {', '.join(known)}")
    return [known[n] for n in only]


# --- runner -------------------------------------------------------------------------------------


class Progress:
    """``[i/n] scenario: what   elapsed`` lines on stderr (nothing when quiet)."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet = total, quiet
        self.t0 = time.monotonic()
        self.i, self.name = 0, ""

    def scenario(self, i: int, name: str) -> None:
        self.i, self.name = i, name
        self("start")

    def __call__(self, what: str) -> None:
        if not self.quiet:
            el = time.monotonic() - self.t0
            print(f"[{self.i}/{self.total}] {self.name}: {what}  ({el:.0f} s)", file=sys.stderr, flush=True)


def run(argv: Sequence[str] | None = None, command: str | None = None) -> int:
    ap = argparse.ArgumentParser(description="IAC benchmark suite")
    ap.add_argument("--quick", action="store_true", help="small counts: every scenario in a few minutes")
    ap.add_argument("--smoke", action="store_true", help="the harness on a tiny plan only (about a second)")
    ap.add_argument("--only", action="append", metavar="NAME", help="run this scenario (repeatable)")
    ap.add_argument("--json-only", action="store_true", help="no progress, no Markdown, no plots")
    ap.add_argument("--out", type=Path, default=Path("bench-results"), help="output directory")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)  # as the user typed it (iac bench)
    args = ap.parse_args(argv)
    if args.list:
        for s in SCENARIOS:
            print(f"{s.name:<13} {s.title}")
        return 0
    if args.smoke:
        args.only, args.quick = ["smoke"], True
    chosen = select(args.only)
    # SIGTERM ends the run through sys.exit, so finally blocks and atexit (netem.Link) clean up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.out.mkdir(parents=True, exist_ok=True)
    prog = Progress(len(chosen), args.json_only)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "command": args.command
        or command
        or shlex.join([Path(sys.executable).name, "-m", "iac.bench", *(argv or sys.argv[1:])]),
        "started": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "environment": environment(),
        "scenarios": [],
    }
    with tempfile.TemporaryDirectory(prefix="iac-bench-") as tmp:
        ctx = Context(args.quick, Path(tmp), prog, backends=doc["environment"]["quic_backends"])
        for i, sc in enumerate(chosen, 1):
            prog.scenario(i, sc.name)
            res = Result(sc.name, sc.title)
            t = time.monotonic()
            try:
                sc.run(ctx, res)
            except Exception as exc:  # one scenario failing does not stop the suite
                res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"
            res.duration_s = time.monotonic() - t
            res.finish()
            doc["scenarios"].append(res.to_json())
            prog(f"{res.status} in {res.duration_s:.1f} s")
    doc["duration_s"] = time.monotonic() - t0
    doc["plots"] = [] if args.json_only else plots(doc, args.out)
    doc["headline"] = headline(doc)
    (args.out / "results.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if not args.json_only:
        (args.out / "report.md").write_text(markdown(doc), encoding="utf-8")
        print_summary(doc, args.out)
    return 1 if any(s["status"] == "error" for s in doc["scenarios"]) else 0


def print_summary(doc: dict[str, Any], out: Path) -> None:
    for sc in doc["scenarios"]:
        print(f"\n== {sc['name']}: {sc['title']} [{sc['status']}]")
        if sc["status"] != "ok":
            status = "skipped" if sc["status"] in ("skipped", "unavailable") else sc["status"]
            print(f"   {status}: {sc['reason']}")
            continue
        for who, why in sc.get("skipped", {}).items():
            print(f"   {who}: skipped: {why}")
        for r in sc["rows"]:
            rr = "" if r["ratio"] is None else f"  x{r['ratio']:.2f} vs {r['baseline']}"
            median, lo, hi = (fmt_num(r[k]) for k in ("median", "min", "max"))
            what = f"{r['metric'][:42]:<42} {r['contender'][:34]:<34}"
            print(f"   {what} {median:>9} {r['unit']:<5} [{lo} .. {hi}]{rr}")
    print(
        f"\nWrote {out / 'results.json'}, {out / 'report.md'}" + "".join(f", {out / p}" for p in doc["plots"])
    )


if __name__ == "__main__":
    sys.exit(run())
