"""Congestion control over an emulated bottleneck: bulk goodput and request latency.

    sudo .venv/bin/iac bench --only cc [--quick]

Two network namespaces joined by :class:`netem.Link` with a :class:`netem.Bottleneck`; namespace
b runs the sink and the echo server, namespace a a bulk sender and a requests client per run
(the endpoints: :mod:`iac.bench.contenders.ccflows`), each contender's transport and congestion
control. Contenders, settings, sharing and the CPU limit: benchmarks/README.md, "Congestion
control"."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from iac.bench.contenders.ccflows import FRAME_BYTES, REQUEST_BYTES
from iac.bench.harness.process import Endpoint
from iac.bench.harness.results import turn_order
from iac.bench.harness.stats import median, percentile

MAX_FAILED_RUNS = 5  # the scenario gives up after this many failed runs


@dataclass(frozen=True)
class Contender:
    label: str
    transport: str  # quic | tls
    cc: str
    #: QUIC PMTUD, GSO, ACK frequency (``TransportConfig.quic_pmtud``, ``quic_gso``, ``quic_ack_frequency``).
    link: bool = True


BBR = Contender("IAC-QUIC BBR", "quic", "bbr")
CUBIC = Contender("IAC-QUIC CUBIC", "quic", "cubic")
RENO = Contender("IAC-QUIC Reno", "quic", "reno")
TCP_CUBIC = Contender("IAC-TLS/TCP cubic", "tls", "cubic")
TCP_BBR = Contender("IAC-TLS/TCP bbr", "tls", "bbr")
BBR_LINK_OFF = Contender("IAC-QUIC BBR, PMTUD, GSO and ACK frequency off", "quic", "bbr", link=False)
CONTENDERS = (BBR, CUBIC, RENO, TCP_CUBIC, TCP_BBR)
#: The aioquic controller class each QUIC contender must be running (checked per run).
QUIC_CLASSES = {cc: f"{cc.capitalize()}CongestionControl" for cc in ("bbr", "cubic", "reno")}


@dataclass(frozen=True)
class Setting:
    rate_mbit: float
    rtt: float  # seconds
    loss: float  # per packet, each direction
    buffer: str  # shallow | deep

    @property
    def label(self) -> str:
        return f"{self.rate_mbit:g} Mbit/s, {self.rtt * 1e3:.0f} ms, {self.loss:.0%} loss, {self.buffer}"

    @property
    def buffer_bdp(self) -> float:
        from iac.testing import netem

        return netem.SHALLOW_BDP if self.buffer == "shallow" else netem.DEEP_BDP


@dataclass(frozen=True)
class Plan:
    name: str = "full"
    rates: tuple[float, ...] = (10.0, 50.0)
    rtts: tuple[float, ...] = (0.02, 0.1)
    losses: tuple[float, ...] = (0.0, 0.01, 0.03)
    buffers: tuple[str, ...] = ("shallow", "deep")
    contenders: tuple[Contender, ...] = CONTENDERS
    seconds: float = 10.0
    reps: int = 3
    warmup: float = 1.0  # requests start this long after the bulk transfer
    #: Sharing: pairs of algorithms, each pair's two flows through one bottleneck at once.
    share_pairs: tuple[tuple[Contender, Contender], ...] = ((BBR, BBR), (BBR, CUBIC), (CUBIC, CUBIC))
    share_settings: tuple[Setting, ...] = (
        Setting(10.0, 0.02, 0.0, "shallow"),
        Setting(10.0, 0.02, 0.0, "deep"),
        Setting(50.0, 0.02, 0.0, "deep"),
        Setting(10.0, 0.1, 0.0, "deep"),
    )
    share_seconds: float = 20.0
    share_reps: int = 2

    def settings(self) -> list[Setting]:
        grid = itertools.product(self.rates, self.rtts, self.buffers, self.losses)
        return [Setting(rate, rtt, loss, buf) for rate, rtt, buf, loss in grid]


FULL_PLAN = Plan()
QUICK_PLAN = Plan(
    name="quick",
    rates=(10.0,),
    rtts=(0.02,),
    losses=(0.01,),
    buffers=("deep",),
    contenders=(BBR, CUBIC, TCP_CUBIC),
    seconds=4.0,
    reps=1,
    warmup=0.5,
    share_pairs=(),
    share_settings=(),
)
#: The settings the targets are judged at (20 ms; 10 and 50 Mbit/s; no loss and 1%; both
#: buffers), two repetitions, and the sharing of BBR with BBR and with CUBIC: about 20 minutes.
TARGETS_PLAN = Plan(
    name="targets",
    rates=(10.0, 50.0),
    rtts=(0.02,),
    losses=(0.0, 0.01),
    reps=2,
    share_pairs=((BBR, BBR), (BBR, CUBIC)),
    share_settings=(Setting(10.0, 0.02, 0.0, "deep"),),
    share_reps=1,
)
#: The QUIC link mechanisms (path MTU discovery, GSO, ACK frequency) on and off, with BBR, at 50
#: and 100 Mbit/s, 20 ms, no loss and 1 %, both buffers, one run each: about 8 minutes.
LINK_PLAN = Plan(
    name="link",
    rates=(50.0, 100.0),
    rtts=(0.02,),
    losses=(0.0, 0.01),
    contenders=(BBR, BBR_LINK_OFF, CUBIC, TCP_BBR),
    reps=1,
    share_pairs=(),
    share_settings=(),
)
#: ``IAC_CC_PLAN`` picks the plan of ``iac bench --only cc`` (default: full; --quick: quick).
PLANS = {"full": FULL_PLAN, "targets": TARGETS_PLAN, "quick": QUICK_PLAN, "link": LINK_PLAN}


def plan_named(name: str) -> Plan:
    if name not in PLANS:
        raise SystemExit(f"IAC_CC_PLAN must be one of {', '.join(PLANS)}, not {name!r}")
    return PLANS[name]


# --- the driver ------------------------------------------------------------------------------------


def _argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "iac.bench.contenders.ccflows", role, *args]


@dataclass
class Bench:
    """The link, the sink and the echo server, and one run after another."""

    link: Any
    env: dict[str, str]
    sink: Endpoint = field(init=False)
    echo: Endpoint = field(init=False)
    runs: int = 0

    def __post_init__(self) -> None:
        from iac.testing import netem

        b = self.link.command
        self.sink = Endpoint(b("b", _argv("sink", "--host", netem.ADDR_B)), self.env, 60)
        self.echo = Endpoint(b("b", _argv("echo", "--host", netem.ADDR_B)), self.env, 60)
        self.sink_target, self.echo_target = self.sink.first, self.echo.first

    def close(self) -> None:
        self.sink.close()
        self.echo.close()

    def _flow(self, role: str, c: Contender, seconds: float, warmup: float) -> tuple[Endpoint, str]:
        self.runs += 1
        run = f"r{self.runs}"
        target = self.sink_target if role == "bulk" else self.echo_target
        args = ["--target", json.dumps(target), "--transport", c.transport, "--cc", c.cc]
        args += ["--seconds", str(seconds), "--run", run, "--warmup", str(warmup)]
        if not c.link:
            args += ["--link", "off"]
        return Endpoint(self.link.command("a", _argv(role, *args)), self.env, ready=False), run

    def run(
        self, bulk: list[Contender], seconds: float, requests: Contender | None, warmup: float
    ) -> dict[str, Any]:
        """One run: ``bulk`` flows (and a requests client) start together for ``seconds``."""
        from iac.testing import netem

        procs = [self._flow("bulk", c, seconds, warmup) for c in bulk]
        req = self._flow("requests", requests, seconds, warmup)[0] if requests is not None else None
        everyone = [p for p, _ in procs] + ([req] if req else [])
        try:
            ready = [p.read(60) for p in everyone]
            for c, r in zip([*bulk, *([requests] if requests else [])], ready, strict=True):
                want = c.cc if c.transport == "tls" else QUIC_CLASSES[c.cc]
                if r.get("algorithm") != want:
                    raise RuntimeError(f"{c.label}: runs {r.get('algorithm')!r}, not {want!r}")
            fwd = self.link.forwarder_pid
            meter = netem.CpuMeter({"sink": self.sink.pid, "echo": self.echo.pid, "forwarder": fwd}).start()
            link0 = self.link.stats()["a_to_b"]
            for p in everyone:
                p.tell({"cmd": "go"})
            reports = [p.read(seconds + 60) for p in everyone]
            cpu = meter.stop()
            link1 = self.link.stats()["a_to_b"]
        finally:
            for p in everyone:
                p.close()
        flows = []
        for i, ((_, run), c, rep) in enumerate(zip(procs, bulk, reports, strict=False)):
            got = self.sink.ask({"cmd": "report", "run": run, "start": rep["start"], "stop": rep["stop"]})
            cpu[f"sender {i + 1}" if len(bulk) > 1 else "sender"] = round(100 * rep["cpu_s"] / seconds, 1)
            flows.append(
                {
                    "contender": c.label,
                    "goodput_mbit": got["bytes"] * 8 / seconds / 1e6,
                    "sent_bytes": rep.get("sent_bytes"),
                    "retrans_bytes": rep.get("retrans_bytes"),
                    "datagram_bytes": rep.get("datagram_bytes"),
                    "udp_errors": got["udp"],
                    "trace": rep.get("trace", []),
                    "timeline": got["timeline"],
                }
            )
        out: dict[str, Any] = {"flows": flows, "cpu_percent": cpu}
        if req is not None:
            lat = reports[-1]["lat_ms"]
            cpu["requests"] = round(100 * reports[-1]["cpu_s"] / seconds, 1)
            out["requests"] = {
                "n": len(lat),
                "p50_ms": median(lat) if lat else None,
                "p99_ms": percentile(lat, 99) if lat else None,
            }
        out["cpu_limited"] = netem.cpu_limited(cpu)
        out["machine_busy_percent"] = meter.machine
        out["link"] = {
            k: link1[k] - link0[k] for k in ("packets", "bytes", "dropped", "dropped_bottleneck", "delivered")
        }
        out["link"]["max_queued_bytes"] = link1["max_queued_bytes"]
        return out


def run_cc(plan: Plan, progress: Callable[[str], None] = lambda s: None, seed: int = 11) -> dict[str, Any]:
    """The cc scenario. ``{"status": "ok"|"skipped", "reason", "runs": [...], "shares": [...]}``."""
    from iac.bench.harness.paths import child_env
    from iac.testing import netem
    from iac.testing.relay import Impairment

    reason = netem.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    settings = plan.settings()
    runs: list[dict[str, Any]] = []
    shares: list[dict[str, Any]] = []
    errors: list[str] = []
    t0 = time.monotonic()
    try:
        link = netem.Link(Impairment(delay=settings[0].rtt / 2), seed=seed, tag=f"c{os.getpid() % 100000}")
        link.start()
    except netem.LabError as exc:
        return {"status": "skipped", "reason": f"link emulator unavailable: {exc}"}
    bench = None
    try:
        bench = Bench(link, child_env())

        def path(s: Setting) -> None:
            b = netem.Bottleneck.for_path(s.rate_mbit, s.rtt, s.buffer_bdp)
            link.set_path(Impairment(delay=s.rtt / 2, loss=s.loss), b)

        failed = 0

        def attempt(flows: list[Contender], seconds: float, req: Contender | None, warmup: float) -> Any:
            nonlocal failed
            try:
                out = bench.run(flows, seconds, req, warmup)
            except (RuntimeError, OSError, ValueError, KeyError) as exc:  # one run, not the scenario
                failed += 1
                errors.append(f"{' + '.join(c.label for c in flows)}: {exc}"[:2000])
                if failed >= MAX_FAILED_RUNS:
                    raise RuntimeError(f"{failed} runs failed; the last: {exc}") from exc
                return None
            return out

        for i, s in enumerate(settings):
            path(s)
            for r, order in enumerate(turn_order(list(plan.contenders), plan.reps)):
                for c in order:
                    progress(f"{s.label}: {c.label} ({r + 1}/{plan.reps}; setting {i + 1}/{len(settings)})")
                    out = attempt([c], plan.seconds, c, plan.warmup)
                    if out is not None:
                        runs.append({"setting": asdict(s), "contender": c.label, "rep": r, **out})
        for s in plan.share_settings:
            path(s)
            for r in range(plan.share_reps):
                for a, b in plan.share_pairs:
                    progress(f"sharing {s.label}: {a.label} + {b.label} ({r + 1}/{plan.share_reps})")
                    out = attempt([a, b], plan.share_seconds, None, 0.0)
                    if out is not None:
                        shares.append({"setting": asdict(s), "pair": [a.label, b.label], "rep": r, **out})
    finally:
        if bench is not None:
            bench.close()
        link.close()
    return {
        "status": "ok",
        "reason": None,
        "plan": {
            **{k: getattr(plan, k) for k in ("name", "seconds", "reps", "share_seconds", "share_reps")},
            "warmup_s": plan.warmup,
            "shallow_bdp": netem.SHALLOW_BDP,
            "deep_bdp": netem.DEEP_BDP,
            "cpu_limit_percent": netem.CPU_LIMIT_PERCENT,
            "frame_bytes": FRAME_BYTES,
            "request_bytes": REQUEST_BYTES,
            "contenders": [asdict(c) for c in plan.contenders],
        },
        "duration_s": round(time.monotonic() - t0, 1),
        "runs": runs,
        "shares": shares,
        "errors": errors,
    }
