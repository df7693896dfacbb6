"""The benchmark suite: a quick real run, its statistics helpers, and the link emulator's impairment."""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from iac.bench.contenders import endpoints
from iac.bench.harness import results
from iac.bench.reports import report
from iac.bench.scenarios import requests
from iac.cli import bench as _bench
from iac.cli.main import main as iac_main
from iac.testing import netem
from iac.testing.relay import Impairment

ROOT = Path(__file__).resolve().parent.parent

ROW_FIELDS = {"contender", "metric", "unit", "better", "median", "min", "max", "n"} | {
    "baseline",
    "iac",
    "ratio",
}
SCENARIO_FIELDS = {"name", "title", "status", "reason", "baseline", "duration_s"} | {
    "rows",
    "series",
    "notes",
    "raw",
}


def _bench_argv(out: Path) -> list[str]:
    return ["bench", "--quick", "--only", "codec", "--only", "broadcast", "--out", str(out)]


def test_iac_bench_quick_writes_json_and_markdown(tmp_path):
    out = tmp_path / "res"
    from iac.cli.main import build_parser

    try:
        registered = build_parser().parse_args(_bench_argv(out)).verb == "bench"
    except SystemExit:
        registered = False
    if registered:
        res = subprocess.run(
            [sys.executable, "-m", "iac", *_bench_argv(out)], capture_output=True, text=True, timeout=300
        )
        assert res.returncode == 0, res.stderr
        assert "[1/2] codec" in res.stderr  # the progress display
    else:  # not wired into iac/_cli.py yet: the verb's own parser
        ap = argparse.ArgumentParser(prog="iac")
        _bench.register(ap.add_subparsers(dest="verb"))
        args = ap.parse_args(_bench_argv(out))
        assert args.func(args) == 0
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["schema"] == results.SCHEMA
    assert {"command", "started", "duration_s", "quick", "environment", "scenarios", "plots"} <= set(doc)
    assert doc["command"].startswith("iac bench --quick")
    env = doc["environment"]
    assert {"cpu_model", "cores", "python", "libraries", "quic_backends"} <= set(env)
    assert env["libraries"]["pynacl"] and "aioquic" in env["quic_backends"]
    by = {s["name"]: s for s in doc["scenarios"]}
    assert set(by) == {"codec", "broadcast"}
    for s in doc["scenarios"]:
        assert set(s) == SCENARIO_FIELDS
    codec = by["codec"]
    assert codec["status"] == "ok", codec["reason"]
    assert codec["baseline"] == "bare PyNaCl Ed25519"
    for row in codec["rows"]:
        assert set(row) == ROW_FIELDS
        assert row["min"] <= row["median"] <= row["max"]
    iac_rows = [r for r in codec["rows"] if r["iac"]]
    assert iac_rows and all(r["ratio"] and r["ratio"] > 0 for r in iac_rows)
    assert by["broadcast"]["status"] == "ok", by["broadcast"]["reason"]
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "| metric | contender | median [min .. max] | unit | × baseline |" in md
    assert doc["command"] in md and env["cpu_model"] in md


def _quick_suite(tmp_path: Path, *only: str) -> dict[str, dict]:
    out = tmp_path / "res"
    argv = [sys.executable, "-m", "iac.bench.main", "--quick", "--json-only", "--out", str(out)]
    for name in only:
        argv += ["--only", name]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # --json-only: no progress display
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert not (out / "report.md").exists()
    by = {s["name"]: s for s in doc["scenarios"]}
    assert set(by) == set(only)
    for sc in by.values():
        assert SCENARIO_FIELDS <= set(sc) <= SCENARIO_FIELDS | {"skipped"}
        assert sc["status"] == "ok", sc["reason"]
        for row in sc["rows"]:
            assert ROW_FIELDS <= set(row) <= ROW_FIELDS | {"secures"}
            assert row["min"] <= row["median"] <= row["max"] and row["n"] >= 1
    return by


