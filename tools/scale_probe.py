"""Scale probes: a server node's memory per connected peer, dial bursts, bytes per frame.

    .venv/bin/python -m tools.scale_probe memory --transport tls --peers 1000 [--procs 4]
    .venv/bin/python -m tools.scale_probe burst --transport quic --dials 1000 [--procs 4]
    .venv/bin/python -m tools.scale_probe bytes [CORPUS.jsonl]

``memory``: a server node runs in a process of its own (``serve``); client peers, each with
an identity of its own, connect over ``--transport`` (in ``--procs`` client processes) and
send it one request each, which it answers. The server's resident set (after a collection
and ``malloc_trim``) is read with ``--base`` peers connected and again with all of them:
the growth divided by the added peers is the memory per peer. ``burst``: ``--dials``
connections dialed at once (each with retries, backoff and jitter, as
:func:`open_peer` does), each sending one request; reports failures and times.
``bytes``: the mean signed MESSAGE frame over a corpus, with the shipped dictionary alone,
a per-connection derived dictionary, and the prefix elided (docs/PROTOCOL.md, section 5).
Connections stay open (``idle_timeout`` off on both sides).
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
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from iac.errors import IacError
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.transport.base import Connection, TransportConfig
from iac.transport.dialer import Backoff
from iac.transport.endpoints import dial
from iac.wire.dicts import DictionarySet, default_dictionary, derive_dictionary, message_prefix
from iac.wire.elide import elide
from iac.wire.enums import MessageType
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import Session, build_message, open_message, sign_message

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "iac" / "bench" / "corpus" / "test.jsonl"
PAGE = os.sysconf("SC_PAGE_SIZE")


# --- the server process --------------------------------------------------------------------------


def live_rss() -> int:
    """Resident set size after a collection and ``malloc_trim`` (what is still held), bytes."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def serve(spec: dict[str, Any]) -> None:
    """A node listening on ``spec["listen"]`` that answers RUN with its payload; JSON lines on
    stdout (first ``{"id", "addrs", "rss"}``), commands on stdin: ``rss``, ``stats``, ``quit``.
    ``spec["rlimit_nofile"]``: lower this process's soft RLIMIT_NOFILE to it first."""
    if spec.get("rlimit_nofile"):
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(spec["rlimit_nofile"]), hard))
    fields: dict[str, Any] = {"idle_timeout": None, **spec.get("transport", {})}
    transport = TransportConfig(dictionaries=DictionarySet([default_dictionary()]), **fields)
    config = NodeConfig(transport=transport, **spec.get("node", {}))
    async with Node(listen=spec["listen"], config=config) as node:

        @node.on(MessageType.RUN)
        async def echo(ctx: Context) -> object:
            return ctx.payload

        _emit({"id": node.agent_id, "addrs": node.addresses, "rss": live_rss()})
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            cmd = json.loads(line)["cmd"]
            if cmd == "rss":
                _emit({"rss": live_rss()})
            elif cmd == "stats":
                st = node.stats()
                bound = transport.connections
                cpu = time.process_time()
                _emit(
                    {"connections": st.connections, "handled": st.handled, "held": bound.held, "cpu_s": cpu}
                )
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
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": name}).encode() + b"\n")
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
        "tools.scale_probe",
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


async def request(conn: Connection, identity: Identity, server_id: str, payload: object) -> object:
    """One signed RUN request on ``conn``; its answer's payload."""
    now_us = time.time_ns() // 1000
    msg = build_message(
        sender=identity.agent_id,
        to=server_id,
        msg_type=MessageType.RUN,
        session=Session(),
        timestamp_us=now_us,
        payload_json=json.dumps(payload),
        deadline_us=now_us + 10_000_000,  # a request: the caller waits for its answer
    )
    await conn.send(encode_frame(FrameType.MESSAGE, sign_message(identity, msg)))
    reply = open_message((await conn.recv()).frame.body)
    if int(reply.msg_type) != MessageType.REPLY or reply.reply_to != msg.msg_id:
        raise IacError(f"unexpected answer: {MessageType(reply.msg_type).name}")
    return json.loads(reply.payload_json)


async def open_peer(
    url: str, server_id: str, config: TransportConfig, *, attempts: int = 6, backoff: float = 0.2
) -> tuple[Connection, float, int]:
    """A new identity connects and gets one request answered: ``(connection, seconds from
    the first attempt, attempts made)``. A failed attempt is retried after a jittered,
    doubling pause (``backoff`` to 3.2 s); the last failure is raised."""
    identity = Identity.generate()
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


# --- probes ------------------------------------------------------------------------------------


async def _client_proc(url: str, server_id: str, n: int, at_once: int | None) -> dict[str, Any]:
    """Open ``n`` peers in this process, report, hold them until stdin closes."""
    conns, times, errors, retries = await open_peers(url, server_id, n, client_config(), at_once=at_once)
    _emit(
        {
            "ok": len(conns),
            "errors": [repr(e) for e in errors[:5]],
            "failed": len(errors),
            "retries": retries,
            "times": times,
        }
    )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await reader.read()
    await close_all(conns)
    return {}


async def _spread(url: str, server_id: str, n: int, procs: int, at_once: int | None) -> tuple[list[Any], Any]:
    """``n`` peers over ``procs`` client processes; their reports, and the processes (held open)."""
    share = [n // procs + (i < n % procs) for i in range(procs)]
    children = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tools.scale_probe",
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


async def _release(children: Sequence[asyncio.subprocess.Process]) -> None:
    for c in children:
        if c.stdin is not None:
            c.stdin.close()
    await asyncio.gather(*(c.wait() for c in children))


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
    added = peers - base
    return {
        "transport": transport,
        "peers": peers,
        "rss_base_mib": rss0 / 2**20,
        "rss_mib": rss1 / 2**20,
        "per_peer_kib": (rss1 - rss0) / added / 1024,
        "failed": failed,
        "retries": retries,
    }


async def probe_burst(transport: str, dials: int, procs: int) -> dict[str, Any]:
    async with server([f"{transport}://127.0.0.1:0"]) as srv:
        url = srv.address(transport)
        t0 = time.monotonic()
        reports, children = await _spread(url, srv.agent_id, dials, procs, None)
        wall = time.monotonic() - t0
        await _release(children)
    times = sorted(t for r in reports for t in r["times"])
    return {
        "transport": transport,
        "dials": dials,
        "ok": sum(r["ok"] for r in reports),
        "failed": sum(r["failed"] for r in reports),
        "retries": sum(r["retries"] for r in reports),
        "errors": [e for r in reports for e in r["errors"]][:5],
        "wall_s": wall,
        "p50_s": times[len(times) // 2] if times else None,
        "p99_s": times[int(len(times) * 0.99)] if times else None,
    }


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
    ap = argparse.ArgumentParser(prog="python -m tools.scale_probe", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
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
    if args.cmd == "memory":
        out: Any = asyncio.run(probe_memory(args.transport, args.peers, args.base, args.procs))
    elif args.cmd == "burst":
        out = asyncio.run(probe_burst(args.transport, args.dials, args.procs))
    else:
        out = probe_bytes(args.corpus)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
