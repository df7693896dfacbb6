"""What each marked section shows: the suite's tables, and the node, mesh, NAT and MCP scripts'
(the other sections register in the modules imported here); ``RENDERERS[name](sheet, document,
results)`` returns its Markdown lines, every figure put on ``sheet`` (``figures_results.py``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# Each of these registers its sections in RENDERERS.
from iac.bench.reports import figures_brokers, figures_cc, figures_profile, figures_scale  # noqa: F401
from iac.bench.reports.figures_results import (
    CODEC_RATIO_TARGET,
    DICT_SAVING_TARGET,
    Results,
    Sheet,
    headline,
    kind_of,
    node_targets,
    not_ok,
    renderer,
    row_key,
    section,
    table,
    target_table,
    targets,
    verdict,
)
from iac.bench.reports.figures_results import RENDERERS as RENDERERS

# --- the suite (iac bench) ----------------------------------------------------------------------


@section("suite-headline")
def suite_headline(sheet: Sheet, r: Results) -> list[str]:
    """The suite's headline table (``headline``: its pick of metrics per scenario)."""
    rows = []
    for h in headline(r.data):  # its pick of metrics now, from the rows the file keeps
        key, kind = row_key(h["scenario"], h), kind_of(h["unit"])
        base = f"{h['scenario']}/{h['baseline']}/{h['metric']}/median"
        best = "—"
        if h["best_other"] is not None:
            bkey = f"{h['scenario']}/{h['best_other']}/{h['metric']}/median"
            best = f"{h['best_other']} ({sheet.put(r, bkey, h['best_other_median'], kind)})"
        rows.append(
            [
                h["scenario"],
                h["metric"],
                h["contender"],
                f"{sheet.put(r, key + '/median', h['median'], kind)} {h['unit']}",
                h["baseline"],
                sheet.put(r, base, h["baseline_median"], kind),
                sheet.put(r, key + "/ratio", h["ratio"], "ratio"),
                "ahead" if h["ahead"] else "**behind**",
                best,
            ]
        )
    head = ["scenario", "metric", "IAC", "median", "baseline", "baseline median", "× baseline", "IAC"]
    out = table([*head, "best other"], "lllrlrrll", rows)
    missing = [why for s in r.data["scenarios"] if (why := not_ok(r, s["name"]))]
    return out + (["", "Not in this table:", "", *(f"- {m}" for m in missing)] if missing else [])


def scenario_table(sheet: Sheet, r: Results, name: str) -> list[str]:
    """Every row of one suite scenario, or why it has none."""
    if why := not_ok(r, name):
        return [why]
    sc = r.scenario(name)
    assert sc is not None
    rows = []
    for row in sc["rows"]:
        key = row_key(name, row)
        ratio = "—" if row["ratio"] is None else sheet.put(r, key + "/ratio", row["ratio"], "ratio")
        if row["ratio"] is not None and row["baseline"] != sc["baseline"]:
            ratio += f" (vs {row['baseline']})"
        if row["min"] == row["max"]:  # one figure, not a spread (bytes of a fixed corpus)
            span = sheet.put(r, key + "/median", row["median"], kind_of(row["unit"]))
        else:
            span = sheet.span(r, key, row, kind_of(row["unit"]))
        rows.append([row["metric"], row["contender"], span, row["unit"], ratio])
    rounds = sorted({row["n"] for row in sc["rows"]})
    over = f" of {'/'.join(map(str, rounds))} rounds" if rounds != [1] else ""
    note = f"Baseline: {sc['baseline']}; median [min .. max]{over}."
    head = ["metric", "contender", "median [min .. max]", "unit", "× baseline"]
    return [note, "", *table(head, "llrlr", rows)]


@section("suite-scenarios")
def suite_scenarios(sheet: Sheet, r: Results) -> list[str]:
    out = []
    for sc in r.data["scenarios"]:
        out += [f"**{sc['name']}** — {sc['title']}", "", *scenario_table(sheet, r, sc["name"]), ""]
    return out[:-1]


@section("transport")
def transport(sheet: Sheet, r: Results) -> list[str]:
    """The suite's scenarios that run ``iac/bench/scenarios/transport.py``, and its targets."""
    out = []
    for name, what in (
        ("rtt", "Request/reply over one connection"),
        ("setup", "Dial to the first delivered message"),
        ("oneway", "One-way IAC-QUIC messages"),
    ):
        out += [f"{what} (`{name}`):", "", *scenario_table(sheet, r, name), ""]
    return [*out, *target_table(sheet, targets([r], areas=("rtt", "setup", "oneway")))]


