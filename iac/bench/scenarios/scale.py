"""Scale: a server node's memory per connected peer, CPU per request and idle, dial bursts,
broadcasts and relayed frames, at 1 to 10,000 peers, over TLS and QUIC (``iac bench --only scale``).

    .venv/bin/python -m iac.bench.scenarios.scale [--quick] [--peers 1,10,100,1000] [--big] [--json FILE]

The method (server and client processes, the dial burst, the load step, what each figure is) is
in benchmarks/README.md, "Scale: many peers on one node"; single probes: tools/scale_probe.py.
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
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO, Any

from iac.bench.harness.paths import ROOT, TEST_CORPUS, child_env
from iac.bench.harness.process import EndpointError, commands, say
from iac.errors import IacError
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.protocol.routing.decisions import RelayPolicy
from iac.protocol.routing.forward import open_forward, wrap_forward
from iac.transport.base import Connection, TransportConfig
from iac.transport.bound import FD_RESERVE
from iac.transport.dialer import Backoff
from iac.transport.endpoints import dial
from iac.wire._pb.iac_pb2 import Message
from iac.wire.dicts import DictionarySet, default_dictionary, derive_dictionary, message_prefix
from iac.wire.elide import compact_forward, elide
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, open_message, sign_message

CORPUS = TEST_CORPUS
CORPUS_LINES = [x for x in CORPUS.read_text(encoding="utf-8").splitlines() if x.strip()]
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
    relay = RelayPolicy(relay_unicast=True)  # relays unicast FORWARDs, as `iac registry --relay` does
    config = NodeConfig(transport=transport, relay_policy=relay, **spec.get("node", {}))
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

    async def command(self, name: str, **fields: Any) -> dict[str, Any]:
        return dict((await _ask([self.proc], {"cmd": name, **fields}))[0])

    async def rss(self) -> int:
        return int((await self.command("rss"))["rss"])


@contextlib.asynccontextmanager
async def server(listen: Sequence[str], *, stderr: int | None = None, **spec: Any) -> AsyncIterator[Server]:
    """Start ``serve`` in a process of its own; stop it when the block ends. ``stderr``:
    ``subprocess.PIPE`` to read the server's log (``proc.stderr``, after the block)."""
    proc = await _child("serve", {"listen": list(listen), **spec}, stderr)
    try:
        yield Server(proc, (await asyncio.wait_for(_answers([proc]), 30))[0])
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
    return build_message(sender=me.agent_id, to=to, msg_type=MessageType.RUN, session=session,
                         timestamp_us=now_us, payload_json=json.dumps(body),
                         deadline_us=now_us + int(timeout * 1e6))  # fmt: skip


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


# --- client peers under load ------------------------------------------------------------------


