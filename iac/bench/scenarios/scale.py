"""Scale: a server node's memory per connected peer, CPU per request and idle, and dial bursts,
at 1 to 10,000 peers, over TLS and QUIC (``iac bench --only scale``).

    .venv/bin/python -m iac.bench.scenarios.scale [--quick] [--peers 1,10,100,1000] [--json FILE]
    .venv/bin/python -m iac.bench.scenarios.scale memory --transport tls --peers 1000 [--procs 4]
    .venv/bin/python -m iac.bench.scenarios.scale burst --transport quic --dials 1000 [--procs 4]
    .venv/bin/python -m iac.bench.scenarios.scale bytes [CORPUS.jsonl]

The plan (no sub-command): for each transport and each peer count, a server node runs in a
process of its own (``serve``, the shipped configuration with ``idle_timeout`` off); the peers,
each with an identity of its own, are spread over ``--procs`` client processes and dial all at
once (each dial retried with a jittered, doubling backoff), each getting one request answered:
that is the dial burst (failures, retries, p50/p99 from a client's first attempt to its first
answer, the server's CPU seconds for the burst). Then the load step: ``--requests`` signed RUN
requests, ``--in-flight`` in flight in total, round-robin over every connection; the server's CPU
per request over that step, then its resident set (after a collection and ``malloc_trim``):
the growth over the empty server, divided by the peers, is the memory per peer. Last, the
server's CPU over ``--idle`` seconds with every connection held open and quiet. Before anything,
RLIMIT_NOFILE is raised to its hard limit (the processes inherit it); a peer count the limit does
not allow is skipped, and the result says how many peers it allows.

``memory``, ``burst`` and ``bytes`` are the single probes: the RSS growth per added peer between
``--base`` and ``--peers`` peers, one burst of dials, and the mean signed MESSAGE frame over a
corpus with the shipped dictionary alone, a per-connection derived dictionary, and the prefix
elided (docs/PROTOCOL.md, section 5).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from iac.bench.harness.process import commands, say
from iac.errors import IacError
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.protocol.routing.forward import open_forward
from iac.transport.base import Connection, TransportConfig
from iac.transport.bound import FD_RESERVE
from iac.transport.dialer import Backoff
from iac.transport.endpoints import dial
from iac.wire._pb.iac_pb2 import Message
from iac.wire.dicts import DictionarySet, default_dictionary, derive_dictionary, message_prefix
from iac.wire.elide import elide
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, open_message, sign_message

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "iac" / "bench" / "corpus" / "test.jsonl"
MODULE = "iac.bench.scenarios.scale"
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- the server process --------------------------------------------------------------------------


def live_rss() -> int:
    """Resident set size after a collection and ``malloc_trim`` (what is still held), bytes."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


async def serve(spec: dict[str, Any]) -> None:
    """A node listening on ``spec["listen"]`` that answers RUN with its payload; JSON lines on
    stdout (first ``{"id", "addrs", "rss"}``), commands on stdin: ``rss``, ``stats``, ``quit``.
    ``spec["rlimit_nofile"]``: lower this process's soft RLIMIT_NOFILE to it first."""
    if spec.get("rlimit_nofile"):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(spec["rlimit_nofile"]), hard))
    fields: dict[str, Any] = {"idle_timeout": None, **spec.get("transport", {})}
    transport = TransportConfig(dictionaries=DictionarySet([default_dictionary()]), **fields)
    config = NodeConfig(transport=transport, **spec.get("node", {}))
    async with Node(listen=spec["listen"], config=config) as node:

        @node.on(MessageType.RUN)
        async def echo(ctx: Context) -> object:
            return ctx.payload

        say({"id": node.agent_id, "addrs": node.addresses, "rss": live_rss()})
        async for spec_line in commands():
            cmd = spec_line["cmd"]
            if cmd == "broadcast":  # a flood to every connected peer (this node as their registry)
                t0 = time.monotonic()
                sent = await node.broadcast(MessageType.BROADCAST, {"k": spec_line["k"]})
                say({"t0": t0, "peers": sent.peers})
            elif cmd == "rss":
                say({"rss": live_rss()})
            elif cmd == "stats":
                st = node.stats()
                bound = transport.connections
                cpu = time.process_time()
                say({"connections": st.connections, "handled": st.handled, "held": bound.held, "cpu_s": cpu})
            elif cmd == "quit":
                break