# --- codec and bytes (the suite runs codec.py) ---------------------------------------------------

_SEND, _RECEIVE = "send: encode vs sign (µs/msg)", "receive: decode vs verify (µs/msg)"
CODEC_ROWS = (  # contender, metric, the codec's operation, as the table names it
    ("IAC codec", _SEND, "encode", "IAC encode (build, serialize, sign, zstd, frame)"),
    ("bare PyNaCl Ed25519", _SEND, "sign", "bare PyNaCl sign, same bytes"),
    ("IAC codec", _RECEIVE, "decode", "IAC decode (frame, zstd, scan, parse, verify)"),
    ("bare PyNaCl Ed25519", _RECEIVE, "verify", "bare PyNaCl verify, same bytes"),
)

SIZE_LABELS = (
    ("payload_raw", "payload_json, raw"),
    ("payload_zstd", "payload_json, zstd level 3, no dictionary"),
    ("payload_zstd_dict", "payload_json, zstd + shipped dictionary"),
    ("frame_raw", "IAC MESSAGE frame, raw (signed, both AgentIds)"),
    ("frame_zstd", "IAC MESSAGE frame, zstd without dictionary"),
    ("frame_zstd_dict", "IAC MESSAGE frame, zstd + dictionary (as sent)"),
    ("http_json_sha256", "HTTP/1.1 POST + JSON + SHA-256 field"),
)


def codec_rows(sheet: Sheet, r: Results, spans: bool) -> list[list[str]]:
    speed = (r.raw("codec") or {})["speed"]
    rows = []
    for who, metric, op, label in CODEC_ROWS:
        key, s = f"codec/{who}/{metric}", speed["us_per_msg"][op]
        us = sheet.span(r, key, s) if spans else sheet.put(r, key + "/median", s["median"])
        rows.append([label, us, sheet.put(r, f"codec/msgs_per_s/{op}", speed["msgs_per_s"][op])])
    return rows


def codec_ratio_line(sheet: Sheet, r: Results) -> str:
    sp = (r.raw("codec") or {})["speed"]
    median = sheet.put(r, "codec/ratio/median", sp["ratio"], "ratio")
    lo, hi = (sheet.put(r, f"codec/ratio/{k}", sp[f"ratio_{k}"], "ratio") for k in ("min", "max"))
    return (
        "Codec rate over bare sign + verify, (t_sign + t_verify) / (t_encode + t_decode), median of "
        f"{sp['repetitions']} repetitions of {sp['messages']} messages: **{median}** [{lo} .. {hi}] "
        f"(target ≥ {CODEC_RATIO_TARGET:.2f}: {verdict(sp['ratio'] >= CODEC_RATIO_TARGET)})."
    )


def sizes(r: Results) -> dict[str, Any]:
    out = r.raw("bytes")
    assert out is not None, "the bytes scenario did not run"
    return out


#: codec.py's size rows that the suite's ``bytes`` scenario also shows, by its contender names.
BYTES_METRIC = "bytes per message (test.jsonl)"
SIZE_ROWS = {
    "frame_zstd_dict": "IAC frame, zstd + dictionary",
    "frame_zstd": "IAC frame, zstd without dictionary",
    "frame_raw": "IAC frame, uncompressed",
    "http_json_sha256": "HTTP/1.1 POST + JSON + SHA-256",
}


def mean_bytes(sheet: Sheet, r: Results, k: str) -> str:
    """Mean bytes per message of a codec.py size row, under the suite row's key when it has one."""
    key = f"bytes/{k}/mean"
    if k in SIZE_ROWS:
        key = row_key("bytes", {"contender": SIZE_ROWS[k], "metric": BYTES_METRIC})
        key += "/median"
    return sheet.put(r, key, sizes(r)["rows"][k]["mean"], "bytes")


def saving(sheet: Sheet, r: Results) -> str:
    return sheet.put(r, "bytes/saving_dict", sizes(r)["payload_saving_dict"], "pct")


