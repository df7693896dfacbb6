#!/usr/bin/env python3
"""Congestion control over an emulated bottleneck: bulk goodput and request latency.

    sudo .venv/bin/python benchmarks/cc.py --quick --json out.json   # the cc scenario alone
    .venv/bin/iac bench --only cc                                    # the same, in the suite

Two network namespaces joined by :class:`netem.Link`, with a bottleneck
(:class:`netem.Bottleneck`: a rate limit and a drop-tail queue of :data:`netem.SHALLOW_BDP`
or :data:`netem.DEEP_BDP` bandwidth-delay products, then the delay and random loss of the
path, the same for UDP and TCP). Namespace b runs a *sink* (accepts bulk connections,
counts what arrives and when) and an *echo* server (answers each request frame); namespace a
runs, per run and in processes of their own, a *bulk* sender and a *requests* client, both
dialing with the contender's transport and congestion control:

* **bulk**: 16 KiB MESSAGE frames (random bytes, sent raw), back to back through
  ``Connection.send`` for ``seconds``; goodput = bytes that reached the sink in order within
  those seconds (its clock and the sender's are the same monotonic clock): QUIC stream data
  as aioquic hands it to IAC, TLS frames as the sink reads them. (Over QUIC whole frames reach
  the application in bursts: every frame has a stream of its own, aioquic sends its streams
  round robin, so up to the peer's stream credit of frames, 2 MiB, complete together.)
* **requests**: on their own connection between the same two hosts, one 200-byte request
  at a time, echoed; latencies from ``warmup`` seconds after the bulk transfer started to its
  end; p50 and p99 per run.

Contenders: IAC-QUIC with BBR, CUBIC and Reno (``TransportConfig.congestion``) and IAC-TLS/TCP
with the kernel's cubic and bbr (``TCP_CONGESTION`` on the client's sockets, checked). Each
setting runs every contender ``reps`` times in turns (A B … B A). Sharing: two bulk flows of
different (or the same) algorithms start together through one bottleneck.

Per run: each process's CPU % (the sender and the requests client measure their own CPU time;
the sink, the echo server and the forwarder are read from ``/proc``); a run with any process
above :data:`netem.CPU_LIMIT_PERCENT` is CPU-limited. QUIC's retransmitted bytes are the bytes
of packets aioquic declared lost (or re-sent on a probe timeout), TCP's ``tcpi_bytes_retrans``.

Endpoints, driven by JSON lines on stdin/stdout (as in ``loss.py``): ``cc.py sink|echo --host H``
print ``{"ready": true, ...urls}``; ``cc.py bulk|requests --target JSON ...`` print
``{"ready": true}`` once connected, start on ``{"cmd": "go"}`` and answer with their report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from stats import median, percentile  # noqa: E402

FRAME_BYTES = 16 * 1024
REQUEST_BYTES = 200
TCP_INFO_LEN = 232
MAX_FAILED_RUNS = 5  # the scenario gives up after this many failed runs
TRACE_EVERY = 0.5  # seconds between two samples of the sender's congestion state
ARRIVAL_GRAIN = 0.01  # the sink keeps one (time, bytes so far) per this many seconds
TCPI_BYTES_SENT, TCPI_BYTES_RETRANS = 200, 208  # offsets of two u64 in struct tcp_info


@dataclass(frozen=True)
class Contender:
    label: str
    transport: str  # quic | tls
    cc: str


BBR = Contender("IAC-QUIC BBR", "quic", "bbr")
CUBIC = Contender("IAC-QUIC CUBIC", "quic", "cubic")
RENO = Contender("IAC-QUIC Reno", "quic", "reno")
TCP_CUBIC = Contender("IAC-TLS/TCP cubic", "tls", "cubic")
TCP_BBR = Contender("IAC-TLS/TCP bbr", "tls", "bbr")
CONTENDERS = (BBR, CUBIC, RENO, TCP_CUBIC, TCP_BBR)
#: The aioquic controller class each QUIC contender must be running (checked per run).
QUIC_CLASSES = {
    "bbr": "BbrCongestionControl",
    "cubic": "CubicCongestionControl",
    "reno": "RenoCongestionControl",
}


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
        import netem

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
        return [
            Setting(rate, rtt, loss, buf)
            for rate in self.rates
            for rtt in self.rtts
            for buf in self.buffers
            for loss in self.losses
        ]


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
#: ``IAC_CC_PLAN`` picks the plan of ``iac bench --only cc`` (default: full; --quick: quick).
PLANS = {"full": FULL_PLAN, "targets": TARGETS_PLAN, "quick": QUICK_PLAN}


def plan_named(name: str) -> Plan:
    if name not in PLANS:
        raise SystemExit(f"IAC_CC_PLAN must be one of {', '.join(PLANS)}, not {name!r}")
    return PLANS[name]


# --- endpoints (run inside the namespaces) ------------------------------------------------------


def _say(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _udp_errors() -> dict[str, int]:
    """This namespace's UDP receive errors (a receiver too slow for its socket buffer)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        lines = [
            ln.split() for ln in Path("/proc/net/snmp").read_text().splitlines() if ln.startswith("Udp:")
        ]
        udp = dict(zip(lines[0][1:], map(int, lines[1][1:]), strict=False))
        return {"in_errors": udp.get("InErrors", 0), "rcvbuf_errors": udp.get("RcvbufErrors", 0)}
    return {}