class Broadcasts:
    """The broadcasts the peers of one client process handled (verified), by key: when each
    arrived, and an event set once every one of ``expected`` peers handled it."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.arrived: dict[int, list[float]] = {}
        self._done: dict[int, asyncio.Event] = {}
        self.own: set[int] = set()  # keys one of these peers originated (it does not get it back)
        self.relayed = self.relayed_bytes = 0  # unicast FORWARDs the relay delivered, their bytes
        self.relayed_due = 0
        self.relayed_all = asyncio.Event()

    def relay_arrived(self, size: int) -> None:
        self.relayed, self.relayed_bytes = self.relayed + 1, self.relayed_bytes + size
        if self.relayed >= self.relayed_due:
            self.relayed_all.set()

    def done(self, key: int) -> asyncio.Event:
        return self._done.setdefault(key, asyncio.Event())

    def handled(self, key: int) -> None:
        times = self.arrived.setdefault(key, [])
        times.append(time.monotonic())  # CLOCK_MONOTONIC: one clock for every process of the machine
        if len(times) >= self.expected - (key in self.own):
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
                    if self.board is not None and msg.to:
                        self.board.relay_arrived(frame.wire_size)
                    elif self.board is not None:
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

    async def forward(self, to: str, payload_json: str) -> float:
        """A signed message to ``to`` (empty: a broadcast) inside a FORWARD to the server, which
        relays it; the moment it was sent."""
        now_us = time.time_ns() // 1000
        msg_type = MessageType.COMMAND if to else MessageType.BROADCAST
        me, session = self.identity.agent_id, self.session
        msg = build_message(sender=me, to=to, msg_type=msg_type, session=session, timestamp_us=now_us,
                            payload_json=payload_json)  # fmt: skip
        body = wrap_forward(sign_message(self.identity, msg), 8 if to else 16, [me])
        t0 = time.monotonic()
        await self.conn.send(encode_frame(FrameType.FORWARD, body))
        return t0

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader
        await self.conn.close()


def small(i: int) -> object:
    return {"i": i}


async def load(peers: Sequence[Peer], count: int, in_flight: int, body: Any = small) -> int:
    """``count`` requests (``body(i)``), ``in_flight`` at a time, round-robin over ``peers``; the
    failures."""
    it = iter(range(count))
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for i in it:
            try:
                await peers[i % len(peers)].call(body(i))
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
    done = [r for r in results if isinstance(r, tuple)]
    peers, errors = [r[0] for r in done], [r for r in results if isinstance(r, BaseException)]
    board.expected, tries = len(peers), [r[2] for r in done]
    cpu = time.process_time() - cpu0  # this process's CPU for its share of the burst
    say({"cpu_s": cpu, "ok": len(peers), "errors": [repr(e) for e in errors[:5]], "failed": len(errors),
         "retries": sum(tries) - len(tries), "times": [r[1] for r in done], "tries": tries})  # fmt: skip
    async for cmd in commands():
        if cmd["cmd"] == "originate":  # a broadcast of this process's first peer, through the server
            board.own.add(int(cmd["k"]))
            say({"t0": await peers[0].forward("", json.dumps({"k": cmd["k"]}))})
            continue
        if cmd["cmd"] == "topup":  # the peers the burst lost, dialed again a few at a time
            few = asyncio.Semaphore(int(cmd["at_once"]))

            async def again(few: asyncio.Semaphore = few) -> tuple[Peer, float, int]:
                async with few:
                    return await one()

            more = await asyncio.gather(*(again() for _ in range(n - len(peers))), return_exceptions=True)
            got = [r[0] for r in more if isinstance(r, tuple)]
            peers += got
            board.expected = len(peers)
            say({"ok": len(got), "failed": len(more) - len(got)})
            continue
        if cmd["cmd"] == "bcast":  # wait until every peer here handled broadcast ``k``
            key = int(cmd["k"])
            with contextlib.suppress(TimeoutError):
                due = board.expected - (key in board.own) > 0  # someone here is to get it
                await asyncio.wait_for(board.done(key).wait(), float(cmd.get("timeout", 60.0)) * due)
            times = board.arrived.get(key, [])
            say(
                {
                    "got": len(times),
                    "of": board.expected - (key in board.own),
                    "last": max(times, default=None),
                }
            )
            continue
        for p in peers:
            p.frames = p.frame_bytes = 0
        # "load": small requests; "corpus": requests carrying the corpus's lines (from line
        # ``first``), then as many of its lines relayed by the server from peer i to peer i + 1
        k, n, first, lines = int(cmd["count"]), len(peers), int(cmd.get("first", 0)), CORPUS_LINES
        line = lambda i, f=first: json.loads(CORPUS_LINES[(f + i) % len(CORPUS_LINES)])  # noqa: E731
        body = small if cmd["cmd"] == "load" else line
        cpu0, t0 = time.process_time(), time.monotonic()
        failed = await load(peers, k, int(cmd["in_flight"]), body) if peers else k
        report = {"failed": failed, "cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - t0}
        report |= {"frames": sum(p.frames for p in peers), "frame_bytes": sum(p.frame_bytes for p in peers)}
        if cmd["cmd"] == "corpus":
            board.relayed = board.relayed_bytes = 0
            board.relayed_due, board.relayed_all = (k if n > 1 else 0), asyncio.Event()
            for i in range(board.relayed_due):
                await peers[i % n].forward(
                    peers[(i + 1) % n].identity.agent_id, lines[(first + i) % len(lines)]
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(board.relayed_all.wait(), 30.0 if board.relayed_due else 0.0)
            report |= {
                "relayed_sent": board.relayed_due,
                "relayed": board.relayed,
                "relayed_bytes": board.relayed_bytes,
            }
        say(report)
    await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)
    return {}


#: Each child process's name and stderr, by pid: a client's is a temporary file (copied to this
#: process's stderr when it is released), a server's this process's stderr or the caller's pipe.
_CHILDREN: dict[int, tuple[str, IO[bytes] | None]] = {}


async def _child(cmd: str, spec: dict[str, Any], stderr: int | None = None) -> asyncio.subprocess.Process:
    """``python -m MODULE CMD SPEC``: a child process driven by JSON lines on stdin and stdout."""
    argv, pipe = [sys.executable, "-m", MODULE, cmd, json.dumps(spec)], subprocess.PIPE
    err = tempfile.TemporaryFile() if cmd == "client" else None  # noqa: SIM115 (closed by _release)
    c = await asyncio.create_subprocess_exec(
        *argv, stdin=pipe, stdout=pipe, stderr=err or stderr, cwd=ROOT, env=child_env()
    )
    _CHILDREN[c.pid] = (f"{cmd} {spec.get('n', spec.get('listen'))}", err)
    return c


async def _answers(children: Sequence[asyncio.subprocess.Process]) -> list[Any]:
    """Each child's next JSON line. A child that closed its stdout instead (it died) raises
    :class:`EndpointError` naming it, its exit code and the tail of its stderr."""
    out = []
    for c in children:
        if line := await c.stdout.readline() if c.stdout else b"":
            out.append(json.loads(line))
            continue
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(c.wait(), 10)
        name, err = _CHILDREN.get(c.pid, ("?", None))
        tail = os.pread(err.fileno(), 1 << 24, 0)[-1500:].decode(errors="replace") if err else "(on stderr)"
        raise EndpointError(f"child {c.pid} ({name}) gave no answer, exit code {c.returncode}: {tail}")
    return out


async def _spread(url: str, server_id: str, n: int, procs: int, at_once: int | None) -> tuple[list[Any], Any]:
    """``n`` peers over ``procs`` client processes; their reports, and the processes (held open)."""
    share = [n // procs + (i < n % procs) for i in range(procs)]
    spec = {"url": url, "server": server_id, "at_once": at_once}
    children = [await _child("client", {**spec, "n": k}) for k in share if k]
    return await _answers(children), children


async def _ask(children: Sequence[asyncio.subprocess.Process], *cmds: dict[str, Any]) -> list[Any]:
    """A command to each child process (one command: the same to all); their answers."""
    for c, cmd in zip(children, cmds * len(children) if len(cmds) == 1 else cmds, strict=True):
        assert c.stdin is not None
        c.stdin.write(json.dumps(cmd).encode() + b"\n")
        await c.stdin.drain()
    return await _answers(children)


async def _load_all(
    children: Sequence[asyncio.subprocess.Process], count: int, in_flight: int, cmd: str = "load"
) -> list[Any]:
    """A load step over every client process: ``count`` requests, ``in_flight`` in flight, split
    evenly between the processes; their reports."""
    m = len(children)
    ks = [count // m + (i < count % m) for i in range(m)]
    fs = [max(1, in_flight // m + (i < in_flight % m)) for i in range(m)]
    cmds = ({"cmd": cmd, "count": k, "in_flight": f, "first": sum(ks[:i])}
            for i, (k, f) in enumerate(zip(ks, fs, strict=True)))  # fmt: skip
    return await _ask(children, *cmds)


async def broadcast_rounds(
    srv: Server, children: Sequence[asyncio.subprocess.Process], rounds: int, relayed: bool = False
) -> dict[str, Any]:
    """``rounds`` broadcasts, one at a time, from the server node (the registry every peer is
    connected to) or, ``relayed``, from a peer of the first client process that the server relays
    to every other: each one's time from its sending to the moment the last of the connected
    peers it was for handled (verified) it; and the fewest peers one reached."""
    took: list[float] = []
    reached: list[int] = []
    sent_to = 0
    for key in range(1000 * relayed, 1000 * relayed + rounds):
        if relayed:
            t0 = (await _ask(children[:1], {"cmd": "originate", "k": key}))[0]["t0"]
        else:
            t0 = (await srv.command("broadcast", k=key))["t0"]
        answers = await _ask(children, {"cmd": "bcast", "k": key})
        reached.append(sum(a["got"] for a in answers))
        sent_to = sum(a["of"] for a in answers)
        lasts = [a["last"] for a in answers if a["last"] is not None]
        if lasts:
            took.append(max(lasts) - t0)
    median = statistics.median(took) if took else None
    return {"rounds": rounds, "sent_to": sent_to, "reached_min": min(reached, default=0), "median_s": median,
            "max_s": max(took, default=None)}  # fmt: skip


async def _release(children: Sequence[asyncio.subprocess.Process]) -> None:
    for c in children:
        if c.stdin is not None:
            c.stdin.close()
    await asyncio.gather(*(c.wait() for c in children))
    for c in children:
        if (err := _CHILDREN.pop(c.pid, ("", None))[1]) is not None:
            sys.stderr.buffer.write(os.pread(err.fileno(), 1 << 24, 0))
            err.close()


# --- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one run measures (``--quick``: small enough for ``iac bench --quick``)."""

    peers: tuple[int, ...] = (1, 10, 100, 1_000)
    transports: tuple[str, ...] = ("tls", "quic")
    #: The big steps, after the others (opt-in: ``--big``, ``IAC_SCALE_BIG=1``): these peer counts
    #: over ``big_transports``, dialed ``big_at_once`` at a time per client process (not a burst).
    big: tuple[int, ...] = ()
    big_transports: tuple[str, ...] = ("tls",)
    big_at_once: int = 64
    procs: int = 4
    requests: int = 2_000
    in_flight: int = 64
    idle_s: float = 10.0
    broadcasts: int = 3
    #: After the burst, the peers it lost are dialed again this many at a time per client process,
    #: so that the later figures are over every peer (0: not; the burst's own figures are kept).
    top_up: int = 8
    #: After the load step: this many requests carrying the corpus's lines (its bytes per signed
    #: MESSAGE frame), and as many messages of the corpus relayed by the server peer to peer.
    corpus: int = 2_000