def size_sentence(sheet: Sheet, r: Results) -> str:
    s = sizes(r)
    frame, http = s["rows"]["frame_zstd_dict"]["mean"], s["rows"]["http_json_sha256"]["mean"]
    plain = sheet.put(r, "bytes/saving_plain", s["payload_saving_plain_zstd"], "pct")
    frame_key = row_key("bytes", {"contender": SIZE_ROWS["frame_zstd_dict"], "metric": BYTES_METRIC})
    return (
        f"Bytes per message over the {s['messages']} payloads of `test.jsonl`: `payload_json` "
        f"{mean_bytes(sheet, r, 'payload_raw')} B raw, {mean_bytes(sheet, r, 'payload_zstd')} B with zstd "
        f"alone, **{mean_bytes(sheet, r, 'payload_zstd_dict')} B with the shipped dictionary** (saving "
        f"{saving(sheet, r)}; zstd alone {plain}). A whole signed MESSAGE frame is "
        f"{mean_bytes(sheet, r, 'frame_zstd_dict')} B against {mean_bytes(sheet, r, 'http_json_sha256')} B "
        "for the same content as an HTTP/1.1 POST with JSON and a SHA-256 field "
        f"({sheet.put(r, frame_key + '/ratio', frame / http, 'ratio')}×)."
    )


@section("codec", scenario="codec")
def codec(sheet: Sheet, r: Results) -> list[str]:
    out = table(["", "µs/msg", "msgs/s"], "lrr", codec_rows(sheet, r, False))
    return [*out, "", codec_ratio_line(sheet, r), "", size_sentence(sheet, r)]


@section("codec-results", scenario="codec")
def codec_results(sheet: Sheet, r: Results) -> list[str]:
    s = sizes(r)
    head = ["operation", "µs/msg, median [min .. max]", "msgs/s"]
    out = [*table(head, "lrr", codec_rows(sheet, r, True)), "", codec_ratio_line(sheet, r)]
    rows = [
        [
            label,
            mean_bytes(sheet, r, k),
            f"{s['rows'][k]['total']:,}",
            sheet.put(r, f"bytes/{k}/vs_payload", s["rows"][k]["vs_payload_raw"], "pct"),
        ]
        for k, label in SIZE_LABELS
    ]
    out += ["", *table(["bytes per message", "mean", "total", "vs payload"], "lrrr", rows), ""]
    hdr = sheet.put(r, "bytes/zstd_frame_header", s["zstd_frame_header_bytes_mean"], "bytes")
    blk = sheet.put(r, "bytes/zstd_block_header", s["zstd_block_header_bytes_mean"], "bytes")
    return [
        *out,
        size_sentence(sheet, r),
        "",
        f"zstd's own overhead per compressed message: {hdr} B of frame header and {blk} B of block header.",
    ]


