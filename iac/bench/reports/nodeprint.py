"""Printing the report of ``iac/bench/scenarios/node.py`` (built by :mod:`nodereport`)."""

from __future__ import annotations

from typing import Any

from iac.bench.harness.calibrate import PIECES
from iac.bench.reports.nodereport import FLOOR_SLACK

METRIC = {
    "rtt_p50_us": "p50 RTT",
    "rtt_p99_us": "p99 RTT",
    "requests_per_s_at_64": "req/s at 64",
    "cpu_us_per_request_at_64": "CPU/req",
    "oneway_per_s": "one-way msgs/s",
    "bytes_per_request": "bytes/req",
}


def _fmt(s: dict[str, float] | None, width: int = 7, digits: int = 0) -> str:
    if not s:
        return "-"
    return f"{s['median']:>{width}.{digits}f} [{s['min']:.{digits}f}..{s['max']:.{digits}f}]"


def _n(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _r(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def print_report(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(
        f"\nIAC node.request vs its floor, HTTP and gRPC, loopback, {cfg['reps']} repetitions interleaved; "
        f"per repetition {cfg['sequential_per_rep']} sequential + {cfg['concurrent_per_rep']} at "
        f"{cfg['in_flight']} in flight (+ echo / one-way); median [min..max]; loop: {cfg['loop']}"
    )
    _calibration(report["calibration"])
    _contenders(report)
    _floors(report)
    _oneway(report)
    _iac_ratios(report)
    _bytes(report)
    _targets(report)
    _previous(report.get("previous"))
    if "profile" in report:
        _profile(report["profile"])
    m = report["machine"]
    print(
        f"\n{m['platform']}, Python {m['python']}, {m['cpus']} CPUs; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    )


def _calibration(cal: dict[str, Any]) -> None:
    print(f"\nTwo-process scaling per repetition (valid: >= {cal['min_scaling']}; the lower of before/after)")
    for r in cal["reps"]:
        print(
            f"  rep {r['rep']}: scaling {r['scaling']:.2f} (throughput {_n(r.get('throughput_scaling'), 2)}, "
            f"CPU share {_n(r.get('cpu_share'), 2)})  load(1m) {_n(r['loadavg_1m'], 2)}  "
            f"busy cores {_n(r['busy_cores'], 2)}  steal {_n(r['steal_pct'], 1)}%  "
            f"{'valid' if r['valid'] else 'INVALID: not judged where two cores are needed'}"
        )
    n, v = len(cal["reps"]), len(cal["valid_reps"])
    if v < n:
        print(
            f"  {v} of {n} repetitions valid; two-core targets use those"
            + ("" if v else " (none: not judged)")
        )


def _contenders(report: dict[str, Any]) -> None:
    head = (
        f"\n{'contender':<22} {'RTT p50 µs':>20} {'RTT p99 µs':>20} {'req/s @64':>22} "
        f"{'srv CPU µs/req':>20} {'cli CPU µs/req':>20} {'sum':>5}"
    )
    print(head)
    for name, c in report["contenders"].items():
        print(
            f"{name:<22} {_fmt(c['rtt_p50_us']):>20} {_fmt(c['rtt_p99_us']):>20} "
            f"{_fmt(c['requests_per_s_at_64']):>22} {_fmt(c['server_cpu_us_per_request_at_64']):>20} "
            f"{_fmt(c['client_cpu_us_per_request_at_64']):>20} {_n(c['cpu_us_per_request_at_64']):>5}"
        )


def _floors(report: dict[str, Any]) -> None:
    p = report["primitives"]
    print("\nCodec primitives, CPU µs per request (request + reply, both sides), median of repetitions:")
    for way, label in (
        ("alone", "each alone (timeit)"),
        ("in_sequence", "in sequence, one pass per message"),
    ):
        pieces = p[way]
        print(
            f"  {label}: " + ", ".join(f"{k} {pieces[k]:.1f}" for k in PIECES) + f"; sum {pieces['sum']:.1f}"
        )
    if not report["floor_check"]:
        return
    print(
        f"\n{'floor':<22} {'CPU µs/req':>10} {'in seq.':>8} {'echo CPU':>9} {'echo req/s':>11} "
        f"{'/ alone':>8} {'/ (in seq. + echo)':>19}  verdict (<= {FLOOR_SLACK}, valid repetitions)"
    )
    for f in report["floor_check"]:
        c = report["contenders"][f["floor"]]
        echo_rps = c["echo_requests_per_s_at_64"]
        verdict = (
            "not judged: no repetition had two cores"
            if f["ok"] is None
            else "ok"
            if f["ok"]
            else "FLOOR IS WRONG: it does more than the primitives and its transport"
        )
        print(
            f"{f['floor']:<22} {f['cpu_us']:>10.0f} {f['primitives_in_sequence_us']:>8.0f} "
            f"{f['echo_cpu_us']:>9.0f} "
            f"{_n(echo_rps['median'] if echo_rps else None):>11} "
            f"{f['vs_primitives_alone']:>7.2f}x {f['vs_primitives_in_sequence_and_echo']:>18.2f}x  {verdict}"
        )


def _oneway(report: dict[str, Any]) -> None:
    rows = [(n, c) for n, c in report["contenders"].items() if c.get("oneway_per_s")]
    if not rows:
        return
    dec = report["codec_decode"]["per_s"]
    print(
        f"\nOne-way, frames signed ahead, msgs/s received by the node; codec decode on one core: {_fmt(dec)}"
    )
    for name, c in rows:
        print(f"  {name:<22} {_fmt(c['oneway_per_s']):>22}")


def _iac_ratios(report: dict[str, Any]) -> None:
    ratios = report["iac_ratios"]
    if not ratios:
        return
    valid = len(report["calibration"]["valid_reps"])
    over = f"over the {valid} valid repetitions" if valid else "over all repetitions, none being valid"
    print(f"\nIAC figures as ratios (two-core figures {over}): × its floor, × http-ed25519")
    keys = ("rtt_p50_us", "rtt_p99_us", "requests_per_s_at_64", "cpu_us_per_request_at_64")
    print(f"{'contender':<22} " + " ".join(f"{METRIC[k]:>24}" for k in keys))
    for name, row in ratios.items():
        cells = []
        for k in keys:
            cell = row[k]
            cells.append(f"{_n(cell['value']):>7} {_r(cell.get('floor')):>7} {_r(cell.get('reference')):>8}")
        print(f"{name:<22} " + " ".join(f"{c:>24}" for c in cells))


def _bytes(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(
        f"\nBytes at the socket per request ({cfg['bytes_requests']} sequential requests after warm-up; "
        "TCP/UNIX: stream bytes both ways, QUIC: UDP payloads)"
    )
    cols = f"{'up':>7} {'down':>7} {'total':>7} {'setup':>7} {'IAC frames':>10}"
    print(f"{'contender':<22} {'transport':<26} {cols}")
    for name, c in report["contenders"].items():
        print(
            f"{name:<22} {c['transport']:<26} {_n(c['bytes_up']):>7} {_n(c['bytes_down']):>7} "
            f"{_n(c['bytes_per_request']):>7} {_n(c['setup_bytes']):>7} "
            f"{_n(c['iac_frame_bytes_per_request']):>10}"
        )


def _targets(report: dict[str, Any]) -> None:
    if not report["targets"]:
        return
    print(
        f"\nRatios of medians (IAC / baseline); targets against {report['config']['reference']} or as named\n"
    )
    print(f"{'contender':<22} {'baseline':<22} {'metric':<15} {'ratio':>7} {'target':>8}  verdict")
    for t in report["targets"]:
        verdict = (t.get("note") or "-") if t["met"] is None else ("met" if t["met"] else "MISSED")
        print(
            f"{t['contender']:<22} {t['baseline']:<22} {METRIC.get(t['metric'], t['metric']):<15} "
            f"{t['ratio']:>7.3f} {t['target'] or '':>8}  {verdict}"
        )


def _previous(prev: dict[str, Any] | None) -> None:
    if not prev:
        print("\nNo previous results file to compare CPU per request with.")
        return
    machine = prev.get("machine_ratio")
    print(
        f"\nCPU µs per request (server + client, at 64) against {prev['file']}; adjusted: divided by "
        f"http-ed25519's own ratio ({_n(machine, 3)}), the machine's drift"
    )
    print(f"  {'contender':<22} {'now':>6} {'previous':>9} {'change':>9} {'adjusted':>9}")
    for name, row in prev["contenders"].items():
        change = "-" if row["change_pct"] is None else f"{row['change_pct']:+.1f} %"
        adjusted = "-" if row.get("adjusted_change_pct") is None else f"{row['adjusted_change_pct']:+.1f} %"
        print(f"  {name:<22} {_n(row['now']):>6} {_n(row['previous']):>9} {change:>9} {adjusted:>9}")


def _profile(p: dict[str, Any]) -> None:
    print(f"\ncProfile of the {p['server']} server process ({p.get('busy_s')} s busy, epoll waits left out)")
    print("  own time (tottime):")
    for row in p.get("top_tottime", [])[:20]:
        print(
            f"  {row['share'] * 100:5.1f}%  {row['tottime_s']:8.3f} s  {row['calls']:>8}  {row['function']}"
        )
    print("  IAC functions by cumulative time:")
    for row in p.get("top_cumtime_iac", [])[:20]:
        share = row["cum_share"] * 100
        print(f"  {share:5.1f}%  {row['cumtime_s']:8.3f} s  {row['calls']:>8}  {row['function']}")
    print("  by module: " + ", ".join(f"{k} {v * 100:.1f}%" for k, v in p.get("by_module", {}).items()))
