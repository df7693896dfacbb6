"""Requests under loss and delay (``iac bench --only loss``, as root).

``run_loss``: 64 concurrent requests, again and again, between two network namespaces joined by
:class:`iac.testing.netem.Link` (20 ms RTT) at each loss level, IAC over QUIC and TLS/TCP and
HTTP/1.1 (with aiohttp), in turns; at 0 % loss also the IP bytes on the wire per request.
benchmarks/README.md, "Loss and delay"."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iac.bench.contenders.endpoints import NAMES, have_aiohttp, start_pair
from iac.bench.harness.process import Pair
from iac.bench.harness.results import Result, downsample, turn_order
from iac.bench.harness.stats import median, percentile

# --- the loss scenario --------------------------------------------------------------------------


@dataclass(frozen=True)
class LossPlan:
    losses: tuple[float, ...] = (0.0, 0.01, 0.03)
    one_way_delay: float = 0.010
    rounds: int = 5
    batches: int = 4  # 64-request batches per turn
    concurrency: int = 64


QUICK_PLAN = LossPlan(rounds=3, batches=2)
FULL_PLAN = LossPlan(rounds=7, batches=6)


def loss_contenders() -> list[str]:
    out = ["iac-quic", "iac-tls"]
    if have_aiohttp():
        out.append("http")
    return out


def run_loss(
    plan: LossPlan, progress: Callable[[str], None] = lambda s: None, seed: int = 7
) -> dict[str, Any]:
    """The loss scenario. Returns ``{"status": "ok"|"skipped", "reason", "levels": [...]}``."""
    from iac.testing import netem
    from iac.testing.relay import Impairment

    reason = netem.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    contenders = loss_contenders()
    notes = [] if have_aiohttp() else ["HTTP left out: aiohttp is not installed (pip install aiohttp)"]
    pairs: dict[str, Pair] = {}
    levels: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iacb-loss-") as tmp:
        try:
            link = netem.Link(Impairment(delay=plan.one_way_delay), seed=seed)
            link.start()
        except netem.LabError as exc:
            return {"status": "skipped", "reason": f"link emulator unavailable: {exc}"}
        try:
            for c in contenders:
                progress(f"starting {NAMES[c]} in the namespaces")
                pairs[c] = start_pair(
                    c,
                    netem.ADDR_B,
                    Path(tmp),
                    wrap_server=lambda a: link.command("b", a),
                    wrap_client=lambda a: link.command("a", a),
                )
            n = plan.concurrency * plan.batches
            for li, loss in enumerate(plan.losses):
                link.set_impairment(Impairment(delay=plan.one_way_delay, loss=loss))
                for c in contenders:  # warm-up at this loss level
                    pairs[c].run(plan.concurrency, plan.concurrency)
                figs: dict[str, dict[str, list[float]]] = {
                    k: {c: [] for c in contenders}
                    for k in ("p50_ms", "p99_ms", "wire_bytes_per_request", "samples_ms")
                }
                p50, p99, wire, samples = figs.values()
                errors = dict.fromkeys(contenders, 0)
                for r, order in enumerate(turn_order(contenders, plan.rounds)):
                    progress(f"loss {loss:.0%}: round {r + 1}/{plan.rounds} ({li + 1}/{len(plan.losses)})")
                    for c in order:
                        before = link.stats()
                        res = pairs[c].run(plan.concurrency, n)
                        after = link.stats()
                        lat = res["lat_us"]
                        errors[c] += res["errors"]
                        if lat:
                            p50[c].append(median(lat) / 1e3)
                            p99[c].append(percentile(lat, 99) / 1e3)
                            samples[c].extend(x / 1e3 for x in lat)
                        moved = sum(after[d]["bytes"] - before[d]["bytes"] for d in after)
                        wire[c].append(moved / n)
                levels.append({"loss": loss, **figs, "errors": errors, "link": link.stats()})
        finally:
            for pair in pairs.values():
                pair.close()
            link.close()
    return {
        "status": "ok",
        "reason": None,
        "contenders": contenders,
        "names": {c: NAMES[c] for c in contenders},
        "plan": {
            "losses": list(plan.losses),
            "one_way_delay_s": plan.one_way_delay,
            "rounds": plan.rounds,
            "requests_per_turn": plan.concurrency * plan.batches,
            "concurrency": plan.concurrency,
        },
        "levels": levels,
        "notes": notes,
    }


def loss_rows(res: Result, out: dict[str, Any]) -> None:
    """The suite's rows of a run of ``scenarios/loss.py``."""
    plan, names = out["plan"], out["names"]
    res.baseline = names["http"] if "http" in names else names["iac-tls"]
    p99_series: dict[str, dict[str, float]] = {}
    for level in out["levels"]:
        pc = f"{level['loss']:.0%}"
        for c, label in names.items():
            if level["p50_ms"][c]:
                res.add(label, f"p50 at {pc} loss", "ms", level["p50_ms"][c])
                res.add(label, f"p99 at {pc} loss", "ms", level["p99_ms"][c])
                p99_series.setdefault(label, {})[pc] = median(level["p99_ms"][c])
            if level["errors"][c]:
                res.notes.append(f"{label} at {pc} loss: {level['errors'][c]} requests failed")
            if level["loss"] == 0.0:
                wire = level["wire_bytes_per_request"][c]
                res.add(label, "IP bytes on the wire per request (0 % loss)", "B", wire)
        if level["loss"] == max(plan["losses"]):
            res.series["latency_cdf_ms_at_max_loss"] = {
                names[c]: downsample(v) for c, v in level["samples_ms"].items() if v
            }
        del level["samples_ms"]
    res.series["p99_vs_loss_ms"] = p99_series
    res.notes.append(
        f"64 concurrent independent requests, {out['plan']['requests_per_turn']} per turn, "
        f"{plan['rounds']} rounds per loss level; 20 ms RTT ({plan['one_way_delay_s'] * 1e3:.0f} ms each "
        'way); loss applies to every IP packet in each direction (benchmarks/README.md, "Loss and delay").'
    )
    res.notes.extend(out["notes"])
    res.raw = out