@renderer("dictionary-saving")
def render_dictionary_saving(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    (r,) = res
    return [
        f"mean payload {mean_bytes(sheet, r, 'payload_raw')} bytes; with the shipped dictionary, each "
        f"compressed alone, {mean_bytes(sheet, r, 'payload_zstd_dict')} bytes: a saving of "
        f"**{saving(sheet, r)}** (target ≥ {DICT_SAVING_TARGET:.0%}).",
        "",
        r.source_line(doc),
    ]


@section("broadcast", scenario="broadcast")
def broadcast(sheet: Sheet, r: Results) -> list[str]:
    """Completion per number of agents, every contender, from the suite's ``broadcast`` scenario."""
    sc = r.scenario("broadcast")
    assert sc is not None
    counts = sc["raw"]["sizes"]
    by = {(x["contender"], x["metric"]): x for x in sc["rows"]}
    who = list(dict.fromkeys(x["contender"] for x in sc["rows"] if x["metric"].startswith("completion")))
    rows = []
    for name in who:
        cells = [name]
        for n in counts:
            x = by[(name, f"completion, {n} agents")]
            key = row_key("broadcast", x)
            cell = sheet.put(r, key + "/median", x["median"])
            if x["ratio"] is not None:
                cell += f" ({sheet.put(r, key + '/ratio', x['ratio'], 'ratio')}×)"
            cells.append(cell)
        rows.append(cells)
    head = ["completion, ms (× baseline)", *(f"{n} agents" for n in counts)]
    note = f"Baseline: {sc['baseline']}; median of {sc['rows'][0]['n']} rounds."
    return [note, "", *table(head, "l" + "r" * len(counts), rows)]


# --- scenarios/node.py and scenarios/mesh.py ------------------------------------------------------

NODE_LABELS = {
    "iac-quic": "IAC over QUIC (aioquic)",
    "iac-quic-qh3": "IAC over QUIC (qh3)",
    "iac-tls": "IAC over TLS/TCP",
    "iac-unix": "IAC over UNIX",
    "http-sha256": "HTTP + JSON + SHA-256",
    "http-ed25519": "HTTP + Ed25519 JSON (the reference)",
    "http-ed25519-tls": "HTTPS + Ed25519 JSON",
    "http-ed25519-unix": "HTTP + Ed25519 JSON over UNIX",
    "grpc": "gRPC (aio, unary, no auth)",
}


@section("node", spans=False)
@section("node-results", spans=True)
def node(sheet: Sheet, r: Results, spans: bool) -> list[str]:
    cfg, contenders = r.data["config"], r.data["contenders"]

    def cell(name: str, k: str) -> str:
        s = contenders[name][k]
        return sheet.span(r, f"{name}/{k}", s) if spans else sheet.put(r, f"{name}/{k}/median", s["median"])

    def num(name: str, k: str) -> str:
        return sheet.put(r, f"{name}/{k}", contenders[name][k])

    rows = [
        [
            NODE_LABELS.get(name, name),
            *(cell(name, k) for k in ("rtt_p50_us", "rtt_p99_us", "requests_per_s_at_64")),
            " + ".join(cell(name, f"{side}_cpu_us_per_request_at_64") for side in ("server", "client")),
            num(name, "bytes_per_request"),
        ]
        for name in contenders
    ]
    head = ["contender", "p50 µs", "p99 µs", "req/s at 64", "CPU µs/req server + client", "bytes/request"]
    out = [
        f"{cfg['reps']} repetitions, each {cfg['sequential_per_rep']} sequential requests (RTT) and "
        f"{cfg['concurrent_per_rep']} at {cfg['in_flight']} in flight (requests/s, CPU); bytes over "
        f"{cfg['bytes_requests']} sequential requests.",
        "",
        *table(head, "lrrrrr", rows),
    ]
    if spans:
        rows = [
            [
                name,
                c["transport"],
                *(num(name, k) for k in ("bytes_up", "bytes_down", "bytes_per_request", "setup_bytes")),
                "—" if c["iac_frame_bytes_per_request"] is None else num(name, "iac_frame_bytes_per_request"),
            ]
            for name, c in contenders.items()
        ]
        head = ["contender", "transport", "up", "down", "total", "setup", "IAC frames"]
        out += ["", "Bytes at the socket per request (setup: until the first reply):", ""]
        out += table(head, "llrrrrr", rows)
    found = node_targets(r, with_info=spans)
    rows = [
        [t.what, t.limit_text(), t.shown(sheet), "—" if t.limit is None else verdict(t.met)] for t in found
    ]
    out += ["", f"Ratios of medians against `{cfg['reference']}` (or the baseline named):", ""]
    return out + table(["IAC / baseline", "target", "ratio", "verdict"], "llrl", rows)


@section("mesh", full=False)
@section("mesh-results", full=True)
def mesh(sheet: Sheet, r: Results, full: bool) -> list[str]:
    d = r.data
    relay = d["relay"]
    direct, via = (sheet.put(r, f"relay/{k}", relay[k]) for k in ("direct", "via_relay"))
    rows = [
        [
            "DELEGATE_TASK requests/s, 32 in flight over TLS: direct / through one relay",
            f"{direct} / {via} ({sheet.put(r, 'relay/ratio', relay['ratio'], 'ratio')}×)",
        ]
    ]
    if full:
        for b in d["broadcast"]:
            n = b["nodes"]
            med = sheet.put(r, f"broadcast/{n}/median_ms", b["median_ms"])
            top = sheet.put(r, f"broadcast/{n}/max_ms", b["max_ms"])
            what = f"broadcast (mesh flood alone), {n} agents, {b['links']} links: last agent reached"
            rows.append([what, f"{med} ms median (max {top})"])
        f = d["file"]
        bare = f["bare_aioquic_mb_s"]
        rows.append(
            [f"file {f['mib']} MiB, bare aioquic single stream", f"{sheet.put(r, 'file/bare', bare)} MB/s"]
        )
        for k, v in f.items():
            if m := re.fullmatch(r"iac_(\w+)_window(\d+)_mb_s", k):
                what = (
                    f"file {f['mib']} MiB, IAC `send_file` over {m.group(1)}, {m.group(2)} chunks in flight"
                )
                ratio = sheet.put(r, f"file/{k}/ratio", v / bare, "ratio")
                rows.append([what, f"{sheet.put(r, f'file/{k}', v)} MB/s ({ratio}× bare)"])
    return table(["", "figure"], "lr", rows)


# --- through NATs -------------------------------------------------------------------------------


@section("nat")
def nat(sheet: Sheet, r: Results) -> list[str]:
    d = r.data
    f, sym = d["figures"], d["symmetric"]
    relayed = sheet.put(r, "rtt_relayed_ms/median", f["rtt_relayed_ms"]["median"])
    direct = sheet.put(r, "rtt_direct_ms/median", f["rtt_direct_ms"]["median"])
    ratio = sheet.put(r, "ratio_rtt_direct_relayed", d["ratio_rtt_direct_relayed"], "ratio")
    b_rel = sheet.put(r, "relay_bytes/relayed", f["relay_bytes_per_request_relayed"]["median"], "bytes")
    b_dir = sheet.put(r, "relay_bytes/direct", f["relay_bytes_per_request_direct"]["median"], "bytes")
    saved = sheet.put(r, "relay_bytes/saved", d["relay_bytes_saved_fraction"], "pct")
    gave_up = sheet.put(r, "symmetric/gave_up_after_ms", sym["gave_up_after_ms"])
    n = d["requests_per_path"]
    rows = [
        ["time to a direct path: PUNCH over the relay and back, PUNCH_SYNC, punch, QUIC handshake, HELLO",
         f"{sheet.span(r, 'to_direct_ms', f['to_direct_ms'])} ms"],
        [f"request RTT A → B, {d['payload_bytes']} B, through the relay (median of {n}, median over rounds)",
         f"{relayed} ms"],
        [f"request RTT A → B, {d['payload_bytes']} B, direct", f"{direct} ms ({ratio}× relayed)"],
        ["bytes the relay receives per request (IP included): relayed / direct",
         f"{b_rel} / {b_dir} B (saved {saved})"],
        ["symmetric NATs (`--random-fully`): direct path?",
         f"{'yes' if sym['direct'] else 'no'}; gave up after {gave_up} ms; "
         f"{sym['delivered']}/{sym['sent']} delivered through the relay"],
    ]  # fmt: skip
    head = f"{d['rounds']} rounds, fresh nodes each; links without added delay (the paths share them)"
    return [head, "", *table(["", "figure"], "lr", rows)]


# --- MCP tool calls (iac/bench/scenarios/mcp_calls.py) -----------------------------------------------------


@section("mcp")
def mcp(sheet: Sheet, r: Results) -> list[str]:
    d = r.data
    base = "MCP streamable HTTP"
    rows = []
    for name, m in d["medians"].items():

        def span(k: str, name: str = name, m: dict[str, float] = m) -> str:
            values = [rd[name][k] for rd in d["rounds"]]
            return sheet.span(r, f"{name}/{k}", {"median": m[k], "min": min(values), "max": max(values)})

        p50, rate = span("p50_ms") + " ms", span("calls_per_s")
        if name != base:
            ratios = d["ratios"][name]
            p50 += f" ({sheet.put(r, f'{name}/p50_vs_http', ratios['p50_vs_http'], 'ratio')}×)"
            rate += (
                f" ({sheet.put(r, f'{name}/calls_per_s_vs_http', ratios['calls_per_s_vs_http'], 'ratio')}×)"
            )
        rows.append([name, p50, rate])
    sz = d["sizes"]
    head = (
        f"{sz['rounds']} rounds of {sz['sequential']} sequential calls (p50) and {sz['concurrent']} calls "
        f"with {d['in_flight']} in flight (calls/s); median [min .. max] over rounds, ratio to {base}"
    )
    return [head, "", *table(["transport", "tool-call p50", "calls/s"], "lrr", rows)]


# --- where IAC is behind ---------------------------------------------------------------------------


@renderer("behind")
def render_behind(sheet: Sheet, doc: Path, res: list[Results]) -> list[str]:
    """Every target with its verdict, then the suite's headline figures where IAC is behind."""
    out = [r.source_line(doc) for r in res]
    out += ["", *target_table(sheet, targets(res))]
    for r in res:
        if r.family != "iac-bench":
            continue
        out += ["", f"Behind the scenario's baseline in `{r.name}` (no target; ratio of medians):", ""]
        for h in headline(r.data):
            if not h["ahead"]:
                ratio = sheet.put(r, row_key(h["scenario"], h) + "/ratio", h["ratio"], "ratio")
                out.append(f"- {h['scenario']}, {h['metric']}: {h['contender']} {ratio}× {h['baseline']}")
    return out
