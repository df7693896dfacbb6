"""The ``requests`` and ``cpu`` scenarios: a server and a client process per contender on loopback."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from iac.bench.contenders import brokers, endpoints
from iac.bench.harness.environment import quic_name
from iac.bench.harness.process import Pair
from iac.bench.harness.results import Context, Result, downsample, ratio, turn_order
from iac.bench.harness.stats import median, percentile


@dataclass(frozen=True)
class RequestPlan:
    rounds: int
    counts: dict[int, int]  # in flight -> requests per turn


#: The messaging systems users would pick instead, bare and signed (iac.bench.contenders.brokers).
BROKERS = ("nats", "nats-ed25519", "zmq", "zmq-ed25519")
#: The IAC contender the brokers' ratios are taken to (same run).
BROKER_BASE = "IAC-TLS/TCP"


def missing_brokers() -> dict[str, str]:
    """label -> why it cannot run here, for the broker contenders that cannot."""
    out = {}
    for c in BROKERS:
        why = brokers.missing(c)
        if why:
            out[endpoints.NAMES[c]] = why
    return out


def _request_contenders(ctx: Context) -> list[tuple[str, str, str | None]]:
    """(label, endpoint contender, QUIC backend)."""
    out: list[tuple[str, str, str | None]] = [(quic_name(b), "iac-quic", b) for b in ctx.backends]
    out += [("IAC-TLS/TCP", "iac-tls", None), ("IAC-UNIX", "iac-unix", None)]
    if endpoints.have_aiohttp():
        out += [
            (endpoints.NAMES[c], c, None)
            for c in ("http", "http-ed25519", "http-ed25519-tls", "http-ed25519-unix")
        ]
    if endpoints.have_grpc():
        out.append((endpoints.NAMES["grpc"], "grpc", None))
    out += [(endpoints.NAMES[c], c, None) for c in BROKERS if brokers.missing(c) is None]
    return out


def ratios_of(res: Result, pairs: Iterable[tuple[str, str, str]]) -> dict[str, dict[str, float]]:
    """``{key: {metric: ratio of medians}}`` for each ``(key, contender, baseline)`` of ``pairs``."""
    index = {(r["contender"], r["metric"]): r["median"] for r in res.rows}
    out: dict[str, dict[str, float]] = {}
    for key, who, base in pairs:
        for (w, metric), value in index.items():
            if w == who and (r := ratio(value, index.get((base, metric)))) is not None:
                out.setdefault(key, {})[metric] = round(r, 3)
    return out


def broker_ratios(res: Result) -> dict[str, dict[str, float]]:
    """Each non-IAC contender's figures over :data:`BROKER_BASE`'s, per metric (ratio of medians)."""
    others = dict.fromkeys(r["contender"] for r in res.rows if not r["contender"].startswith("IAC"))
    return ratios_of(res, ((who, who, BROKER_BASE) for who in others))


#: Transport-matched, equal-security pairs of the ``requests`` scenario: (IAC, HTTP+Ed25519 variant).
SAME_TRANSPORT = (("IAC-TLS/TCP", "HTTPS+Ed25519 JSON"), ("IAC-UNIX", "HTTP+Ed25519 JSON/UNIX"))


def same_transport_ratios(res: Result) -> dict[str, dict[str, float]]:
    """IAC over HTTP+Ed25519 on the same transport, per metric (ratio of medians)."""
    return ratios_of(res, ((f"{a} / {b}", a, b) for a, b in SAME_TRANSPORT))


def keep_broker_ratios(res: Result) -> None:
    """:func:`broker_ratios` in ``res.raw["vs_iac_tls"]``, when there are any."""
    if vs := broker_ratios(res):
        res.raw = {**(res.raw or {}), "vs_iac_tls": vs}


def _requests(ctx: Context, res: Result, plan: RequestPlan, cpu_only: bool) -> None:
    contenders = _request_contenders(ctx)
    res.skipped.update(missing_brokers())
    kind = {label: c for label, c, _ in contenders}
    res.baseline = "HTTP+Ed25519 JSON" if endpoints.have_aiohttp() else None
    if not endpoints.have_aiohttp():
        res.notes.append(
            "No HTTP baseline: aiohttp is not installed (pip install aiohttp); ratios are empty."
        )
    pairs: dict[str, Any] = {}
    figs: dict[tuple[str, str], list[float]] = {}
    samples: dict[str, list[float]] = {}
    depths = sorted(plan.counts)

    def put(label: str, metric: str, value: float) -> None:
        figs.setdefault((label, metric), []).append(value)

    try:
        for label, cont, backend in contenders:
            ctx.progress(f"starting {label}")
            pairs[label] = endpoints.start_pair(cont, "127.0.0.1", ctx.tmp, backend=backend)
        for label in pairs:  # warm-up
            pairs[label].run(16, 200)
        order = turn_order([c[0] for c in contenders], plan.rounds)
        for r, turn in enumerate(order):
            ctx.progress(f"round {r + 1}/{plan.rounds}")
            for label in turn:
                for depth in depths:
                    n = plan.counts[depth]
                    out = pairs[label].run(depth, n)
                    lat = out["lat_us"]
                    if out["errors"] or not lat:
                        raise RuntimeError(f"{label}: {out['errors']} failed requests at {depth} in flight")
                    done = len(lat)
                    if depth == 1 and not cpu_only:
                        put(label, "RTT p50, 1 in flight", median(lat))
                        put(label, "RTT p99, 1 in flight", percentile(lat, 99))
                        samples.setdefault(label, []).extend(lat)
                    if not cpu_only:
                        put(label, f"requests/s, {depth} in flight", done / out["elapsed_s"])
                    if depth == max(depths):
                        us = 1e6 / done
                        for side in ("client", "server"):
                            cpu = out["cpu_s" if side == "client" else "server_cpu_s"]
                            put(label, f"{side} CPU per request, {depth} in flight", cpu * us)
                        if (frames := out["frame_bytes"]) is not None:
                            put(label, "IAC frame bytes per request, both ways", frames / done)
    finally:
        for pair in pairs.values():
            pair.close()
    for (label, metric), values in figs.items():
        unit = "req/s" if metric.startswith("requests/s") else "B" if "bytes" in metric else "µs"
        better = "higher" if unit == "req/s" else "lower"
        res.add(label, metric, unit, values, better=better, secures=endpoints.secures(kind[label]))
    if samples:
        res.series["latency_cdf_us"] = {k: downsample(v) for k, v in samples.items()}
    if not cpu_only:
        res.series["rps_vs_in_flight"] = {
            label: {str(d): median(figs[(label, f"requests/s, {d} in flight")]) for d in depths}
            for label, _, _ in contenders
        }
    res.notes.append(
        "Each contender is a server process and a client process on loopback "
        f"(iac.bench.contenders.endpoints serve/client); {plan.rounds} rounds, turns A B … B A; per turn "
        + ", ".join(f"{n} requests at {d} in flight" for d, n in plan.counts.items())
        + ". CPU is time.process_time() of each process over the turn, divided by the requests. "
        'HTTP and gRPC: benchmarks/README.md, "Requests: the contenders". '
        "NATS (nats-py request/reply through a nats-server the endpoint starts on loopback) and ZeroMQ "
        "(pyzmq DEALER/ROUTER) carry a JSON envelope over plain TCP: bare, nothing is authenticated; "
        "+Ed25519, the client signs the request, the server verifies it and signs the reply, the client "
        "verifies that (the four Ed25519 operations IAC does per request); neither encrypts."
    )
    keep_broker_ratios(res)
    same = same_transport_ratios(res)
    if same:
        res.raw = {**(res.raw or {}), "same_transport_ratios": same}
        keys = ("RTT p50, 1 in flight", f"requests/s, {max(depths)} in flight")
        for pair, by_metric in same.items():
            shown = [f"{m} {by_metric[m]:.2f}" for m in keys if m in by_metric]
            cpu = [m for m in by_metric if "CPU" in m]
            shown += [f"{m} {by_metric[m]:.2f}" for m in cpu]
            res.notes.append(f"Same transport, equal security: {pair} = " + "; ".join(shown) + ".")


def sc_requests(ctx: Context, res: Result) -> None:
    counts = {1: 200, 16: 600, 64: 1000} if ctx.quick else {1: 1000, 16: 3000, 64: 5000}
    _requests(ctx, res, RequestPlan(rounds=3 if ctx.quick else 7, counts=counts), cpu_only=False)


def sc_cpu(ctx: Context, res: Result) -> None:
    counts = {64: 1000} if ctx.quick else {64: 5000}
    _requests(ctx, res, RequestPlan(rounds=3 if ctx.quick else 7, counts=counts), cpu_only=True)


#: The contenders of the one-way part that runs in two processes (IAC nodes and the brokers).
ONEWAY_IAC = (("IAC-TLS/TCP", "iac-tls"), ("IAC-UNIX", "iac-unix"))
ONEWAY_METRIC = "one-way messages/s, two processes"


def oneway_between_processes(ctx: Context, res: Result) -> None:
    """One-way messages from a client process to a server process, IAC nodes (``Node.send``)
    against NATS (publish) and ZeroMQ (DEALER send), bare and signed; a turn's rate counts until
    the server has handled every message (it is asked, with a request, until it has)."""
    count, rounds = (2000, 3) if ctx.quick else (10000, 7)
    contenders = [*ONEWAY_IAC, *((endpoints.NAMES[c], c) for c in BROKERS if brokers.missing(c) is None)]
    res.skipped.update(missing_brokers())
    pairs: dict[str, Pair] = {}
    rates: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    try:
        for label, c in contenders:
            ctx.progress(f"starting {label}")
            pairs[label] = endpoints.start_pair(c, "127.0.0.1", ctx.tmp)
            pairs[label].oneway(200)  # warm-up
        for r, turn in enumerate(turn_order([label for label, _ in contenders], rounds)):
            ctx.progress(f"two processes: round {r + 1}/{rounds}")
            for label in turn:
                out = pairs[label].oneway(count)
                rates.setdefault(label, []).append(count / out["elapsed_s"])
                cpu.setdefault(label, []).append(out["server_cpu_s"] * 1e6 / count)
    finally:
        for pair in pairs.values():
            pair.close()
    kind = dict(contenders)
    for label, values in rates.items():
        how = endpoints.secures(kind[label])
        res.add(label, ONEWAY_METRIC, "msg/s", values, better="higher", baseline=BROKER_BASE, secures=how)
        res.add(label, "server CPU per one-way message", "µs", cpu[label], baseline=BROKER_BASE, secures=how)
    keep_broker_ratios(res)
    res.notes.append(
        f"{ONEWAY_METRIC}: a server and a client process per contender on loopback, {count} messages per "
        f"turn, {rounds} rounds; IAC sends Node.send (signed, compressed, verified), NATS publishes to "
        "the responder's subject, ZeroMQ sends on the DEALER socket (+Ed25519: signed by the client, "
        "verified by the server). The rate counts until the server has handled all of them."
    )
