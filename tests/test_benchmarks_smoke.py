"""Smoke test of the node benchmark: ``benchmarks/node.py --quick`` runs and reports every contender.

No timing thresholds: loopback figures on a shared CI machine say nothing. Only that each
contender ran, that its numbers are sane, and that the targets table was computed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NODE_BENCH = ROOT / "benchmarks" / "node.py"
CONTENDERS = {
    "iac-quic",
    "iac-tls",
    "iac-unix",
    "http-sha256",
    "http-ed25519",
    "http-ed25519-tls",
    "http-ed25519-unix",
    "grpc",
}


def _summary_ok(s: object) -> bool:
    return isinstance(s, dict) and 0 < s["min"] <= s["median"] <= s["max"]


def test_node_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    proc = subprocess.run(
        [sys.executable, str(NODE_BENCH), "--quick", "--json", str(out), "--json-only"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(out.read_text())
    names = set(report["contenders"])
    assert CONTENDERS <= names <= CONTENDERS | {"iac-quic-qh3"}  # qh3: when that backend is installed
    assert report["config"]["reps"] == 3
    for name, c in report["contenders"].items():
        for key in ("rtt_p50_us", "rtt_p99_us", "requests_per_s_at_64", "client_cpu_us_per_request_at_64"):
            assert _summary_ok(c[key]), (name, key, c[key])
        assert c["rtt_p99_us"]["median"] >= c["rtt_p50_us"]["median"], name
        assert 1 < c["rtt_p50_us"]["median"] < 1_000_000, name  # µs: between 1 µs and 1 s
        assert 50 < c["bytes_per_request"] < 20_000, (name, c["bytes_per_request"])
        assert c["bytes_up"] > 0 and c["bytes_down"] > 0, name
        assert c["setup_bytes"] >= c["bytes_per_request"] / 2, name
        if name.startswith("iac-"):
            # the socket sees at least the IAC frames (TLS and QUIC add their own bytes)
            assert c["bytes_per_request"] >= 0.95 * c["iac_frame_bytes_per_request"], name
    issue_targets = [t for t in report["targets"] if t["target"] is not None]
    n_iac = sum(n.startswith("iac-") for n in names)
    n_quic = sum(n.startswith("iac-quic") for n in names)
    assert len(issue_targets) == 4 + 2 * n_quic + 2 * n_iac  # tls/unix x2, quic x2, bytes x2 each
    assert all(isinstance(t["met"], bool) and t["ratio"] > 0 for t in issue_targets)