def test_quick_broadcast_scenario_fields(tmp_path):
    from iac.bench.scenarios import mesh

    sc = _quick_suite(tmp_path, "broadcast")["broadcast"]
    rows = {(r["contender"], r["metric"]): r for r in sc["rows"]}
    metric = "completion, 10 agents"  # --quick: 10 agents only
    assert {r["metric"] for r in sc["rows"] if r["unit"] == "ms"} == {metric}
    assert (mesh.IAC_MESH, metric) in rows and (mesh.IAC_FANOUT, metric) in rows
    flood = rows[(mesh.IAC_MESH, metric)]
    assert flood["iac"] and flood["unit"] == "ms" and flood["better"] == "lower" and flood["n"] == 5
    assert flood["median"] > 0
    assert sc["baseline"] in (mesh.HTTP_ED25519, mesh.IAC_FANOUT)
    if sc["baseline"] == mesh.HTTP_ED25519:  # aiohttp installed: both HTTP fan-outs ran
        assert (mesh.HTTP_SHA256, metric) in rows
        assert (
            not rows[(mesh.HTTP_ED25519, metric)]["iac"]
            and rows[(mesh.HTTP_ED25519, metric)]["ratio"] is None
        )
    assert flood["baseline"] == sc["baseline"] and flood["ratio"] > 0
    nats = [(mesh.NATS_FANOUT, metric), (mesh.NATS_ED25519, metric)]
    assert all(k in rows for k in nats) or set(sc["skipped"]) == {k[0] for k in nats}
    assert "per-message authentication: Ed25519" in flood["secures"]
    bytes_rows = [r for r in sc["rows"] if r["unit"] == "B"]
    assert {r["contender"] for r in bytes_rows} == {mesh.IAC_MESH, mesh.IAC_FANOUT}
    assert all(r["median"] > 0 for r in bytes_rows)
    assert sc["raw"]["sizes"] == [10] and sc["raw"]["links"]["10"] == len(mesh.graph(10, 10))
    assert set(sc["series"]["completion_vs_agents_ms"][mesh.IAC_MESH]) == {"10"}