async def serve(role: str, host: str) -> int:
    """``sink``: count each connection's bytes by arrival time; ``echo``: answer every frame."""
    from iac.errors import IacError
    from iac.transport import listen
    from iac.transport.base import Connection, TransportConfig
    from iac.wire.frames import FrameType, encode_frame
    from iac.wire.identity import Identity

    loop = asyncio.get_running_loop()
    runs: dict[str, list[tuple[float, int]]] = {}  # run id -> (arrival time, bytes so far)
    conns: dict[str, Connection] = {}
    closing: set[asyncio.Task[None]] = set()

    async def sink(conn: Connection) -> None:
        # Goodput is counted where the bytes arrive in order: QUIC stream data as the library
        # hands it over (IAC puts every frame on a stream of its own and the library serves its
        # streams round robin, so whole frames complete together, up to the peer's stream
        # credit at once), TLS frames as they are read. The sender's first frame names the run.
        arrivals: list[tuple[float, int]] = []
        total = 0

        def count(n: int) -> None:
            nonlocal total
            total += n
            now = loop.time()
            if arrivals and now - arrivals[-1][0] < ARRIVAL_GRAIN:
                arrivals[-1] = (arrivals[-1][0], total)
            else:
                arrivals.append((now, total))

        on_event = getattr(conn, "on_quic_event", None)
        if on_event is not None:
            from aioquic.quic.events import StreamDataReceived

            def counted(event: Any) -> None:
                if isinstance(event, StreamDataReceived):
                    count(len(event.data))
                on_event(event)

            conn.on_quic_event = counted  # type: ignore[attr-defined]
        with contextlib.suppress(IacError):
            while True:
                for it in await conn.recv_many(256):
                    body = it.frame.body
                    if len(body) < 64 and body.startswith(b"run:"):
                        runs[body[4:].decode()] = arrivals
                        conns[body[4:].decode()] = conn
                    elif on_event is None:
                        count(len(body))

    async def echo(conn: Connection) -> None:
        with contextlib.suppress(IacError):
            while True:
                item = await conn.recv()
                await conn.send(encode_frame(FrameType.MESSAGE, item.frame.body))

    identity = Identity.generate()
    config = TransportConfig()
    handler = sink if role == "sink" else echo
    listeners = [await listen(f"{s}://{host}:0", identity, handler, config=config) for s in ("quic", "tls")]
    _say({"ready": True, "agent_id": identity.agent_id, "urls": [ln.addresses[0] for ln in listeners]})
    reader = await _stdin_lines()
    try:
        while line := await reader.readline():
            cmd = json.loads(line)
            if cmd.get("cmd") == "report":
                arrivals = runs.pop(cmd["run"], [])
                got = [n for t, n in arrivals if t <= cmd["stop"]]
                conn = conns.pop(cmd["run"], None)
                if conn is not None:
                    closing.add(loop.create_task(conn.close()))
                timeline, mark = [], 0.0
                for t, n in arrivals:  # bytes so far every TRACE_EVERY seconds of the run
                    if t >= mark:
                        timeline.append((round(t - cmd["start"], 3), n))
                        mark = cmd["start"] + TRACE_EVERY * (int((t - cmd["start"]) / TRACE_EVERY) + 1)
                _say(
                    {
                        "timeline": timeline,
                        "bytes": got[-1] if got else 0,
                        "total": arrivals[-1][1] if arrivals else 0,
                        "first": arrivals[0][0] if arrivals else None,
                        "udp": _udp_errors(),
                    }
                )
            elif cmd.get("cmd") == "udp":
                _say(_udp_errors())
    finally:
        for ln in listeners:
            await ln.close()
    return 0