#: The full plan with the 10,000-peer step (TLS): ``--big``.
BIG = Plan(big=(10_000,))


QUICK = Plan(peers=(1, 10, 50), procs=2, requests=200, idle_s=1.0, broadcasts=1, corpus=100)


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
    # the dials answered at their first attempt (no backoff pause in their time)
    first = [t for r in reports for t, n in zip(r["times"], r.get("tries", ()), strict=False) if n == 1]
    pcts["p99_first_attempt_s"] = _pct(first, 0.99)
    client_cpu = sum(r.get("cpu_s", 0.0) for r in reports)  # the clients' CPU for their dials
    return {**total, "errors": errors, "wall_s": wall, **pcts, "client_cpu_s": client_cpu}


def _pct(xs: Sequence[float], q: float) -> float | None:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] if s else None


async def measure_step(transport: str, peers: int, plan: Plan, at_once: int | None = None) -> dict[str, Any]:
    """One transport at one peer count: the dial burst (``at_once``: that many dials at a time per
    client process instead), the load step (at least one request per peer), memory, idle CPU,
    broadcasts from the server and relayed by it, the corpus direct and relayed."""
    requests = max(plan.requests, peers)
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        rss0 = await srv.rss()
        cpu0 = (await srv.command("stats"))["cpu_s"]
        t0 = time.monotonic()
        reports, children = await _spread(url, srv.agent_id, peers, min(plan.procs, peers), at_once)
        burst_wall = time.monotonic() - t0
        try:
            cpu1 = (await srv.command("stats"))["cpu_s"]
            topup = {"ok": 0, "failed": 0}
            if plan.top_up and sum(r["failed"] for r in reports):
                for a in await _ask(children, {"cmd": "topup", "at_once": plan.top_up}):
                    topup = {k: topup[k] + a[k] for k in topup}
            cpu1t = (await srv.command("stats"))["cpu_s"]  # the load step's CPU starts after the top-up
            loads = await _load_all(children, requests, plan.in_flight)
            cpu2 = (await srv.command("stats"))["cpu_s"]
            rss1 = await srv.rss()
            cpu3 = (await srv.command("stats"))["cpu_s"]
            await asyncio.sleep(plan.idle_s)  # the measurement window: every connection quiet
            st = await srv.command("stats")
            flood = await broadcast_rounds(srv, children, plan.broadcasts)
            relayed = await broadcast_rounds(srv, children, plan.broadcasts, relayed=True)
            corpus = await _load_all(children, plan.corpus, plan.in_flight, "corpus")
        finally:
            await _release(children)
    ok = sum(r["ok"] for r in reports)
    held = ok + topup["ok"]  # the peers every later figure is over
    done = requests - sum(x["failed"] for x in loads)
    tot = {k: sum(x[k] for x in corpus) for k in corpus[0]} if corpus else {}
    return {
        "transport": transport,
        "peers": peers,
        "connected": held,
        "topped_up": topup,
        "server_connections": st["connections"],
        "burst": {**_burst(reports, burst_wall), "server_cpu_s": cpu1 - cpu0, "at_once": at_once},
        "requests": requests,
        "requests_failed": requests - done,
        "server_cpu_us_per_request": (cpu2 - cpu1t) / max(1, done) * 1e6,
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
        "relayed_broadcast": relayed,
        # the corpus: the server's REPLYs echoing its lines (direct, from/to elided), and the
        # FORWARDs it relayed between two peers (the origin's whole signed message inside)
        "corpus": {
            **tot,
            "direct_frame_bytes": tot.get("frame_bytes", 0) / max(1, tot.get("frames", 0)),
            "relayed_frame_bytes": tot.get("relayed_bytes", 0) / max(1, tot.get("relayed", 0)),
        },
    }