def test_broadcast_graph_is_connected_and_seeded():
    from iac.bench.scenarios import mesh

    for n in (2, 10, 50, 100):
        edges = mesh.graph(n, seed=n)
        assert edges == mesh.graph(n, seed=n) and len(edges) == len(set(edges))
        assert len(edges) == min(n - 1 + n // 2, n * (n - 1) // 2)
        reached, frontier = {0}, [0]
        while frontier:
            i = frontier.pop()
            for a, b in edges:
                for x, y in ((a, b), (b, a)):
                    if x == i and y not in reached:
                        reached.add(y)
                        frontier.append(y)
        assert reached == set(range(n))


def test_interleave_async_takes_turns():
    import asyncio

    calls: list[str] = []

    def step(name: str, value: float):
        async def fn() -> float:
            calls.append(name)
            return value

        return fn

    out = asyncio.run(
        results.interleave_async({"A": step("A", 1.0), "B": step("B", 2.0)}, rounds=2, warmup=1)
    )
    assert calls == ["A", "B", "A", "B", "B", "A"]
    assert out == {"A": [1.0, 1.0], "B": [2.0, 2.0]}


def test_same_transport_ratios():
    res = results.Result("requests", "R", baseline="HTTP+Ed25519 JSON")
    res.add("IAC-TLS/TCP", "RTT p50, 1 in flight", "µs", [300.0])
    res.add("HTTPS+Ed25519 JSON", "RTT p50, 1 in flight", "µs", [400.0])
    res.add("IAC-UNIX", "RTT p50, 1 in flight", "µs", [200.0])  # no UNIX HTTP row: no ratio
    assert requests.same_transport_ratios(res) == {
        "IAC-TLS/TCP / HTTPS+Ed25519 JSON": {"RTT p50, 1 in flight": 0.75}
    }


def test_requests_contenders_include_grpc_and_same_transport_http():
    ctx = results.Context(quick=True, tmp=Path("."), progress=lambda s: None, backends=["aioquic"])
    labels = [c[0] for c in requests._request_contenders(ctx)]
    assert labels[:3] == ["IAC-QUIC", "IAC-TLS/TCP", "IAC-UNIX"]
    if endpoints.have_aiohttp():
        assert {"HTTP+Ed25519 JSON", "HTTPS+Ed25519 JSON", "HTTP+Ed25519 JSON/UNIX"} <= set(labels)
    if endpoints.have_grpc():
        assert endpoints.NAMES["grpc"] in labels
    assert all(c in endpoints.NAMES for _, c, _ in requests._request_contenders(ctx))


def test_bench_without_the_extra_prints_one_line_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(_bench, "EXTRA", (*_bench.EXTRA, ("iac_no_such_module", "no-such-dist")))
    assert iac_main(["bench", "--list"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "no-such-dist" in err and "pip install 'iac[bench]'" in err


def test_suite_argv_round_trips():
    ns = argparse.Namespace(quick=True, only=["loss", "rtt"], json_only=True, out="x", list=False)
    expected = ["--quick", "--only", "loss", "--only", "rtt", "--json-only", "--out", "x"]
    assert _bench.suite_argv(ns) == expected


# --- statistics and interleaving ----------------------------------------------------------------


def test_summarize():
    assert results.summarize([3.0, 1.0, 2.0, 10.0]) == {"median": 2.5, "min": 1.0, "max": 10.0, "n": 4}
    with pytest.raises(ValueError):
        results.summarize([])


def test_turn_order_alternates():
    assert results.turn_order(["A", "B", "C"], 4) == [
        ["A", "B", "C"],
        ["C", "B", "A"],
        ["A", "B", "C"],
        ["C", "B", "A"],
    ]


def test_interleave_warms_up_then_takes_turns():
    calls: list[str] = []
    values = {"A": iter([100.0, 1.0, 2.0, 3.0]), "B": iter([200.0, 10.0, 20.0, 30.0])}

    def step(name):
        def fn():
            calls.append(name)
            return next(values[name])

        return fn

    out = results.interleave({"A": step("A"), "B": step("B")}, rounds=3, warmup=1)
    assert calls == ["A", "B", "A", "B", "B", "A", "A", "B"]
    assert out == {"A": [1.0, 2.0, 3.0], "B": [10.0, 20.0, 30.0]}  # warm-up figures dropped


def test_ratios_to_the_baseline():
    res = results.Result("x", "X", baseline="HTTP")
    res.add("IAC-QUIC", "p50", "ms", [10.0, 12.0, 11.0])
    res.add("HTTP", "p50", "ms", [20.0, 22.0, 24.0])
    res.add("IAC-QUIC", "p99", "ms", [5.0])  # no baseline row for this metric
    res.add("IAC-TLS", "p50", "ms", [11.0], baseline="IAC-QUIC")  # a row's own baseline
    res.finish()
    rows = {(r["contender"], r["metric"]): r for r in res.rows}
    assert rows[("IAC-QUIC", "p50")]["ratio"] == pytest.approx(11.0 / 22.0)
    assert rows[("HTTP", "p50")]["ratio"] is None
    assert rows[("IAC-QUIC", "p99")]["ratio"] is None
    assert rows[("IAC-TLS", "p50")]["ratio"] == pytest.approx(1.0)
    assert results.ratio(1.0, 0.0) is None


def test_downsample_keeps_the_ends():
    xs = [float(i) for i in range(10_000)]
    d = results.downsample(xs, 101)
    assert len(d) == 101 and d[0] == 0.0 and d[-1] == 9999.0 and d == sorted(d)
    assert results.downsample([3.0, 1.0]) == [1.0, 3.0]


def test_markdown_of_a_skipped_scenario():
    doc = {
        "command": "iac bench --quick",
        "started": "2026-01-01T00:00:00+00:00",
        "duration_s": 1.0,
        "quick": True,
        "environment": {
            "cpu_model": "CPU",
            "cores": 2,
            "system": "Linux",
            "machine": "x86_64",
            "python": "3.11",
            "implementation": "CPython",
            "libraries": {"iac": "0.1.0"},
            "quic_backends": ["aioquic"],
            "git_commit": None,
        },
        "scenarios": [
            results.Result("loss", "Loss", status="skipped", reason="needs root").to_json(),
        ],
        "plots": [],
    }
    md = report.markdown(doc)
    assert "**skipped**: needs root" in md and "`iac bench --quick`" in md


# --- the link emulator's impairment ------------------------------------------------------------


def _rates(imp: Impairment, n: int = 100_000, seed: int = 1):
    im = netem.Impairer(imp, seed)
    times = [im.schedule(float(i), 100) for i in range(n)]
    return im, times


def test_impairer_loss_duplicate_reorder_rates():
    imp = Impairment(delay=0.01, loss=0.03, duplicate=0.02, reorder=0.05, reorder_delay=0.004)
    im, times = _rates(imp)
    n = len(times)
    st = im.stats
    assert st.packets == n and st.bytes == 100 * n
    assert abs(st.dropped / n - 0.03) < 0.003
    assert sum(1 for t in times if not t) == st.dropped
    kept = n - st.dropped
    assert abs(st.duplicated / kept - 0.02) < 0.003
    assert sum(1 for t in times if len(t) == 2) == st.duplicated
    copies = kept + st.duplicated
    assert abs(st.reordered / copies - 0.05) < 0.005
    for i, ts in enumerate(times):
        for t in ts:
            assert t - i == pytest.approx(0.01) or t - i == pytest.approx(0.014)


def test_impairer_jitter_and_determinism():
    imp = Impairment(delay=0.01, jitter=0.005)
    _, a = _rates(imp, 5000, seed=9)
    _, b = _rates(imp, 5000, seed=9)
    _, c = _rates(imp, 5000, seed=10)
    assert a == b and a != c
    delays = [ts[0] - i for i, ts in enumerate(a)]
    assert all(0.01 - 1e-9 <= d <= 0.015 + 1e-9 for d in delays)
    assert 0.0122 < sum(delays) / len(delays) < 0.0128


def test_impairer_clean_link_passes_everything():
    im, times = _rates(Impairment(), 1000)
    assert all(len(t) == 1 for t in times) and im.stats.dropped == 0


def test_impairer_matches_rng_directly():
    """The decision draws from one seeded generator in a fixed order (loss, duplicate, jitter, reorder)."""
    imp = Impairment(loss=0.5)
    im = netem.Impairer(imp, 3)
    rng = random.Random(3)
    for i in range(200):
        assert (im.schedule(float(i)) == []) == (rng.random() < 0.5)


@pytest.mark.skipif(netem.unavailable() is not None, reason=f"link emulator: {netem.unavailable()}")
def test_link_between_namespaces_carries_tcp_with_delay():
    def namespaces() -> set[str]:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
        return {line.split()[0] for line in out.splitlines() if line.startswith("iacb")}

    before = namespaces()  # other runs' links (a benchmark in progress) are theirs
    res = subprocess.run(
        [sys.executable, "-m", "iac.testing.netem", "demo", "--count", "5", "--delay", "0.005"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    assert "5 round trips" in res.stdout
    median = float(res.stdout.split("median ")[1].split()[0])
    assert 9.0 <= median < 60.0  # 2 x 5 ms, plus scheduling
    assert namespaces() <= before  # the demo's namespaces were removed


def test_headline_picks_key_rows_and_says_who_is_ahead():
    res = results.Result("broadcast", "B", baseline="HTTP fan-out")
    for n, iac_ms, http_ms in ((10, 2.0, 1.0), (100, 10.0, 20.0)):
        res.add("IAC flood", f"completion, {n} agents", "ms", [iac_ms])
        res.add("HTTP fan-out", f"completion, {n} agents", "ms", [http_ms], iac=False)
        res.add("HTTP+SHA fan-out", f"completion, {n} agents", "ms", [http_ms / 4], iac=False)
    res.add("IAC flood", "bytes", "B", [5.0])
    res.finish()
    rows = report.headline({"scenarios": [res.to_json()]})
    assert len(rows) == 1  # the largest N only, and no B rows
    h = rows[0]
    assert h["metric"] == "completion, 100 agents" and h["ratio"] == pytest.approx(0.5) and h["ahead"]
    assert h["baseline_median"] == 20.0
    assert (h["best_other"], h["best_other_median"]) == ("HTTP+SHA fan-out", 5.0)
    md = "\n".join(report.headline_markdown({"scenarios": [res.to_json()]}))
    assert "## Headline" in md and "| broadcast | completion, 100 agents | IAC flood |" in md


def test_smoke_runs_the_whole_harness_on_a_tiny_plan(tmp_path):
    """``iac bench --smoke`` (what ``make test`` runs): turns, statistics, the ratio to the baseline,
    the environment, results.json, report.md and a plot, in about a second."""
    out = tmp_path / "smoke"
    res = subprocess.run(
        [sys.executable, "-m", "iac", "bench", "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert doc["command"] == "iac bench --smoke --out " + str(out) and doc["environment"]["cores"]
    (sc,) = doc["scenarios"]
    assert sc["name"] == "smoke" and sc["status"] == "ok"
    rows = {r["contender"]: r for r in sc["rows"]}
    codec, bare = rows["IAC codec encode + decode"], rows["bare PyNaCl Ed25519 sign + verify"]
    assert codec["n"] == bare["n"] == 3 and codec["ratio"] == pytest.approx(codec["median"] / bare["median"])
    assert "## smoke" in (out / "report.md").read_text(encoding="utf-8")
    assert (out / "smoke_rounds.png").stat().st_size > 0
