"""``iac bench --only scale`` (iac/bench/scenarios/scale.py) on a tiny plan: a real server node in a
process of its own, two client processes, TLS and QUIC. What it asserts is what the recorded figures
rest on (every peer connected, every request answered, every figure present); no timing is asserted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from iac.bench.harness.process import EndpointError
from iac.bench.harness.results import Result
from iac.bench.main import SCENARIOS
from iac.bench.scenarios import scale
from iac.bench.scenarios.scale import _answers, _child, _release
from iac.transport.bound import FD_RESERVE

TINY = scale.Plan(
    peers=(3,),
    transports=("tls", "quic"),
    procs=2,
    requests=30,
    in_flight=4,
    idle_s=0.2,
    broadcasts=1,
    corpus=12,
)


def test_the_plan_reads_its_command_line() -> None:
    assert scale.make_plan(True) == scale.QUICK
    assert max(scale.QUICK.peers) <= 100 and scale.QUICK.requests <= 500
    full = scale.make_plan(False)
    assert full.peers == (1, 10, 100, 1_000) and full.in_flight == 64 and full.big == ()
    big = scale.make_plan(False, big=True)  # the 10,000-peer step: opt-in, TLS, dials staged
    assert big.big == (10_000,) and big.big_transports == ("tls",) and big.big_at_once == 64
    plan = scale.make_plan(False, "1,10,500", "quic", 3, 2.5)
    assert (plan.peers, plan.transports, plan.procs, plan.idle_s) == ((1, 10, 500), ("quic",), 3, 2.5)
    assert scale.peers_allowed(1024) == 1024 - 2 * FD_RESERVE
    assert scale.peers_allowed(10) == 0
    assert "scale" in {s.name for s in SCENARIOS}


def test_a_tiny_plan_connects_every_peer_and_answers_every_request() -> None:
    data = asyncio.run(scale.measure(TINY))
    soft, hard = data["rlimit_nofile"]["soft"], data["rlimit_nofile"]["hard"]
    assert soft == hard  # raised to the hard limit (as far as the system lets it)
    assert data["skipped_peers"] == [] and data["peers_allowed"] == scale.peers_allowed(soft)
    assert [(s["transport"], s["peers"]) for s in data["steps"]] == [("tls", 3), ("quic", 3)]
    for s in data["steps"]:
        assert s["connected"] == 3 and s["server_connections"] == 3, s
        assert s["burst"]["failed"] == 0 and s["burst"]["errors"] == [], s
        assert s["requests_failed"] == 0, s
        assert s["rss_mib"] > 0 and s["server_cpu_us_per_request"] > 0, s
        assert s["burst"]["p99_s"] is not None and s["idle_cpu_percent"] >= 0, s
        assert s["burst"]["client_cpu_s"] > 0 and s["message_frame_bytes"] > 0, s
        flood = s["broadcast"]  # every connected peer verified each broadcast of the server node
        assert flood["sent_to"] == 3 and flood["reached_min"] == 3 and flood["median_s"] > 0, s
        flood = s["relayed_broadcast"]  # a peer's broadcast, relayed by the server to the other two
        assert flood["sent_to"] == 2 and flood["reached_min"] == 2 and flood["median_s"] > 0, s
        corpus = s["corpus"]  # every corpus request answered; the relayed messages all arrived
        assert corpus["failed"] == 0 and corpus["frames"] == 12, s
        assert corpus["relayed_sent"] == 6 and corpus["relayed"] == 6, s  # the process with 2 peers
        # through the relay the origin's whole signed message travels (compact: its key once)
        assert 0 < corpus["direct_frame_bytes"] < corpus["relayed_frame_bytes"], s
    frames = data["corpus_frame_bytes"]
    assert set(frames) == {"shipped", "derived", "elided", "relayed", "relayed_compact"}
    assert frames["elided"] < frames["relayed_compact"] < frames["relayed"], frames

    # the suite's rows, from that run's data (the child process replaced by it)
    def run_script(ctx: Any, script: str, args: list[str], timeout: float) -> dict[str, Any]:
        assert script == "scale.py" and args == ["--quick"]
        return data

    class Ctx:
        quick = True

        def progress(self, what: str) -> None:
            pass

    res = Result("scale", "scale")
    scale.scenario(Ctx(), res, run_script)
    metrics = {(r["contender"], r["metric"]) for r in res.rows}
    for who in ("IAC-TLS/TCP", "IAC-QUIC"):
        assert (who, "server RSS per peer, 3 peers") in metrics
        assert (who, "server CPU per request at 4 in flight, 3 peers") in metrics
        assert (who, "broadcast handled by all 3 peers") in metrics
        assert (who, "relayed broadcast, 3 peers") in metrics
        assert (who, "signed MESSAGE frame of the corpus, through the relay, 3 peers") in metrics
        assert (who, "signed MESSAGE frame at the load step, 3 peers") in metrics
        assert (who, "dial burst failures, 3 at once") in metrics
    tls = next(r for r in res.rows if r["metric"] == "server RSS per peer, 3 peers")
    assert tls["median"] == data["steps"][0]["per_peer_kib"]
    assert res.raw is data


def test_a_peer_count_over_the_descriptor_limit_is_skipped_and_said() -> None:
    data = asyncio.run(scale.measure(scale.Plan(peers=(10**9,), transports=("tls",))))
    assert data["steps"] == [] and data["skipped_peers"] == [10**9]
    assert data["peers_allowed"] < 10**9


def test_a_client_process_that_dies_is_named_with_its_exit_code_and_stderr() -> None:
    """A client child that exits without an answer (here: its spec lacks the server's URL, so it
    dies on a KeyError before dialing) makes the parent raise an error naming the child, its
    exit code and the tail of its stderr, not a JSON decoding error of an empty line."""

    async def main() -> str:
        child = await _child("client", {"n": 2})
        try:
            await _answers([child])
        except EndpointError as exc:
            return str(exc)
        finally:
            await _release([child])
        raise AssertionError("no error")

    message = asyncio.run(main())
    assert "(client 2)" in message and "exit code 1" in message
    assert "KeyError: 'url'" in message