async def measure(plan: Plan, progress: Any = None) -> dict[str, Any]:
    """Every step of ``plan``; the steps the descriptor limit does not allow are listed, skipped."""
    soft, hard = raise_nofile()
    allowed = peers_allowed(soft)
    steps, skipped = [], []
    todo: list[tuple[int, tuple[str, ...], int | None]] = [(n, plan.transports, None) for n in plan.peers]
    todo += [(n, plan.big_transports, plan.big_at_once) for n in plan.big]
    for n, transports, at_once in todo:
        if n > allowed:
            skipped.append(n)
            continue
        for t in transports:
            if progress is not None:
                progress(f"{t} at {n} peers")
            steps.append(await measure_step(t, n, plan, at_once))
    return {"plan": asdict(plan), "corpus_frame_bytes": probe_bytes(CORPUS),
            "rlimit_nofile": {"soft": soft, "hard": hard}, "peers_allowed": allowed,
            "skipped_peers": skipped, "steps": steps}  # fmt: skip


LABEL = {"tls": "IAC-TLS/TCP", "quic": "IAC-QUIC"}


def scenario(ctx: Any, res: Any, run_script: Any) -> None:
    """``iac bench --only scale``: the plan in a child process, its figures as the suite's rows.
    ``IAC_SCALE_PEERS`` (e.g. ``1,10,100``) replaces the full plan's peer counts; ``IAC_SCALE_BIG=1``
    adds the 10,000-peer step (``--big``)."""
    ctx.progress("scale.py")
    args = ["--quick"] if ctx.quick else []
    if peers := os.environ.get("IAC_SCALE_PEERS"):
        args += ["--peers", peers]
    if os.environ.get("IAC_SCALE_BIG") == "1" and not ctx.quick:
        args += ["--big"]
    fill(res, run_script(ctx, "scale.py", args, 600 if ctx.quick else 7200))


