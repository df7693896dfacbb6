"""The headline the README embeds: IAC against what users would pick instead (NATS, ZeroMQ, HTTP,
gRPC), bare and signed, each row saying what it secures, with ratios to IAC-TLS/TCP in one run."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

from iac.bench.harness.paths import ROOT
from iac.bench.reports.figures_results import Results, Sheet, kind_of, not_ok, renderer, row_key, table

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
#: The README is read at 100 characters a line: its headline is the short form (tests/test_readme.py).
WIDTH = 100
#: The README's figures: RTT and requests/s, under short heads (the sentence above says the rest).
SHORT = {"RTT p50, 1 in flight": "RTT p50", "requests/s, 64 in flight": "throughput"}
_ENCRYPTION, _AUTH = "encryption: ", "per-message authentication: "


def _block(
    sheet: Sheet, r: Results, scenario: str, metrics: tuple[str, ...], short: bool = False
) -> list[str]:
    if why := not_ok(r, scenario):
        return [why]
    sc = r.scenario(scenario)
    assert sc is not None
    by: dict[tuple[str, str], dict[str, Any]] = {(x["contender"], x["metric"]): x for x in sc["rows"]}
    # The short form names a metric's unit once, in its head, when every row has the same one.
    units = {m: {x["unit"] for (_, xm), x in by.items() if xm == m} for m in metrics}
    in_head = {m for m in metrics if short and len(units[m]) == 1}
    rows = []
    for who in CONTENDERS:
        if not any((who, m) in by for m in metrics):
            continue
        secures = next((by[(who, m)].get("secures", "—") for m in metrics if (who, m) in by), "—")
        cells = [who, *_secures(secures)] if short else [who, secures]
        for m in metrics:
            row, base = by.get((who, m)), by.get((BASE, m))
            if row is None:
                cells += ["—", "—"]
                continue
            key = row_key(scenario, row)
            figure = sheet.put(r, key + "/median", row["median"], kind_of(row["unit"]))
            cells.append(figure if m in in_head else f"{figure} {row['unit']}")
            ratio = row["median"] / base["median"] if base and base["median"] else None
            cells.append(sheet.put(r, f"{key}/vs {BASE}", ratio, "ratio"))
        rows.append(cells)
    if not rows:
        return [f"No {' or '.join(metrics)} in this run."]
    head = ["contender", "encryption", "per-message authentication"] if short else ["contender", "secures"]
    for m in metrics:
        unit = f" ({next(iter(units[m]))})" if m in in_head else ""
        head += [SHORT.get(m, m) + unit, "×"] if short else [m, f"× {BASE}"]
    out = table(head, "l" * (len(head) - 2 * len(metrics)) + "rr" * len(metrics), rows)
    for who, why in sc.get("skipped", {}).items():
        line = f"- {who}: skipped: {why}"
        out += textwrap.wrap(line, WIDTH, subsequent_indent="  ") if short else [line]
    return out


def _secures(text: str) -> tuple[str, str]:
    """``(encryption, per-message authentication)`` of a row's ``secures``."""
    enc, sep, auth = text.partition("; ")
    if enc.startswith(_ENCRYPTION) and sep and auth.startswith(_AUTH):
        return enc.removeprefix(_ENCRYPTION), auth.removeprefix(_AUTH)
    return text, "—"


def _short_source(r: Results, doc: Path) -> tuple[list[str], str]:
    """:meth:`Results.source_line` in lines of at most :data:`WIDTH` characters (the file as a
    reference link, the command as a code span that may wrap), and the link's definition."""
    text = r.source_line(doc)
    link = os.path.relpath(ROOT / r.path, doc.parent)
    text = text.replace(f"[`{r.path}`]({link})", f"[`{r.path}`][headline-source]")
    lines = textwrap.wrap(text, WIDTH, break_on_hyphens=False, break_long_words=False)
    return lines, f"[headline-source]: {link}"


@renderer("brokers")
def render_brokers(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    """Requests (1 and 64 in flight, server CPU) and one-way messages between two processes on
    loopback, every contender's figure and its ratio to IAC-TLS/TCP from the same run."""
    (r,) = res
    if doc.name == "README.md" and doc.parent == ROOT:
        return _readme(sheet, doc, r)
    out = [r.source_line(doc), "", "Requests, a server and a client process on loopback:", ""]
    out += _block(sheet, r, "requests", REQUESTS)
    out += ["", "One-way messages, a server and a client process on loopback:", ""]
    out += _block(sheet, r, "oneway", ONEWAY)
    return out


def _readme(sheet: Sheet, doc: Path, r: Results) -> list[str]:
    """The README's headline in lines of at most :data:`WIDTH` characters: what each contender
    secures, its RTT with 1 request in flight and its requests/s with 64 (the server CPU and the
    one-way figures are in benchmarks/RESULTS.md)."""
    source, definition = _short_source(r, doc)
    intro = [
        "Requests between a server and a client process on loopback: RTT p50 with 1 in flight,",
        "requests/s with 64 in flight, × the ratio to IAC-TLS/TCP in the same run:",
    ]
    short = tuple(SHORT)
    return [*source, "", *intro, "", *_block(sheet, r, "requests", short, short=True), "", definition]