def _tcp_socket(conn: Any) -> socket.socket | None:
    transport = getattr(conn, "_transport", None)
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock if isinstance(sock, socket.socket) or hasattr(sock, "setsockopt") else None


def _set_tcp_congestion(conn: Any, name: str) -> str:
    """Put the connection's TCP socket on the kernel's ``name``; the algorithm it now runs."""
    sock = _tcp_socket(conn)
    if sock is None:
        raise RuntimeError("no TCP socket on this connection")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
    return bytes(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)).split(b"\0")[0].decode()


def _tcp_counters(conn: Any) -> dict[str, int]:
    sock = _tcp_socket(conn)
    if sock is None:
        return {}
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    if len(info) < TCPI_BYTES_RETRANS + 8:
        return {}
    return {
        "sent_bytes": struct.unpack_from("<Q", info, TCPI_BYTES_SENT)[0],
        "retrans_bytes": struct.unpack_from("<Q", info, TCPI_BYTES_RETRANS)[0],
    }


def _cc_state(conn: Any, t: float) -> dict[str, Any]:
    """What the sender's congestion control holds now (QUIC) or the kernel's tcp_info (TCP)."""
    quic = getattr(conn, "_quic", None)
    if quic is None:
        sock = _tcp_socket(conn)
        if sock is None:
            return {"t": round(t, 2)}
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
        rtt_us, cwnd = struct.unpack_from("<II", info, 68)[0], struct.unpack_from("<I", info, 80)[0]
        return {"t": round(t, 2), "cwnd_pkts": cwnd, "srtt_ms": rtt_us / 1e3}
    cc = quic._loss._cc
    out = {"t": round(t, 2), "cwnd": cc.congestion_window, "in_flight": cc.bytes_in_flight}
    bbr = getattr(cc, "bbr", None)
    if bbr is not None:
        out.update(
            mode=bbr.mode.value,
            bw_mbit=round(bbr.bw * 8 / 1e6, 2),
            pacing_mbit=round(bbr.pacing_rate * 8 / 1e6, 2),
            min_rtt_ms=round(bbr.min_rtt * 1e3, 2) if bbr.min_rtt < 1e9 else None,
        )
    return out


class _QuicCounters:
    """Bytes aioquic sent in flight and declared lost (or re-sent on a probe timeout)."""

    def __init__(self, conn: Any) -> None:
        self.sent = self.lost = 0
        cc = conn._quic._loss._cc
        sent, lost, expired = cc.on_packet_sent, cc.on_packets_lost, cc.on_packets_expired

        def on_sent(*, packet: Any) -> None:
            self.sent += packet.sent_bytes
            sent(packet=packet)

        def on_lost(*, now: float, packets: Iterable[Any]) -> None:
            packets = list(packets)
            self.lost += sum(p.sent_bytes for p in packets)
            lost(now=now, packets=packets)

        def on_expired(*, packets: Iterable[Any]) -> None:
            packets = list(packets)
            self.lost += sum(p.sent_bytes for p in packets)
            expired(packets=packets)

        cc.on_packet_sent, cc.on_packets_lost, cc.on_packets_expired = on_sent, on_lost, on_expired
        self.algorithm = type(cc).__name__

    def report(self) -> dict[str, Any]:
        return {"sent_bytes": self.sent, "retrans_bytes": self.lost}


