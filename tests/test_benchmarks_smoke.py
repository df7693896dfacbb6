"""Smoke test of the node benchmark: ``python -m iac.bench.scenarios.node --quick`` reports every contender.

No timing thresholds: loopback figures on a shared CI machine say nothing. Only that each
contender ran (the IAC contenders with their one-way phase, the floors with their echo phase,
one pair on uvloop when it is installed), that the numbers are sane, and that the calibration,
the codec primitives, the floor check, the ratios and the targets were computed.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_BENCH = "iac.bench.scenarios.node"
IAC = {"iac-quic", "iac-tls", "iac-unix"}
FLOORS = {"floor-quic", "floor-tls", "floor-unix"}
BASELINES = {"http-sha256", "http-ed25519", "http-ed25519-tls", "http-ed25519-unix", "grpc"}
#: One transport on uvloop too (the whole set on both loops takes twice as long).
UVLOOP = {"iac-unix-uvloop", "floor-unix-uvloop"} if importlib.util.find_spec("uvloop") else set()
CONTENDERS = IAC | FLOORS | BASELINES | UVLOOP
PIECES = {"json", "build", "sign", "compress", "frame encode", "frame decode", "decompress", "parse"}
PIECES |= {"verify"}


def _summary_ok(s: object) -> bool:
    return isinstance(s, dict) and 0 < s["min"] <= s["median"] <= s["max"]


def test_node_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    only = ",".join(sorted(CONTENDERS))
    proc = subprocess.run(
        [sys.executable, "-m", NODE_BENCH, "--quick", "--only", only, "--json", str(out), "--json-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    contenders = report["contenders"]
    assert set(contenders) == CONTENDERS
    reps = report["config"]["reps"]
    assert reps == 3
    for name, c in contenders.items():
        for key in ("rtt_p50_us", "rtt_p99_us", "requests_per_s_at_64", "client_cpu_us_per_request_at_64"):
            assert _summary_ok(c[key]), (name, key, c[key])
        assert c["rtt_p99_us"]["median"] >= c["rtt_p50_us"]["median"], name
        assert 1 < c["rtt_p50_us"]["median"] < 1_000_000, name  # µs: between 1 µs and 1 s
        assert 50 < c["bytes_per_request"] < 20_000, (name, c["bytes_per_request"])
        assert c["bytes_up"] > 0 and c["bytes_down"] > 0, name
        assert c["setup_bytes"] >= c["bytes_per_request"] / 2, name
        assert all(len(v) == reps for k, v in c["per_rep"].items() if k != "cpu_us_per_request_at_64"), name
        assert c["loop"] == ("uvloop" if name.endswith("-uvloop") else "asyncio"), name
        if c["role"] == "iac":
            # the socket sees at least the IAC frames (TLS and QUIC add their own bytes)
            assert c["bytes_per_request"] >= 0.95 * c["iac_frame_bytes_per_request"], name
            assert _summary_ok(c["oneway_per_s"]), name
            assert c["floor"] in contenders, name
        if c["role"] == "floor":
            assert _summary_ok(c["echo_requests_per_s_at_64"]), name
            assert c["echo_cpu_us_per_request_at_64"] > 0, name
            assert len(c["per_rep"]["primitives_in_sequence_us"]) == reps, name

    cal = report["calibration"]
    assert len(cal["measurements"]) == reps + 1
    assert all(m["scaling"] > 0 for m in cal["measurements"])
    assert [r["valid"] for r in cal["reps"]] == [r["scaling"] >= cal["min_scaling"] for r in cal["reps"]]

    prims = report["primitives"]
    for way in ("alone", "in_sequence"):
        assert set(prims[way]) == PIECES | {"sum"}
        assert all(v >= 0 for v in prims[way].values()) and prims[way]["sum"] > 0
    assert _summary_ok(report["codec_decode"]["per_s"])
    assert {f["floor"] for f in report["floor_check"]} == {n for n in CONTENDERS if n.startswith("floor-")}
    assert all(f["ok"] in (True, False, None) and f["vs_primitives_alone"] > 0 for f in report["floor_check"])

    iac = {n for n, c in contenders.items() if c["role"] == "iac"}
    assert set(report["iac_ratios"]) == iac
    for row in report["iac_ratios"].values():
        assert all(cell["floor"] > 0 and cell["reference"] > 0 for cell in row.values())

    targets = [t for t in report["targets"] if t["target"] is not None]
    previous = report["previous"]
    n_previous = 0
    if previous is not None:
        assert previous["file"].endswith("-benchmarks-node.json")
        n_previous = sum(bool(previous["contenders"][n]["previous"]) for n in iac)
    # per IAC contender: p50 / floor, req/s and p50 / http-ed25519, one-way / decode, bytes / 2 HTTP
    assert len(targets) == 6 * len(iac) + n_previous
    for t in targets:
        assert t["ratio"] > 0
        if t.get("reps_used") == 0:  # no repetition had two cores: shown, not judged
            assert t["met"] is None and t["note"]
        else:
            assert isinstance(t["met"], bool), t
