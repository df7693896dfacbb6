"""The results section ``scale`` (``figures.py``): ``iac bench --only scale``
(``iac/bench/scenarios/scale.py``), one row per transport and peer count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iac.bench.reports.figures_results import Results, Sheet, not_ok, table

LABEL = {"tls": "TLS/TCP", "quic": "QUIC"}


def render_scale(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    (r,) = res
    out = [r.source_line(doc), ""]
    if why := not_ok(r, "scale"):
        return [*out, why]
    d = r.raw("scale")
    assert d is not None
    p = d["plan"]
    rows = []
    for s in d["steps"]:
        key = f"scale/{s['transport']}/{s['peers']}"
        b = s["burst"]
        p99 = "—" if b["p99_s"] is None else sheet.put(r, f"{key}/burst_p99_s", b["p99_s"])
        rows.append(
            [
                LABEL.get(s["transport"], s["transport"]),
                f"{s['peers']:,}",
                sheet.put(r, f"{key}/rss_mib", s["rss_mib"]),
                sheet.put(r, f"{key}/per_peer_kib", s["per_peer_kib"]),
                sheet.put(r, f"{key}/server_cpu_us", s["server_cpu_us_per_request"])
                + " + "
                + sheet.put(r, f"{key}/client_cpu_us", s["client_cpu_us_per_request"]),
                sheet.put(r, f"{key}/idle_cpu_percent", s["idle_cpu_percent"]),
                f"{b['ok']:,} / {b['failed']:,} ({b['retries']:,})",
                p99,
                sheet.put(r, f"{key}/burst_server_cpu_s", b["server_cpu_s"]),
            ]
        )
    head = [
        "transport",
        "peers",
        "server RSS MiB",
        "KiB per peer",
        "CPU µs/request server + clients",
        "idle CPU %",
        "dials ok / failed (retries)",
        "dial p99 s",
        "server CPU s, burst",
    ]
    limit = d["rlimit_nofile"]
    out.append(
        f"One server node per transport and peer count (the shipped configuration, `idle_timeout` off); "
        f"the peers, each with an identity of its own, spread over {p['procs']} client processes, dial all "
        f"at once (retries with backoff and jitter), then {p['requests']:,} requests at {p['in_flight']} "
        f"in flight round-robin; KiB per peer = the server's RSS growth over the empty server right after "
        f"that load step, divided by the peers; idle CPU over {p['idle_s']:g} s with every connection "
        f"held. RLIMIT_NOFILE {limit['soft']:,} (hard {limit['hard']:,}) allows {d['peers_allowed']:,} peers"
        + (
            f"; not run: {', '.join(f'{n:,}' for n in d['skipped_peers'])} peers."
            if d["skipped_peers"]
            else "."
        )
    )
    return [*out, "", *table(head, "lrrrrrrrr", rows), *_more(sheet, r, d)]


def _more(sheet: Sheet, r: Results, d: dict[str, Any]) -> list[str]:
    """The figures a run has when it recorded them: the dial burst's CPU on both sides, the bytes of
    the server's signed MESSAGE frames over the load step, the time until every connected peer
    handled a broadcast of the server node."""
    steps = [s for s in d["steps"] if "broadcast" in s]
    if not steps:
        return []
    rows = []
    for s in steps:
        key = f"scale/{s['transport']}/{s['peers']}"
        b, flood = s["burst"], s["broadcast"]
        took = flood.get("median_s")
        rows.append(
            [
                LABEL.get(s["transport"], s["transport"]),
                f"{s['peers']:,}",
                sheet.put(r, f"{key}/burst_server_cpu_s", b["server_cpu_s"])
                + " + "
                + sheet.put(r, f"{key}/burst_client_cpu_s", b.get("client_cpu_s", 0.0)),
                sheet.put(r, f"{key}/message_frame_bytes", s["message_frame_bytes"]),
                "—" if took is None else sheet.put(r, f"{key}/broadcast_ms", took * 1e3),
                f"{flood['reached_min']:,} of {flood['sent_to']:,}",
            ]
        )
    head = [
        "transport",
        "peers",
        "CPU s, burst: server + clients",
        "bytes per signed MESSAGE frame",
        "broadcast handled by all, ms",
        "peers reached (fewest)",
    ]
    corpus = d.get("corpus_frame_bytes") or {}
    plan = d["plan"]
    text = (
        f"Per step, the same run: the CPU seconds the dial burst took on the server and in the client "
        f"processes together; the mean size on the wire of the server node's signed MESSAGE frames (its "
        f"REPLYs to the load step's small requests); and the median over {plan.get('broadcasts', 0)} "
        f"broadcasts of the server node (the registry every peer is connected to) of the time from "
        f"`broadcast()` until the last connected peer verified it."
    )
    if corpus:
        text += (
            f" The corpus's signed MESSAGE frames (`scale.py bytes`): {corpus['shipped']:.0f} B with the "
            f"shipped dictionary, {corpus['derived']:.0f} B with a per-connection derived one, "
            f"{corpus['elided']:.0f} B with `from`/`to` elided (what a direct connection sends)."
        )
    text += (
        " The machine is shared with other work while these run: CPU and time figures are noisy; "
        "compare rows of the same run."
    )
    return ["", text, "", *table(head, "lrrrrr", rows)]