async def flow(
    role: str, target: dict[str, Any], transport: str, cc: str, seconds: float, run: str, warmup: float
) -> int:
    """``bulk`` or ``requests``: dial, say ready, run on "go", report, exit at once."""
    from iac.transport import dial
    from iac.transport.base import DEFAULT_CONGESTION, TransportConfig
    from iac.wire.frames import FrameType, encode_frame
    from iac.wire.identity import Identity

    url = next(u for u in target["urls"] if u.startswith(transport + "://"))
    config = TransportConfig(
        congestion=cc if transport == "quic" else DEFAULT_CONGESTION, send_queue_bytes=1 << 20
    )
    conn = await dial(url, Identity.generate(), expect=target["agent_id"], config=config)
    counters: _QuicCounters | None = None
    if transport == "tls":
        running = _set_tcp_congestion(conn, cc)
    else:
        counters = _QuicCounters(conn)
        running = counters.algorithm
    if role == "bulk":
        await conn.send(encode_frame(FrameType.MESSAGE, b"run:" + run.encode()))
    _say({"ready": True, "algorithm": running})
    reader = await _stdin_lines()
    await reader.readline()  # go
    loop = asyncio.get_running_loop()
    start, cpu0 = loop.time(), time.process_time()
    stop = start + seconds
    out: dict[str, Any] = {"start": start, "stop": stop}
    if role == "bulk":
        frame = encode_frame(FrameType.MESSAGE, os.urandom(FRAME_BYTES))

        async def pump() -> None:
            while True:
                await conn.send(frame)

        task = loop.create_task(pump())
        trace = []
        for _ in range(int(seconds / TRACE_EVERY)):
            await asyncio.sleep(TRACE_EVERY)
            trace.append(_cc_state(conn, loop.time() - start))
        await asyncio.sleep(max(0.0, stop - loop.time()))
        task.cancel()
        out["trace"] = trace
    else:
        request = encode_frame(FrameType.MESSAGE, os.urandom(REQUEST_BYTES))
        lat: list[float] = []
        await asyncio.sleep(warmup)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds - warmup + 5.0):
                while loop.time() < stop:
                    t = time.perf_counter()
                    await conn.send(request)
                    await conn.recv()
                    lat.append((time.perf_counter() - t) * 1e3)
        out["lat_ms"] = [round(x, 3) for x in lat]
    out["cpu_s"] = time.process_time() - cpu0
    out.update(counters.report() if counters is not None else _tcp_counters(conn))
    sock = _tcp_socket(conn)
    if sock is not None:  # end now: no lingering send buffer reaches the next run
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    _say(out)
    os._exit(0)


# --- the driver ------------------------------------------------------------------------------------