class Server:
    """The ``serve`` process seen from the probe (or a test)."""

    def __init__(self, proc: asyncio.subprocess.Process, info: dict[str, Any]) -> None:
        self.proc = proc
        self.agent_id: str = info["id"]
        self.addresses: list[str] = info["addrs"]

    def address(self, transport: str) -> str:
        return next(a for a in self.addresses if a.startswith(transport + "://"))

    async def command(self, name: str) -> dict[str, Any]:
        return await self.command_with({"cmd": name})

    async def command_with(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        await self.proc.stdin.drain()
        return dict(json.loads(await self.proc.stdout.readline()))

    async def rss(self) -> int:
        return int((await self.command("rss"))["rss"])


@contextlib.asynccontextmanager
async def server(listen: Sequence[str], *, stderr: int | None = None, **spec: Any) -> AsyncIterator[Server]:
    """Start ``serve`` in a process of its own; stop it when the block ends. ``stderr``:
    ``subprocess.PIPE`` to read the server's log (``proc.stderr``, after the block)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        MODULE,
        "serve",
        json.dumps({"listen": list(listen), **spec}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            raise RuntimeError("the server process did not start")
        yield Server(proc, json.loads(line))
    finally:
        with contextlib.suppress(Exception):
            assert proc.stdin is not None
            proc.stdin.write(b'{"cmd": "quit"}\n')
            await proc.stdin.drain()
            await asyncio.wait_for(proc.wait(), 10)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# --- client peers --------------------------------------------------------------------------------


def client_config(**kw: Any) -> TransportConfig:
    """What a light client peer uses: the shipped dictionary, connections kept open."""
    return TransportConfig(dictionaries=DictionarySet([default_dictionary()]), idle_timeout=None, **kw)


def run_frame(me: Identity, to: str, session: Session, body: object, timeout: float) -> Message:
    """A RUN request to ``to``, answered within ``timeout`` seconds."""
    now_us = time.time_ns() // 1000
    return build_message(
        sender=me.agent_id,
        to=to,
        msg_type=MessageType.RUN,
        session=session,
        timestamp_us=now_us,
        payload_json=json.dumps(body),
        deadline_us=now_us + int(timeout * 1e6),
    )


async def request(conn: Connection, identity: Identity, server_id: str, payload: object) -> object:
    """One signed RUN request on ``conn``; its answer's payload."""
    msg = run_frame(identity, server_id, Session(), payload, 10.0)
    await conn.send(encode_frame(FrameType.MESSAGE, sign_message(identity, msg)))
    reply = open_message((await conn.recv()).frame.body)
    if int(reply.msg_type) != MessageType.REPLY or reply.reply_to != msg.msg_id:
        raise IacError(f"unexpected answer: {MessageType(reply.msg_type).name}")
    return json.loads(reply.payload_json)


async def open_peer(
    url: str,
    server_id: str,
    config: TransportConfig,
    *,
    attempts: int = 6,
    backoff: float = 0.2,
    identity: Identity | None = None,
) -> tuple[Connection, float, int]:
    """A new identity (or ``identity``) connects and gets one request answered: ``(connection,
    seconds from the first attempt, attempts made)``. A failed attempt is retried after a
    jittered, doubling pause (``backoff`` to 3.2 s); the last failure is raised."""
    identity = identity or Identity.generate()
    pause = Backoff(initial=backoff, maximum=3.2, jitter=0.5)
    t0 = time.monotonic()
    for n in range(1, attempts + 1):
        try:
            conn = await dial(url, identity, expect=server_id, config=config)
            try:
                await asyncio.wait_for(request(conn, identity, server_id, {"n": n}), config.handshake_timeout)
            except BaseException:
                await conn.close()
                raise
            return conn, time.monotonic() - t0, n
        except (IacError, TimeoutError):
            if n == attempts:
                raise
            await asyncio.sleep(pause.next_delay())
    raise AssertionError("unreachable")  # pragma: no cover


async def open_peers(
    url: str, server_id: str, n: int, config: TransportConfig, *, at_once: int | None = None
) -> tuple[list[Connection], list[float], list[BaseException], int]:
    """``n`` peers via :func:`open_peer`, ``at_once`` at a time (None: all at once): the
    connections, each one's time from its first attempt, the failures, the retries made."""
    gate = asyncio.Semaphore(at_once or n)

    async def one() -> tuple[Connection, float, int]:
        async with gate:
            return await open_peer(url, server_id, config)

    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    conns = [r[0] for r in results if isinstance(r, tuple)]
    times = [r[1] for r in results if isinstance(r, tuple)]
    errors = [r for r in results if isinstance(r, BaseException)]
    retries = sum(r[2] - 1 for r in results if isinstance(r, tuple))
    return conns, times, errors, retries


async def close_all(conns: Sequence[Connection]) -> None:
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


# --- client peers under load ------------------------------------------------------------------


class Broadcasts:
    """The broadcasts the peers of one client process handled (verified), by key: when each
    arrived, and an event set once every one of ``expected`` peers handled it."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived: dict[int, list[float]] = {}
        self._done: dict[int, asyncio.Event] = {}

    def done(self, key: int) -> asyncio.Event:
        return self._done.setdefault(key, asyncio.Event())

    def handled(self, key: int) -> None:
        times = self.arrived.setdefault(key, [])
        times.append(time.monotonic())  # CLOCK_MONOTONIC: one clock for every process of the machine
        if len(times) >= self.expected:
            self.done(key).set()


class Peer:
    """A client peer's connection with many requests in flight: answers are matched to their
    requests by ``reply_to`` (one :class:`Session` per peer, so message ids do not repeat).
    The server's signed MESSAGE frames are counted (``frames``, ``frame_bytes``: their size on
    the wire, as this side read them); a broadcast (FORWARD) is verified and told to ``board``."""

    def __init__(
        self, conn: Connection, identity: Identity, server_id: str, board: Broadcasts | None = None
    ) -> None:
        self.conn, self.identity, self.server_id = conn, identity, server_id
        self.session = Session()
        self.pending: dict[int, asyncio.Future[None]] = {}
        self.board = board
        self.frames = self.frame_bytes = 0
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                frame = (await self.conn.recv()).frame
                if frame.type == FrameType.FORWARD:
                    _env, msg = open_forward(frame.body)
                    if self.board is not None:
                        self.board.handled(int(json.loads(msg.payload_json)["k"]))
                    continue
                self.frames += 1
                self.frame_bytes += frame.wire_size
                reply = open_message(frame.body)
                fut = self.pending.pop(reply.reply_to, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
        except (IacError, ConnectionError, asyncio.IncompleteReadError) as exc:
            for fut in self.pending.values():
                if not fut.done():
                    fut.set_exception(IacError(f"connection lost: {exc!r}"))
            self.pending.clear()

    async def call(self, payload: object, timeout: float = 10.0) -> None:
        msg = run_frame(self.identity, self.server_id, self.session, payload, timeout)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending[msg.msg_id] = fut
        await self.conn.send(encode_frame(FrameType.MESSAGE, sign_message(self.identity, msg)))
        await asyncio.wait_for(fut, timeout)

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader
        await self.conn.close()


async def load(peers: Sequence[Peer], count: int, in_flight: int) -> int:
    """``count`` requests, ``in_flight`` at a time, round-robin over ``peers``; the failures."""
    it = iter(range(count))
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for i in it:
            try:
                await peers[i % len(peers)].call({"i": i})
            except (IacError, TimeoutError):
                failed += 1

    await asyncio.gather(*(worker() for _ in range(max(1, min(in_flight, count)))))
    return failed


async def _client_proc(url: str, server_id: str, n: int, at_once: int | None) -> dict[str, Any]:
    """Open ``n`` peers in this process and report; then run the ``load`` commands read from
    stdin (``{"cmd": "load", "count", "in_flight"}``) until stdin closes; then close them."""
    gate = asyncio.Semaphore(at_once or n)
    config = client_config()
    board = Broadcasts(0)

    async def one() -> tuple[Peer, float, int]:
        identity = Identity.generate()
        async with gate:
            conn, took, tries = await open_peer(url, server_id, config, identity=identity)
        return Peer(conn, identity, server_id, board), took, tries

    cpu0 = time.process_time()
    results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    peers = [r[0] for r in results if isinstance(r, tuple)]
    errors = [r for r in results if isinstance(r, BaseException)]
    board.expected = len(peers)
    say(
        {
            "cpu_s": time.process_time() - cpu0,  # this process's CPU for its share of the burst
            "ok": len(peers),
            "errors": [repr(e) for e in errors[:5]],
            "failed": len(errors),
            "retries": sum(r[2] - 1 for r in results if isinstance(r, tuple)),
            "times": [r[1] for r in results if isinstance(r, tuple)],
        }
    )
    async for cmd in commands():
        if cmd["cmd"] == "topup":  # the peers the burst lost, dialed again a few at a time
            few = asyncio.Semaphore(int(cmd["at_once"]))

            async def again(few: asyncio.Semaphore = few) -> tuple[Peer, float, int]:
                async with few:
                    return await one()

            more = await asyncio.gather(*(again() for _ in range(n - len(peers))), return_exceptions=True)
            peers += [r[0] for r in more if isinstance(r, tuple)]
            board.expected = len(peers)
            say(
                {
                    "ok": sum(isinstance(r, tuple) for r in more),
                    "failed": sum(isinstance(r, BaseException) for r in more),
                }
            )
            continue
        if cmd["cmd"] == "bcast":  # wait until every peer here handled broadcast ``k``
            key = int(cmd["k"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(board.done(key).wait(), float(cmd.get("timeout", 60.0)))
            times = board.arrived.get(key, [])
            say({"got": len(times), "last": max(times, default=None)})
            continue
        for p in peers:
            p.frames = p.frame_bytes = 0
        cpu0, t0 = time.process_time(), time.monotonic()
        failed = await load(peers, int(cmd["count"]), int(cmd["in_flight"])) if peers else cmd["count"]
        say(
            {
                "failed": failed,
                "cpu_s": time.process_time() - cpu0,
                "wall_s": time.monotonic() - t0,
                "frames": sum(p.frames for p in peers),
                "frame_bytes": sum(p.frame_bytes for p in peers),
            }
        )
    await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
    return {}


async def _spread(url: str, server_id: str, n: int, procs: int, at_once: int | None) -> tuple[list[Any], Any]:
    """``n`` peers over ``procs`` client processes; their reports, and the processes (held open)."""
    share = [n // procs + (i < n % procs) for i in range(procs)]
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            MODULE,
            "client",
            json.dumps({"url": url, "server": server_id, "n": k, "at_once": at_once}),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(ROOT),
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for k in share
        if k
    ]
    reports = [json.loads(await c.stdout.readline()) for c in children if c.stdout is not None]
    return reports, children


async def _load_all(children: Sequence[asyncio.subprocess.Process], count: int, in_flight: int) -> list[Any]:
    """A load step over every client process: ``count`` requests, ``in_flight`` in flight, split
    evenly between the processes; their reports."""
    m = len(children)
    for i, c in enumerate(children):
        assert c.stdin is not None
        k, f = count // m + (i < count % m), max(1, in_flight // m + (i < in_flight % m))
        c.stdin.write(json.dumps({"cmd": "load", "count": k, "in_flight": f}).encode() + b"\n")
        await c.stdin.drain()
    return [json.loads(await c.stdout.readline()) for c in children if c.stdout is not None]


async def _ask_all(children: Sequence[asyncio.subprocess.Process], cmd: dict[str, Any]) -> list[Any]:
    """One command to every client process; their answers."""
    for c in children:
        assert c.stdin is not None
        c.stdin.write(json.dumps(cmd).encode() + b"\n")
        await c.stdin.drain()
    return [json.loads(await c.stdout.readline()) for c in children if c.stdout is not None]


async def broadcast_rounds(
    srv: Server, children: Sequence[asyncio.subprocess.Process], rounds: int
) -> dict[str, Any]:
    """``rounds`` broadcasts from the server node (the registry every peer is connected to), one
    at a time: each one's time from the server's ``broadcast()`` call to the moment the last of
    the connected peers handled (verified) it; and the fewest peers one reached."""
    took: list[float] = []
    reached: list[int] = []
    for k in range(rounds):
        sent = await srv.command_with({"cmd": "broadcast", "k": k})
        answers = await _ask_all(children, {"cmd": "bcast", "k": k})
        reached.append(sum(a["got"] for a in answers))
        lasts = [a["last"] for a in answers if a["last"] is not None]
        if lasts:
            took.append(max(lasts) - sent["t0"])
    return {
        "rounds": rounds,
        "sent_to": sent["peers"] if rounds else 0,
        "reached_min": min(reached, default=0),
        "median_s": statistics.median(took) if took else None,
        "max_s": max(took, default=None),
    }


async def _release(children: Sequence[asyncio.subprocess.Process]) -> None:
    for c in children:
        if c.stdin is not None:
            c.stdin.close()
    await asyncio.gather(*(c.wait() for c in children))


# --- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one run measures (``--quick``: small enough for ``iac bench --quick``)."""

    peers: tuple[int, ...] = (1, 10, 100, 1_000, 10_000)
    transports: tuple[str, ...] = ("tls", "quic")
    procs: int = 4
    requests: int = 2_000
    in_flight: int = 64
    idle_s: float = 10.0
    broadcasts: int = 3
    #: After the burst, the peers it lost are dialed again this many at a time per client process,
    #: so that the later figures are over every peer (0: not; the burst's own figures are kept).
    top_up: int = 8


