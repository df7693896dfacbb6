"""The cc scenario (iac/bench/scenarios/cc.py, iac/bench/reports/ccreport.py): its figures and verdicts from
made-up runs, and -- as root on Linux -- one short run over the emulated bottleneck."""

from __future__ import annotations

import pytest

from iac.bench.harness import results as suite
from iac.bench.reports import ccreport
from iac.bench.scenarios import cc
from iac.testing import netem


def _run(setting: dict, who: str, goodput: float, p99: float, retrans: float, cpu: float = 50.0) -> dict:
    return {
        "setting": setting,
        "contender": who,
        "rep": 0,
        "flows": [
            {
                "contender": who,
                "goodput_mbit": goodput,
                "sent_bytes": 1_000_000,
                "retrans_bytes": retrans * 1e6,
            }
        ],
        "requests": {"n": 100, "p50_ms": p99 / 2, "p99_ms": p99},
        "cpu_percent": {"sender": cpu, "sink": 20.0},
        "cpu_limited": ["sender"] if cpu > netem.CPU_LIMIT_PERCENT else [],
        "machine_busy_percent": 60.0,
    }


def _data() -> dict:
    runs = []
    lossy = {"rate_mbit": 50.0, "rtt": 0.02, "loss": 0.01, "buffer": "deep"}
    clean = {"rate_mbit": 10.0, "rtt": 0.02, "loss": 0.0, "buffer": "deep"}
    for s, figs in (
        (lossy, {"IAC-QUIC BBR": (30, 40, 0.02, 99), "IAC-QUIC CUBIC": (10, 30, 0.011, 60),
                 "IAC-TLS/TCP bbr": (45, 40, 0.02, 5), "IAC-TLS/TCP cubic": (12, 40, 0.01, 5)}),
        (clean, {"IAC-QUIC BBR": (9.5, 45, 0.0, 40), "IAC-QUIC CUBIC": (9.4, 200, 0.001, 40),
                 "IAC-TLS/TCP bbr": (9.7, 45, 0.0, 5), "IAC-TLS/TCP cubic": (9.6, 220, 0.0, 5)}),
    ):  # fmt: skip
        for who, (g, p99, r, cpu) in figs.items():
            for rep in range(3):
                runs.append({**_run(s, who, g + rep * 0.1, p99, r, cpu), "rep": rep})
    share = {
        "setting": {"rate_mbit": 10.0, "rtt": 0.02, "loss": 0.0, "buffer": "deep"},
        "pair": ["IAC-QUIC BBR", "IAC-QUIC BBR"],
        "rep": 0,
        "flows": [{"goodput_mbit": 5.5}, {"goodput_mbit": 4.0}],
        "cpu_percent": {},
        "cpu_limited": [],
    }
    plan = {
        "seconds": 10,
        "reps": 3,
        "warmup_s": 1,
        "share_seconds": 20,
        "share_reps": 1,
        "shallow_bdp": 0.5,
        "deep_bdp": 8,
        "cpu_limit_percent": 90,
        "frame_bytes": 16384,
        "request_bytes": 200,
        "contenders": [],
    }
    return {"status": "ok", "runs": runs, "shares": [share], "plan": plan}


def test_medians_and_cpu_limits_per_setting_and_contender() -> None:
    agg = ccreport.aggregate(_data())
    lossy = agg["50 Mbit/s, 20 ms, 1% loss, deep"]
    assert lossy["IAC-QUIC BBR"]["goodput"] == {"median": 30.1, "min": 30.0, "max": 30.2, "n": 3}
    assert lossy["IAC-QUIC BBR"]["cpu_limited"] and not lossy["IAC-QUIC CUBIC"]["cpu_limited"]
    assert lossy["IAC-QUIC CUBIC"]["retrans_ratio"] == pytest.approx(0.011)
    (share,) = ccreport.shares(_data())
    assert share["min_over_max"] == pytest.approx(4.0 / 5.5)


def test_targets_are_same_run_ratios_with_verdicts() -> None:
    found = {(t["id"], t["setting"]): t for t in ccreport.targets(_data())}
    lossy, clean = "50 Mbit/s, 20 ms, 1% loss, deep", "10 Mbit/s, 20 ms, 0% loss, deep"
    t1 = found[("T1", lossy)]
    assert t1["value"] == pytest.approx(30.1 / 10.1) and t1["met"] is True
    t2 = found[("T2", clean)]
    assert t2["value"] == pytest.approx(45 / 200) and t2["met"] is True
    assert found[("T3", clean)]["met"] is True
    # BBR's run at 50 Mbit/s was CPU-limited: the comparison with the kernel leaves it out
    t5 = found[("T5", lossy)]
    assert t5["met"] is None and t5["why"] == "CPU-limited"
    assert found[("T5", clean)]["met"] is True
    assert found[("G1", clean)]["met"] is True
    g2 = found[("G2", lossy)]  # 2 % of bytes retransmitted against 1.1 %
    assert g2["value"] == pytest.approx(0.02 / 0.011) and g2["met"] is True
    t4 = found[("T4", clean)]
    assert t4["met"] is True  # 4.0 / 5.5 = 0.73 >= 0.7
    summary = {t["id"]: t for t in ccreport.target_summary(found.values())}
    assert summary["T5"]["left_out"] == [lossy]
    assert "met in 1/1" in ccreport.verdict_line(summary["T1"])