def fill(res: Any, data: dict[str, Any]) -> None:
    """The suite's rows of this module's output."""
    p = data["plan"]
    for s in data["steps"]:
        who, n, b = LABEL[s["transport"]], s["peers"], s["burst"]
        res.add(who, f"server RSS per peer, {n} peers", "KiB", [s["per_peer_kib"]])
        cpu = [s["server_cpu_us_per_request"]]
        res.add(who, f"server CPU per request at {p['in_flight']} in flight, {n} peers", "µs", cpu)
        res.add(who, f"server idle CPU, {n} peers held", "%", [s["idle_cpu_percent"]])
        if b["p99_s"] is not None:
            res.add(who, f"dial burst p99 to first answer, {n} at once", "s", [b["p99_s"]])
        res.add(who, f"dial burst failures, {n} at once", "dials", [float(b["failed"])])
        if s.get("message_frame_bytes"):
            res.add(who, f"signed MESSAGE frame at the load step, {n} peers", "B", [s["message_frame_bytes"]])
        names = {
            "broadcast": "broadcast handled by all {} peers",
            "relayed_broadcast": "relayed broadcast, {} peers",
        }
        for key, name in names.items():
            if (flood := s.get(key) or {}).get("median_s") is not None:
                res.add(who, name.format(n), "ms", [flood["median_s"] * 1e3])
        for key, what in (("direct_frame_bytes", "direct"), ("relayed_frame_bytes", "through the relay")):
            if x := (s.get("corpus") or {}).get(key):
                res.add(who, f"signed MESSAGE frame of the corpus, {what}, {n} peers", "B", [x])
    res.notes.append(
        f"scenarios/scale.py: one server node per transport and peer count; peers over {p['procs']} client "
        f"processes dial at once, then {p['requests']} requests at {p['in_flight']} in flight round-robin; "
        f"RSS per peer = growth over the empty server; idle CPU over {p['idle_s']:g} s. RLIMIT_NOFILE "
        f"{data['rlimit_nofile']['soft']} allows {data['peers_allowed']} peers; skipped: "
        f"{', '.join(map(str, data['skipped_peers'])) or 'none'}."
    )
    res.raw = data


