"""The results section ``scale`` (``figures.py``): ``iac bench --only scale``
(``iac/bench/scenarios/scale.py``), one row per transport and peer count."""

from __future__ import annotations

from typing import Any

from iac.bench.reports.figures_results import Results, Sheet, section, table

LABEL = {"tls": "TLS/TCP", "quic": "QUIC"}
CORPUS = ("direct_frame_bytes", "relayed_frame_bytes")


@section("scale", scenario="scale")
def render_scale(sheet: Sheet, r: Results) -> list[str]:
    d = r.raw("scale")
    assert d is not None
    p = d["plan"]
    rows = []
    for s in d["steps"]:
        key = f"scale/{s['transport']}/{s['peers']}"
        b = s["burst"]
        p99 = "—" if b["p99_s"] is None else sheet.put(r, f"{key}/burst_p99_s", b["p99_s"])
        if b.get("p99_first_attempt_s") is not None:  # the dials that took no retry
            p99 += f" ({sheet.put(r, f'{key}/burst_p99_first_s', b['p99_first_attempt_s'])})"
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
                f"{b['ok']:,} / {b['failed']:,} ({b['retries']:,})"
                + (f", {b['at_once']} at a time per process" if b.get("at_once") else ""),
                p99,
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
        "dial p99 s (first attempts)",
    ]
    limit = d["rlimit_nofile"]
    out = [
        f"One server node per transport and peer count (the shipped configuration, `idle_timeout` off, "
        f"relaying unicast FORWARDs); the peers, each with an identity of its own, spread over {p['procs']} "
        f"client processes, dial all at once (retries with backoff and jitter; a step marked so: that many "
        f"at a time), then {p['requests']:,} requests (at least one per peer) at {p['in_flight']} "
        f"in flight round-robin; KiB per peer = the server's RSS growth over the empty server right after "
        f"that load step, divided by the peers; idle CPU over {p['idle_s']:g} s with every connection "
        f"held. RLIMIT_NOFILE {limit['soft']:,} (hard {limit['hard']:,}) allows {d['peers_allowed']:,} "
        f"peers; not run: {', '.join(f'{n:,}' for n in d['skipped_peers']) or 'none'}."
    ]
    return [*out, "", *table(head, "lrrrrrrr", rows), *_more(sheet, r, d)]


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
        took, corpus = flood.get("median_s"), s.get("corpus") or {}
        relay = (s.get("relayed_broadcast") or {}).get("median_s")
        rows.append(
            [
                LABEL.get(s["transport"], s["transport"]),
                f"{s['peers']:,}",
                sheet.put(r, f"{key}/burst_server_cpu_s", b["server_cpu_s"])
                + " + "
                + sheet.put(r, f"{key}/burst_client_cpu_s", b.get("client_cpu_s", 0.0)),
                sheet.put(r, f"{key}/message_frame_bytes", s["message_frame_bytes"]),
                "—" if took is None else sheet.put(r, f"{key}/broadcast_ms", took * 1e3),
                "—" if relay is None else sheet.put(r, f"{key}/relayed_broadcast_ms", relay * 1e3),
                f"{flood['reached_min']:,} of {flood['sent_to']:,}",
                " / ".join(sheet.put(r, f"{key}/corpus_{k}", corpus[k]) for k in CORPUS if corpus.get(k))
                or "—",
            ]
        )
    head = [
        "transport",
        "peers",
        "CPU s, burst: server + clients",
        "bytes per signed MESSAGE frame",
        "broadcast handled by all, ms",
        "a peer's broadcast relayed, ms",
        "server's broadcast reached (fewest)",
        "corpus frame B: direct / relayed",
    ]
    c, n = d.get("corpus_frame_bytes") or {}, d["plan"].get("broadcasts", 0)
    text = (
        "Per step, the same run: the CPU seconds of the dial burst on the server and in the clients; the "
        "mean size on the wire of the server's signed MESSAGE frames (its REPLYs to the load step's small "
        f"requests); the median over {n} broadcasts of the server node (which every peer is connected "
        "to), and over as many of one peer's that the server relays to the others, of the time until the "
        "last peer verified it; the corpus's lines in requests whose REPLYs echo them (direct: `from`/`to` "
        "elided) and in messages the server relays from one peer to another (a FORWARD frame: the origin's "
        "whole signed message and the path), the mean frame as the receiving peer read it."
    )
    if c:
        text += (
            f" The corpus alone (`tools/scale_probe.py bytes`): {c['shipped']:.0f} B with the shipped "
            f"dictionary, {c['derived']:.0f} B with a per-connection derived one, {c['elided']:.0f} B elided."
        )
    text += " The machine is shared with other work: CPU and time figures are noisy; compare rows of one run."
    return ["", text, "", *table(head, "lrrrrrrr", rows)]