def test_suite_result_rows_ratios_and_notes() -> None:
    res = suite.Result("cc", "cc")
    ccreport.fill_result(_data(), res)
    res.finish()
    rows = {(r["contender"], r["metric"]): r for r in res.rows}
    g = rows[("IAC-QUIC BBR", "goodput, 50 Mbit/s, 20 ms, 1% loss, deep")]
    assert g["ratio"] == pytest.approx(30.1 / 10.1) and g["baseline"] == "IAC-QUIC CUBIC"
    p = rows[("IAC-QUIC BBR", "request p99 during bulk, 10 Mbit/s, 20 ms, 0% loss, deep")]
    assert p["ratio"] == pytest.approx(45 / 200)
    assert any(r["metric"].startswith("target T1") for r in res.rows)
    assert all(r["min"] <= r["median"] <= r["max"] for r in res.rows)
    assert any("CPU-limited" in n and "50 Mbit/s" in n for n in res.notes)
    assert any(n.startswith("T4 ") for n in res.notes)
    doc = res.to_json()
    assert doc["raw"]["target_summary"]


def test_plans_cover_the_matrix_and_quick_stays_small() -> None:
    full = cc.FULL_PLAN.settings()
    assert len(full) == 2 * 2 * 3 * 2
    assert {s.buffer for s in full} == {"shallow", "deep"}
    assert [c.label for c in cc.FULL_PLAN.contenders] == [
        "IAC-QUIC BBR",
        "IAC-QUIC CUBIC",
        "IAC-QUIC Reno",
        "IAC-TLS/TCP cubic",
        "IAC-TLS/TCP bbr",
    ]
    quick = cc.QUICK_PLAN
    runs = len(quick.settings()) * len(quick.contenders) * quick.reps
    assert runs * (quick.seconds + 2) < 25  # what `make test`'s quick suite adds


@pytest.mark.skipif(netem.unavailable() is not None, reason=f"link emulator: {netem.unavailable()}")
def test_one_short_run_over_the_bottleneck() -> None:
    plan = cc.Plan(
        rates=(10.0,),
        rtts=(0.02,),
        losses=(0.0,),
        buffers=("shallow",),
        contenders=(cc.BBR, cc.TCP_CUBIC),
        seconds=2.0,
        reps=1,
        warmup=0.5,
        share_pairs=(),
        share_settings=(),
    )
    out = cc.run_cc(plan)
    assert out["status"] == "ok"
    assert [r["contender"] for r in out["runs"]] == ["IAC-QUIC BBR", "IAC-TLS/TCP cubic"]
    for run in out["runs"]:
        flow = run["flows"][0]
        assert 1.0 < flow["goodput_mbit"] <= 10.5
        assert run["requests"]["n"] > 5
        assert {"sender", "sink", "echo", "forwarder", "requests"} <= set(run["cpu_percent"])
        assert run["link"]["max_queued_bytes"] <= netem.Bottleneck.for_path(10, 0.02, 0.5).queue_bytes
    assert out["runs"][0]["flows"][0]["trace"][-1]["mode"] in ("startup", "drain", "probe_bw", "probe_rtt")


def test_link_off_turns_every_link_mechanism_off() -> None:
    """``--link off`` (the mechanisms-off contender): path MTU discovery, segmentation offload and
    ACK frequency all off, everything else as it was."""
    from iac.bench.contenders.ccflows import link_mechanisms_off
    from iac.transport.base import TransportConfig

    on = TransportConfig(congestion="bbr")
    assert on.quic_pmtud and on.quic_gso and on.quic_ack_frequency
    off = link_mechanisms_off(on)
    assert (off.quic_pmtud, off.quic_gso, off.quic_ack_frequency) == (False, False, False)
    assert off.congestion == "bbr" and off.quic_max_datagram_size == on.quic_max_datagram_size
    assert "ACK frequency off" in cc.BBR_LINK_OFF.label and not cc.BBR_LINK_OFF.link
