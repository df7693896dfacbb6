"""Through NATs: time to a direct path, request RTT direct vs relayed, relay bytes saved.

    sudo .venv/bin/python -m iac.bench.scenarios.nat [--quick] [--json FILE]

Real NATs in Linux network namespaces (:class:`iac.testing.NatLab`, :class:`iac.testing.nat.NatScene`),
fresh nodes every round, then one lab with symmetric NATs where the punch must fail and the
requests still arrive through the relay; benchmarks/README.md, "Through NATs". Needs root,
``ip``, ``iptables`` and ``conntrack``; without them the result says why."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
import sys
import time
from pathlib import Path
from typing import Any

from iac.bench.harness.results import summarize
from iac.bench.harness.stats import median
from iac.bench.reports import live
from iac.testing.nat import NatLab, NatScene, unavailable

#: 1 KiB of seeded random letters and digits (compresses little, unlike a repeated character).
PAYLOAD = "".join(random.Random(1).choices(string.ascii_letters + string.digits, k=1024))

MODULE = "iac.bench.scenarios.nat"


async def _round(lab: NatLab, requests: int) -> dict[str, Any]:
    async with NatScene(lab) as s:
        await s.observe()
        await s.requests(3, "warm", PAYLOAD)
        b0 = lab.received_public_bytes()
        relayed = await s.requests(requests, "r", PAYLOAD)
        relayed_bytes = lab.received_public_bytes() - b0
        t0 = time.perf_counter()
        ok = await s.ta.connect_direct(s.b.agent_id)
        to_direct = time.perf_counter() - t0
        if not ok:
            raise RuntimeError("no direct path formed between the two NATs")
        await s.requests(3, "warm-direct", PAYLOAD)
        b1 = lab.received_public_bytes()
        direct = await s.requests(requests, "d", PAYLOAD)
        direct_bytes = lab.received_public_bytes() - b1
        return {
            "to_direct_ms": to_direct * 1e3,
            "rtt_relayed_ms": median(relayed) * 1e3,
            "rtt_direct_ms": median(direct) * 1e3,
            "relay_bytes_per_request_relayed": relayed_bytes / requests,
            "relay_bytes_per_request_direct": direct_bytes / requests,
        }


async def _symmetric(lab: NatLab, requests: int) -> dict[str, Any]:
    async with NatScene(lab, direct_timeout=3.0) as s:
        await s.observe()
        t0 = time.perf_counter()
        ok = await s.ta.connect_direct(s.b.agent_id)
        gave_up = time.perf_counter() - t0
        before = s.relayed()
        await s.requests(requests, "s", PAYLOAD)
        return {
            "direct": ok,
            "gave_up_after_ms": gave_up * 1e3,
            "delivered": len(s.handled),
            "sent": requests,
            "relayed_messages": s.relayed() - before,
        }


async def measure(rounds: int, requests: int) -> dict[str, Any]:
    tag = f"b{os.getpid() % 100000}"
    per_round: list[dict[str, Any]] = []
    with NatLab(tag=tag) as lab:
        for _ in range(rounds):
            lab.flush_mappings(lab.nat_a)
            lab.flush_mappings(lab.nat_b)
            per_round.append(await _round(lab, requests))
    with NatLab(tag=tag, symmetric=True) as lab:
        symmetric = await _symmetric(lab, requests)
    keys = per_round[0].keys()
    figures = {k: summarize([r[k] for r in per_round]) for k in keys}
    rel = figures["relay_bytes_per_request_relayed"]["median"]
    dirb = figures["relay_bytes_per_request_direct"]["median"]
    return {
        "rounds": rounds,
        "requests_per_path": requests,
        "payload_bytes": len(PAYLOAD),
        "figures": figures,
        "ratio_rtt_direct_relayed": figures["rtt_direct_ms"]["median"] / figures["rtt_relayed_ms"]["median"],
        "relay_bytes_saved_fraction": (rel - dirb) / rel if rel else 0.0,
        "symmetric": symmetric,
    }


def scenario(ctx: Any, res: Any, run_script: Any) -> None:
    """``iac bench --only nat``: this script in a child process, its figures as the suite's rows."""
    reason = unavailable()
    if reason is not None:
        root = "root needed for ip netns and iptables — run it as root (sudo iac bench)"
        res.status, res.reason = "skipped", root if reason.startswith("needs root") else reason
        return
    ctx.progress("nat.py")
    data = run_script(ctx, "nat.py", ["--quick"] if ctx.quick else [], 600)
    f = data["figures"]
    res.baseline = "relayed"
    rtt, bytes_ = "request RTT A -> B, 1 KiB, two NATs", "bytes the relay receives per request"
    for who, metric, unit, key in (
        ("relayed", rtt, "ms", "rtt_relayed_ms"),
        ("direct", rtt, "ms", "rtt_direct_ms"),
        ("direct", "time to a direct path (punch)", "ms", "to_direct_ms"),
        ("relayed", bytes_, "B", "relay_bytes_per_request_relayed"),
        ("direct", bytes_, "B", "relay_bytes_per_request_direct"),
    ):
        res.add(who, metric, unit, f[key], iac=True)
    sym = data["symmetric"]
    res.notes.append(
        f"scenarios/nat.py: {data['rounds']} rounds in network namespaces (MASQUERADE NATs that drop "
        "unsolicited packets, no added link delay); direct / relayed RTT = "
        f"{data['ratio_rtt_direct_relayed']:.2f}; "
        f"relay bytes saved {data['relay_bytes_saved_fraction']:.1%}; "
        f"symmetric NATs: punch gave up after {sym['gave_up_after_ms']:.0f} ms, "
        f"{sym['delivered']}/{sym['sent']} delivered through the relay."
    )
    res.raw = data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 20 requests instead of 10 of 100")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    reason = unavailable()
    rounds, requests = (3, 20) if args.quick else (10, 100)
    data = {"unavailable": reason} if reason else asyncio.run(measure(rounds, requests))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    elif reason:
        print(f"nat: unavailable: {reason}")
    else:
        live.print_rendered(("nat",), MODULE, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
