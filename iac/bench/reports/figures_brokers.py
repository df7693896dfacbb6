"""The headline the README embeds: IAC against what users would pick instead (NATS, ZeroMQ, HTTP,
gRPC), bare and signed, each row saying what it secures, with ratios to IAC-TLS/TCP in one run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iac.bench.reports.figures_results import Results, Sheet, kind_of, not_ok, row_key, table

BASE = "IAC-TLS/TCP"
#: The rows of the headline, in order: the IAC transports, then what users would pick instead.
CONTENDERS = (
    "IAC-QUIC",
    "IAC-TLS/TCP",
    "IAC-UNIX",
    "NATS",
    "NATS+Ed25519",
    "ZeroMQ",
    "ZeroMQ+Ed25519",
    "HTTP+Ed25519 JSON",
    "HTTPS+Ed25519 JSON",
    "gRPC unary (no auth)",
)
REQUESTS = ("RTT p50, 1 in flight", "requests/s, 64 in flight", "server CPU per request, 64 in flight")
ONEWAY = ("one-way messages/s, two processes",)


def _block(sheet: Sheet, r: Results, scenario: str, metrics: tuple[str, ...]) -> list[str]:
    if why := not_ok(r, scenario):
        return [why]
    sc = r.scenario(scenario)
    assert sc is not None
    by: dict[tuple[str, str], dict[str, Any]] = {(x["contender"], x["metric"]): x for x in sc["rows"]}
    rows = []
    for who in CONTENDERS:
        if not any((who, m) in by for m in metrics):
            continue
        cells = [who, next((by[(who, m)].get("secures", "—") for m in metrics if (who, m) in by), "—")]
        for m in metrics:
            row, base = by.get((who, m)), by.get((BASE, m))
            if row is None:
                cells += ["—", "—"]
                continue
            key = row_key(scenario, row)
            cells.append(
                f"{sheet.put(r, key + '/median', row['median'], kind_of(row['unit']))} {row['unit']}"
            )
            ratio = row["median"] / base["median"] if base and base["median"] else None
            cells.append(sheet.put(r, f"{key}/vs {BASE}", ratio, "ratio"))
        rows.append(cells)
    if not rows:
        return [f"No {' or '.join(metrics)} in this run."]
    head = ["contender", "secures"]
    for m in metrics:
        head += [m, f"× {BASE}"]
    out = table(head, "ll" + "rr" * len(metrics), rows)
    skipped = sc.get("skipped", {})
    return out + [f"- {who}: skipped: {why}" for who, why in skipped.items()]


def render_brokers(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    """Requests (1 and 64 in flight, server CPU) and one-way messages between two processes on
    loopback, every contender's figure and its ratio to IAC-TLS/TCP from the same run."""
    (r,) = res
    out = [r.source_line(doc), "", "Requests, a server and a client process on loopback:", ""]
    out += _block(sheet, r, "requests", REQUESTS)
    out += ["", "One-way messages, a server and a client process on loopback:", ""]
    out += _block(sheet, r, "oneway", ONEWAY)
    return out