QUICK = Plan(peers=(1, 10, 50), procs=2, requests=200, idle_s=1.0, broadcasts=1)


def raise_nofile() -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (children inherit it): the new
    ``(soft, hard)``."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def peers_allowed(nofile: int) -> int:
    """Peers one server node can hold at this RLIMIT_NOFILE: one descriptor per TLS connection,
    less the node's reserve (:data:`FD_RESERVE`) and as many again for the process itself (a QUIC
    server holds one socket, but each client process one per connection it holds)."""
    return max(0, nofile - 2 * FD_RESERVE)


def _burst(reports: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """One burst of dials over the client processes' ``reports``."""
    times = [t for r in reports for t in r["times"]]
    total = {k: sum(r[k] for r in reports) for k in ("ok", "failed", "retries")}
    errors = [e for r in reports for e in r["errors"]][:5]
    pcts = {"p50_s": _pct(times, 0.5), "p99_s": _pct(times, 0.99)}
    client_cpu = sum(r.get("cpu_s", 0.0) for r in reports)  # the clients' CPU for their dials
    return {**total, "errors": errors, "wall_s": wall, **pcts, "client_cpu_s": client_cpu}


def _pct(xs: Sequence[float], q: float) -> float | None:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else None


async def measure_step(transport: str, peers: int, plan: Plan) -> dict[str, Any]:
    """One transport at one peer count: the dial burst, the load step, memory, idle CPU."""
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        rss0 = await srv.rss()
        cpu0 = (await srv.command("stats"))["cpu_s"]
        t0 = time.monotonic()
        reports, children = await _spread(url, srv.agent_id, peers, min(plan.procs, peers), None)
        burst_wall = time.monotonic() - t0
        try:
            cpu1 = (await srv.command("stats"))["cpu_s"]
            topup = {"ok": 0, "failed": 0}
            if plan.top_up and sum(r["failed"] for r in reports):
                for a in await _ask_all(children, {"cmd": "topup", "at_once": plan.top_up}):
                    topup = {k: topup[k] + a[k] for k in topup}
            loads = await _load_all(children, plan.requests, plan.in_flight)
            cpu2 = (await srv.command("stats"))["cpu_s"]
            rss1 = await srv.rss()
            cpu3 = (await srv.command("stats"))["cpu_s"]
            await asyncio.sleep(plan.idle_s)  # the measurement window: every connection quiet
            st = await srv.command("stats")
            flood = await broadcast_rounds(srv, children, plan.broadcasts)
        finally:
            await _release(children)
    ok = sum(r["ok"] for r in reports)
    held = ok + topup["ok"]  # the peers every later figure is over
    done = plan.requests - sum(x["failed"] for x in loads)
    return {
        "transport": transport,
        "peers": peers,
        "connected": held,
        "topped_up": topup,
        "server_connections": st["connections"],
        "burst": {**_burst(reports, burst_wall), "server_cpu_s": cpu1 - cpu0},
        "requests": plan.requests,
        "requests_failed": plan.requests - done,
        "server_cpu_us_per_request": (cpu2 - cpu1) / max(1, done) * 1e6,
        "client_cpu_us_per_request": sum(x["cpu_s"] for x in loads) / max(1, done) * 1e6,
        "load_wall_s": max(x["wall_s"] for x in loads),
        "rss_empty_mib": rss0 / 2**20,
        "rss_mib": rss1 / 2**20,
        "per_peer_kib": (rss1 - rss0) / max(1, held) / 1024,
        "idle_cpu_percent": (st["cpu_s"] - cpu3) / plan.idle_s * 100,
        # the server node's signed MESSAGE frames (its REPLYs) over the load step, as read
        "message_frame_bytes": sum(x.get("frame_bytes", 0) for x in loads)
        / max(1, sum(x.get("frames", 0) for x in loads)),
        "broadcast": flood,
    }


async def measure(plan: Plan, progress: Any = None) -> dict[str, Any]:
    """Every step of ``plan``; the steps the descriptor limit does not allow are listed, skipped."""
    soft, hard = raise_nofile()
    allowed = peers_allowed(soft)
    steps, skipped = [], []
    for n in plan.peers:
        if n > allowed:
            skipped.append(n)
            continue
        for t in plan.transports:
            if progress is not None:
                progress(f"{t} at {n} peers")
            steps.append(await measure_step(t, n, plan))
    return {
        "plan": asdict(plan),
        "corpus_frame_bytes": probe_bytes(CORPUS),
        "rlimit_nofile": {"soft": soft, "hard": hard},
        "peers_allowed": allowed,
        "skipped_peers": skipped,
        "steps": steps,
    }


LABEL = {"tls": "IAC-TLS/TCP", "quic": "IAC-QUIC"}


def _one(x: float) -> dict[str, float]:
    return {"median": x, "min": x, "max": x, "n": 1}


def scenario(ctx: Any, res: Any, run_script: Any) -> None:
    """``iac bench --only scale``: the plan in a child process, its figures as the suite's rows.
    ``IAC_SCALE_PEERS`` (e.g. ``1,10,100,1000``) replaces the full plan's peer counts."""
    ctx.progress("scale.py")
    args = ["--quick"] if ctx.quick else []
    if peers := os.environ.get("IAC_SCALE_PEERS"):
        args += ["--peers", peers]
    fill(res, run_script(ctx, "scale.py", args, 600 if ctx.quick else 7200))


def fill(res: Any, data: dict[str, Any]) -> None:
    """The suite's rows of this module's output."""
    p = data["plan"]
    for s in data["steps"]:
        who, n, b = LABEL[s["transport"]], s["peers"], s["burst"]
        res.add(who, f"server RSS per peer, {n} peers", "KiB", _one(s["per_peer_kib"]))
        cpu = _one(s["server_cpu_us_per_request"])
        res.add(who, f"server CPU per request at {p['in_flight']} in flight, {n} peers", "µs", cpu)
        res.add(who, f"server idle CPU, {n} peers held", "%", _one(s["idle_cpu_percent"]))
        if b["p99_s"] is not None:
            res.add(who, f"dial burst p99 to first answer, {n} at once", "s", _one(b["p99_s"]))
        res.add(who, f"dial burst failures, {n} at once", "dials", _one(float(b["failed"])))
        if s.get("message_frame_bytes"):
            res.add(
                who, f"signed MESSAGE frame at the load step, {n} peers", "B", _one(s["message_frame_bytes"])
            )
        flood = s.get("broadcast") or {}
        if flood.get("median_s") is not None:
            res.add(who, f"broadcast handled by all {n} peers", "ms", _one(flood["median_s"] * 1e3))
    res.notes.append(
        f"scenarios/scale.py: one server node per transport and peer count; peers over {p['procs']} client "
        f"processes dial at once, then {p['requests']} requests at {p['in_flight']} in flight round-robin; "
        f"RSS per peer = growth over the empty server; idle CPU over {p['idle_s']:g} s. RLIMIT_NOFILE "
        f"{data['rlimit_nofile']['soft']} allows {data['peers_allowed']} peers"
        + (
            f"; skipped: {', '.join(map(str, data['skipped_peers']))} peers."
            if data["skipped_peers"]
            else "."
        )
    )
    res.raw = data


# --- single probes -----------------------------------------------------------------------------


async def probe_memory(transport: str, peers: int, base: int, procs: int) -> dict[str, Any]:
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        first, c1 = await _spread(url, srv.agent_id, base, procs, 64)
        rss0 = await srv.rss()
        more, c2 = await _spread(url, srv.agent_id, peers - base, procs, 64)
        rss1 = await srv.rss()
        failed = sum(r["failed"] for r in first + more)
        retries = sum(r["retries"] for r in first + more)
        await _release(c1 + c2)
    added = sum(r["ok"] for r in more)  # the peers that connected between the two readings
    return {
        "transport": transport,
        "peers": peers,
        "rss_base_mib": rss0 / 2**20,
        "rss_mib": rss1 / 2**20,
        "per_peer_kib": (rss1 - rss0) / max(1, added) / 1024,
        "failed": failed,
        "retries": retries,
    }


async def probe_burst(transport: str, dials: int, procs: int) -> dict[str, Any]:
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        cpu0 = (await srv.command("stats"))["cpu_s"]
        t0 = time.monotonic()
        reports, children = await _spread(url, srv.agent_id, dials, procs, None)
        wall = time.monotonic() - t0
        cpu1 = (await srv.command("stats"))["cpu_s"]
        await _release(children)
    return {"transport": transport, "dials": dials, "server_cpu_s": cpu1 - cpu0, **_burst(reports, wall)}


def probe_bytes(corpus: Path) -> dict[str, float]:
    a, b = Identity.from_seed(bytes(range(32))), Identity.from_seed(bytes(range(32, 64)))
    d = default_dictionary()
    derived = derive_dictionary(
        d, message_prefix(b.agent_id, a.agent_id) + message_prefix(a.agent_id, b.agent_id)
    )
    prefix = message_prefix(a.agent_id, b.agent_id)
    session = Session(1)
    cols: dict[str, list[int]] = {"shipped": [], "derived": [], "elided": []}
    for i, line in enumerate(x for x in corpus.read_text(encoding="utf-8").splitlines() if x.strip()):
        msg = build_message(
            sender=a.agent_id,
            to=b.agent_id,
            msg_type=MessageType.COMMAND,
            session=session,
            timestamp_us=1_780_000_000_000_000 + i * 1000,
            payload_json=line,
        )
        body = sign_message(a, msg)
        cols["shipped"].append(len(encode_frame(FrameType.MESSAGE, body, compress_with=d)))
        cols["derived"].append(len(encode_frame(FrameType.MESSAGE, body, compress_with=derived)))
        cols["elided"].append(len(encode_frame(FrameType.MESSAGE, elide(body, prefix), compress_with=d)))
    return {k: statistics.fmean(v) for k, v in cols.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small plan: 1, 10, 50 peers, 200 requests")
    ap.add_argument("--peers", default=None, help="peer counts, comma-separated (1,10,100,1000,10000)")
    ap.add_argument("--transports", default=None, help="comma-separated (tls,quic)")
    ap.add_argument("--procs", type=int, default=None, help="client processes (4; quick: 2)")
    ap.add_argument("--idle", type=float, default=None, help="idle CPU window, s (10; quick: 1)")
    ap.add_argument("--json", default=None, help="write the results here")
    sub = ap.add_subparsers(dest="cmd")
    for name in ("serve", "client"):
        sub.add_parser(name, help=argparse.SUPPRESS).add_argument("spec")
    m = sub.add_parser("memory", help="server RSS growth per added peer")
    m.add_argument("--transport", choices=("tls", "quic", "unix"), default="tls")
    m.add_argument("--peers", type=int, default=1000)
    m.add_argument("--base", type=int, default=50, help="peers connected before the first reading (50)")
    m.add_argument("--procs", type=int, default=4, help="client processes (4)")
    b = sub.add_parser("burst", help="dials arriving at once")
    b.add_argument("--transport", choices=("tls", "quic"), default="quic")
    b.add_argument("--dials", type=int, default=1000)
    b.add_argument("--procs", type=int, default=4, help="client processes (4)")
    y = sub.add_parser("bytes", help="mean signed MESSAGE frame over a corpus")
    y.add_argument("corpus", nargs="?", type=Path, default=CORPUS)
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        level = os.environ.get("IAC_PROBE_LOG")  # e.g. INFO: the server's refusals on stderr
        if level:
            logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        asyncio.run(serve(json.loads(args.spec)))
        return 0
    if args.cmd == "client":
        s = json.loads(args.spec)
        asyncio.run(_client_proc(s["url"], s["server"], s["n"], s["at_once"]))
        return 0
    out: Any
    if args.cmd == "memory":
        out = asyncio.run(probe_memory(args.transport, args.peers, args.base, args.procs))
    elif args.cmd == "burst":
        out = asyncio.run(probe_burst(args.transport, args.dials, args.procs))
    elif args.cmd == "bytes":
        out = probe_bytes(args.corpus)
    else:
        plan = make_plan(args.quick, args.peers, args.transports, args.procs, args.idle)
        data = asyncio.run(measure(plan, lambda what: print(what, file=sys.stderr, flush=True)))
        if args.json:
            Path(args.json).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        else:
            from iac.bench.reports import live

            live.print_rows(MODULE, [("scale", fill, data)], ["scale"])
        return 0
    print(json.dumps(out, indent=1))
    return 0


def make_plan(
    quick: bool,
    peers: str | None = None,
    transports: str | None = None,
    procs: int | None = None,
    idle_s: float | None = None,
) -> Plan:
    """The full plan or :data:`QUICK`, with what the command line replaces."""
    plan = QUICK if quick else Plan()
    if peers:
        plan = replace(plan, peers=tuple(int(x) for x in peers.split(",")))
    if transports:
        plan = replace(plan, transports=tuple(transports.split(",")))
    if procs:
        plan = replace(plan, procs=procs)
    if idle_s is not None:
        plan = replace(plan, idle_s=idle_s)
    return plan


if __name__ == "__main__":
    sys.exit(main())
