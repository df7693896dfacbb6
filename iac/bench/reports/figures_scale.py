"""The results section ``scale`` (``figures.py``): ``iac bench --only scale``
(``iac/bench/scenarios/scale.py``), one row per transport and peer count."""

from __future__ import annotations

from pathlib import Path

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
    return [*out, "", *table(head, "lrrrrrrrr", rows)]
