"""Smoke tests of the scenarios ``roundtrip``, ``scaleout``, ``flood`` and ``regress``
(``iac/bench/scenarios/``): they run and report every contender with sane numbers. No timing
thresholds (loopback figures on a shared machine say nothing); the counts that depend on the code
alone are checked where the code fixes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_roundtrip_every_contender(tmp_path: Path) -> None:
    out = tmp_path / "rt.json"
    _run(["-m", "iac.bench.scenarios.roundtrip", "--count", "30", "--reps", "2", "--json", str(out)])
    report = json.loads(out.read_text())
    names = {f"{k}-{t}" for k in ("iac", "floor") for t in ("quic", "tls", "unix")}
    names |= {"iac-tls-thread", "iac-tls-signw"}
    assert set(report["contenders"]) == names
    for name, c in report["contenders"].items():
        assert len(c["cpu_us_1"]) == len(c["cpu_us_64"]) == 2, name
        assert all(0 < v < 1_000_000 for v in c["cpu_us_1"] + c["cpu_us_64"]), name
        assert len(c["rps_64"]) == 2 and all(v > 0 for v in c["rps_64"]), name
        assert c["loop_turns"] >= 1 and c["python_calls"] > 10, name
        # datagrams carry QUIC: at least one flush per direction; TLS and UNIX never call transmit
        assert (c["quic_transmits"] >= 2) if name.endswith("quic") else (c["quic_transmits"] == 0), name
    # the handler on a thread hops: more loop turns than inline
    c = report["contenders"]
    assert c["iac-tls-thread"]["loop_turns"] > c["iac-tls"]["loop_turns"]
    assert report["instructions"] == {}  # counted with --callgrind only
    assert set(report["ratios"]) == {
        "iac-quic / floor-quic", "iac-tls / floor-tls", "iac-unix / floor-unix", "iac-tls-thread / iac-tls",
        "iac-tls-signw / iac-tls",
    }  # fmt: skip


def test_roundtrip_one_transport() -> None:
    _run(["-m", "iac.bench.scenarios.roundtrip", "unix", "--count", "20", "--reps", "1"])


def test_scaleout_quick(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    _run(["-m", "iac.bench.scenarios.scaleout", "--quick", "--count", "50", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["config"]["reps"] == 1 and len(report["scaling"]) == 1
    contenders = report["contenders"]
    assert list(contenders) == [
        "1 process, memory store", "1 process, shared store", "2 processes, shared store"
    ]  # fmt: skip
    for name, c in contenders.items():
        assert c["requests_per_s"] > 0 and c["server_cpu_us_per_request"] > 0, name
    assert report["two_over_one"] > 0 and report["shared_over_memory_cpu"] > 0


def test_flood_quick(tmp_path: Path) -> None:
    """``flood.py --quick``: both cases, the flood sent at close to its rate, the honest requests
    answered with and without it, the node's counts reported."""
    out = tmp_path / "flood.json"
    _run(["-m", "iac.bench.scenarios.flood", "--quick", "--json", str(out)])
    report = json.loads(out.read_text())
    assert [(c["rate"], c["handler_ms"]) for c in report["cases"]] == [(10_000.0, 0.0), (4_000.0, 2.0)]
    for case in report["cases"]:
        assert len(case["reps"]) == 2
        for rep in case["reps"]:
            assert rep["flood_sent"] == int(case["rate"] * case["seconds"])
            assert all(n > 10 for n in rep["requests"]) and 0 < rep["p50_quiet_us"] < 1_000_000
        assert case["server"]["handled"] > 0 and case["ratio_median"] > 0


def test_regress_runs_the_suite_on_an_earlier_commit_and_this_tree(tmp_path: Path) -> None:
    """The same commit on both sides: its deterministic figures (bytes per message) are within."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    out = tmp_path / "regress.json"
    _run(["-m", "iac.bench.scenarios.regress", "--before", "HEAD", "--quick", "--rounds", "1",
          "--only", "bytes", "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    assert report["config"]["before"] == head.stdout.strip()
    rows = report["rows"]
    assert {r["scenario"] for r in rows} == {"bytes"} and len(rows) >= 3
    assert all(r["verdict"] == "within" and r["ratio"] == 1.0 for r in rows)
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "iac-regress-" not in listed.stdout  # the earlier commit's checkout is gone


def test_callgrind_total_is_read_from_the_summary_line() -> None:
    from iac.bench.scenarios.roundtrip import callgrind_total

    assert callgrind_total("# callgrind format\nevents: Ir\nsummary: 3127000\n") == 3127000
    assert callgrind_total("events: Ir\ntotals: 42\n") == 42
    with pytest.raises(ValueError):
        callgrind_total("events: Ir\n")