# --- single probes -----------------------------------------------------------------------------


def probe_bytes(corpus: Path) -> dict[str, float]:
    # The mean signed frame over the corpus's lines, a COMMAND from a to b each: in a MESSAGE frame
    # with the shipped dictionary, a derived one, or the prefix elided; and relayed by r (hop
    # limit 7) in a FORWARD frame, whole or compact (elide-forward/1).
    a, b, r = (Identity.from_seed(bytes(range(n, n + 32))) for n in (0, 32, 64))
    d, ab, ar = default_dictionary(), (a.agent_id, b.agent_id), (a.agent_id, r.agent_id)
    derived = derive_dictionary(d, message_prefix(b.agent_id, a.agent_id) + message_prefix(*ab))
    prefix, session = message_prefix(*ab), Session(1)
    names = ("shipped", "derived", "elided", "relayed", "relayed_compact")
    cols: dict[str, list[int]] = {k: [] for k in names}
    for i, line in enumerate(x for x in corpus.read_text(encoding="utf-8").splitlines() if x.strip()):
        msg = build_message(sender=a.agent_id, to=b.agent_id, msg_type=MessageType.COMMAND, session=session,
                            timestamp_us=1_780_000_000_000_000 + i * 1000, payload_json=line)  # fmt: skip
        body = sign_message(a, msg)
        fwd = wrap_forward(body, 7, ar)
        compact = compact_forward(fwd, r.agent_id, b.agent_id)
        sizes = {
            "shipped": encode_frame(FrameType.MESSAGE, body, compress_with=d),
            "derived": encode_frame(FrameType.MESSAGE, body, compress_with=derived),
            "elided": encode_frame(FrameType.MESSAGE, elide(body, prefix), compress_with=d),
            "relayed": encode_frame(FrameType.FORWARD, fwd, compress_with=d),
            "relayed_compact": encode_frame(FrameType.FORWARD, compact, compress_with=d),
        }
        for k, frame in sizes.items():
            cols[k].append(len(frame))
    return {k: statistics.fmean(v) for k, v in cols.items()}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the small plan: 1, 10, 50 peers, 200 requests")
    ap.add_argument("--peers", default=None, help="peer counts, comma-separated (1,10,100,1000)")
    ap.add_argument("--big", action="store_true", help="add the 10,000-peer step (TLS, 64 dials at a time)")
    ap.add_argument("--big-transports", default=None, help="the big step's transports (tls; e.g. tls,quic)")
    ap.add_argument("--transports", default=None, help="comma-separated (tls,quic)")
    ap.add_argument("--procs", type=int, default=None, help="client processes (4; quick: 2)")
    ap.add_argument("--idle", type=float, default=None, help="idle CPU window, s (10; quick: 1)")
    ap.add_argument("--json", default=None, help="write the results here")
    sub = ap.add_subparsers(dest="cmd")
    for name in ("serve", "client"):
        sub.add_parser(name, help=argparse.SUPPRESS).add_argument("spec")
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
    plan = make_plan(args.quick, args.peers, args.transports, args.procs, args.idle, args.big)
    if args.big_transports:
        plan = replace(plan, big_transports=tuple(args.big_transports.split(",")))
    data = asyncio.run(measure(plan, lambda what: print(what, file=sys.stderr, flush=True)))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    else:
        from iac.bench.reports import live

        live.print_rows(MODULE, [("scale", fill, data)], ["scale"])
    return 0


def make_plan(
    quick: bool,
    peers: str | None = None,
    transports: str | None = None,
    procs: int | None = None,
    idle_s: float | None = None,
    big: bool = False,
) -> Plan:
    """The full plan (``big``: :data:`BIG`) or :data:`QUICK`, with what the command line replaces."""
    plan = QUICK if quick else BIG if big else Plan()
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