class Proc:
    """A JSON-lines endpoint process."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )

    def read(self, timeout: float) -> dict[str, Any]:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        line = out.readline() if ready else ""
        if not line:
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(
                f"{self.proc.args[-12:]}: no answer ({self.proc.poll()}): {err.strip()[-1200:]}"
            )
        obj: dict[str, Any] = json.loads(line)
        return obj

    def tell(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, cmd: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        self.tell(cmd)
        return self.read(timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for s in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if s is not None:
                    s.close()


def _argv(role: str, *args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), role, *args]


@dataclass
class Bench:
    """The link, the sink and the echo server, and one run after another."""

    link: Any
    env: dict[str, str]
    sink: Proc = field(init=False)
    echo: Proc = field(init=False)
    runs: int = 0

    def __post_init__(self) -> None:
        import netem

        self.sink = Proc(self.link.command("b", _argv("sink", "--host", netem.ADDR_B)), self.env)
        self.echo = Proc(self.link.command("b", _argv("echo", "--host", netem.ADDR_B)), self.env)
        self.sink_target = self.sink.read(60)
        self.echo_target = self.echo.read(60)

    def close(self) -> None:
        self.sink.close()
        self.echo.close()

    def _flow(self, role: str, c: Contender, seconds: float, warmup: float) -> tuple[Proc, str]:
        self.runs += 1
        run = f"r{self.runs}"
        target = self.sink_target if role == "bulk" else self.echo_target
        args = ["--target", json.dumps(target), "--transport", c.transport, "--cc", c.cc]
        args += ["--seconds", str(seconds), "--run", run, "--warmup", str(warmup)]
        return Proc(self.link.command("a", _argv(role, *args)), self.env), run

    def run(
        self, bulk: list[Contender], seconds: float, requests: Contender | None, warmup: float
    ) -> dict[str, Any]:
        """One run: ``bulk`` flows (and a requests client) start together for ``seconds``."""
        import netem

        procs = [self._flow("bulk", c, seconds, warmup) for c in bulk]
        req = self._flow("requests", requests, seconds, warmup)[0] if requests is not None else None
        everyone = [p for p, _ in procs] + ([req] if req else [])
        try:
            ready = [p.read(60) for p in everyone]
            for c, r in zip([*bulk, *([requests] if requests else [])], ready, strict=True):
                expect = {
                    "bbr": "BbrCongestionControl",
                    "cubic": "CubicCongestionControl",
                    "reno": "RenoCongestionControl",
                }
                want = c.cc if c.transport == "tls" else expect[c.cc]
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


def turn_order(items: list[Any], rounds: int) -> list[list[Any]]:
    return [list(items) if r % 2 == 0 else list(reversed(items)) for r in range(rounds)]


def run_cc(plan: Plan, progress: Callable[[str], None] = lambda s: None, seed: int = 11) -> dict[str, Any]:
    """The cc scenario. ``{"status": "ok"|"skipped", "reason", "runs": [...], "shares": [...]}``."""
    import loss
    import netem

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
    except netem.LinkError as exc:
        return {"status": "skipped", "reason": f"link emulator unavailable: {exc}"}
    bench = None
    try:
        bench = Bench(link, loss.env_for())

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
            "name": plan.name,
            "seconds": plan.seconds,
            "reps": plan.reps,
            "warmup_s": plan.warmup,
            "share_seconds": plan.share_seconds,
            "share_reps": plan.share_reps,
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="role")
    for role in ("sink", "echo"):
        s = sub.add_parser(role, help="(internal) a server endpoint")
        s.add_argument("--host", default="127.0.0.1")
    for role in ("bulk", "requests"):
        f = sub.add_parser(role, help="(internal) a client endpoint")
        f.add_argument("--target", required=True)
        f.add_argument("--transport", choices=("quic", "tls"), required=True)
        f.add_argument("--cc", required=True)
        f.add_argument("--seconds", type=float, required=True)
        f.add_argument("--run", default="r0")
        f.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--plan", choices=tuple(PLANS), default=None, help="full (default), targets, quick")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.role in ("sink", "echo"):
        return asyncio.run(serve(args.role, args.host))
    if args.role in ("bulk", "requests"):
        target = json.loads(args.target)
        return asyncio.run(
            flow(args.role, target, args.transport, args.cc, args.seconds, args.run, args.warmup)
        )
    import ccreport

    plan = plan_named(args.plan or ("quick" if args.quick else "full"))
    res = run_cc(plan, lambda m: print(m, file=sys.stderr, flush=True))
    if res["status"] != "ok":
        print(f"cc scenario skipped: {res['reason']}")
        return 0
    for line in ccreport.summary_lines(res):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
