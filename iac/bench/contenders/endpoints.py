"""The subprocess endpoints of the requests, cpu and loss scenarios: a server process and a client
process per contender of ``CONTENDERS``, driven by JSON lines (``python -m
iac.bench.contenders.endpoints serve|client``: :func:`serve`, :func:`client`). The IAC contenders
are ``Node.request`` (``IAC_QUIC_BACKEND`` is passed through); HTTP and gRPC are those of
:mod:`~iac.bench.contenders.baselines`, NATS and ZeroMQ those of :mod:`~iac.bench.contenders.brokers`."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines, brokers
from iac.bench.contenders.common import CLIENT_SEED, ONEWAY, PAYLOAD, REPLY, SERVER_SEED
from iac.bench.harness.paths import child_env, module_argv
from iac.bench.harness.process import Endpoint, Pair, commands, say

_SIGNED, _TLS = "Ed25519 both ways", "TLS 1.3"
#: contender -> (label, encryption, per-message authentication)
CONTENDERS = {
    "iac-quic": ("IAC-QUIC", "QUIC (TLS 1.3)", f"{_SIGNED}, replay check"),
    "iac-tls": ("IAC-TLS/TCP", _TLS, f"{_SIGNED}, replay check"),
    "iac-unix": ("IAC-UNIX", "none (local socket)", f"{_SIGNED}, replay check"),
    "http": ("HTTP+JSON+SHA-256", "none", "SHA-256 of payload + shared password"),
    "http-ed25519": ("HTTP+Ed25519 JSON", "none", _SIGNED),
    "http-ed25519-tls": ("HTTPS+Ed25519 JSON", _TLS, _SIGNED),
    "http-ed25519-unix": ("HTTP+Ed25519 JSON/UNIX", "none (local socket)", _SIGNED),
    "grpc": ("gRPC unary (no auth)", "none", "none"),
    **{
        name: (label, "none", _SIGNED if signed else "none")
        for name, (_, signed, label) in brokers.KINDS.items()
    },
}
NAMES = {name: label for name, (label, _, _) in CONTENDERS.items()}


def secures(contender: str) -> str:
    """``encryption: …; per-message authentication: …`` of ``contender``."""
    _, enc, auth = CONTENDERS[contender]
    return f"encryption: {enc}; per-message authentication: {auth}"


#: The contenders of :mod:`iac.bench.contenders.baselines` (HTTP, gRPC), by their names there.
BASELINE_OF = {"http": "http-sha256", **{n: n for n in baselines.BASELINES if n != "http-sha256"}}


def have_grpc() -> bool:
    return importlib.util.find_spec("grpc") is not None


def have_aiohttp() -> bool:
    return importlib.util.find_spec("aiohttp") is not None


# --- servers ------------------------------------------------------------------------------------


class IacServer:
    handled = events = 0

    def __init__(self, transport: str) -> None:
        self.transport = transport

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        from iac.node.config import NodeConfig
        from iac.node.node import Context, Node
        from iac.wire._pb.iac_pb2 import MessageType

        url = f"unix://{directory}/b.sock" if self.transport == "unix" else f"{self.transport}://{host}:0"
        cfg = NodeConfig(sync_in_thread=False, max_in_flight=64, max_handlers=64)
        self.node = Node(listen=[url], config=cfg)
        await self.node.start()

        @self.node.on(MessageType.RUN)
        def handler(ctx: Context) -> object:
            if isinstance(ctx.payload, dict) and "oneway" in ctx.payload:  # see IacClient.event
                if ctx.payload["oneway"] == "seen":
                    return {"seen": self.events}
                self.events += 1
                return None
            self.handled += 1
            return REPLY

        return {"agent_id": self.node.agent_id, "url": self.node.addresses[0]}

    async def close(self) -> None:
        await self.node.close()


class BaselineServer:
    """A server of :mod:`iac.bench.contenders.baselines` (HTTP or gRPC)."""

    handled = 0

    def __init__(self, contender: str) -> None:
        self.name = BASELINE_OF[contender]

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        self.server = await baselines.start_baseline(self.name, directory, host)
        self.close = self.server.close
        return dict(self.server.info)


def make_server(contender: str) -> IacServer | BaselineServer | brokers.BrokerServer:
    if contender.startswith("iac-"):
        return IacServer(contender[4:])
    if contender in BASELINE_OF:
        return BaselineServer(contender)
    if contender in brokers.KINDS:
        return brokers.make_server(contender, SERVER_SEED, CLIENT_SEED, json.dumps(REPLY))
    raise SystemExit(f"unknown contender {contender}")


async def serve(contender: str, host: str, directory: Path) -> int:
    server = make_server(contender)
    target = await server.start(host, directory)
    say({"ready": True, "target": target})
    try:
        async for cmd in commands():
            if cmd.get("cmd") == "cpu":
                say({"cpu_s": time.process_time(), "handled": server.handled})
    finally:
        await server.close()
    return 0


# --- clients ------------------------------------------------------------------------------------


class IacClient:
    def __init__(self, target: dict[str, Any]) -> None:
        self.target = target

    async def start(self) -> None:
        from iac.node.config import NodeConfig
        from iac.node.node import Node
        from iac.wire.enums import MessageType

        self.run_type = MessageType.RUN
        self.node = Node(config=NodeConfig(sync_in_thread=False, max_in_flight=64, max_handlers=64))
        await self.node.start()
        self.peer = self.target["agent_id"]
        self.node.add_peer(self.peer, self.target["url"])

    async def request(self, i: int) -> None:
        await self.node.request(self.peer, self.run_type, PAYLOAD, timeout=60)

    async def event(self, i: int) -> None:
        """One one-way message (``Node.send``, no reply)."""
        await self.node.send(self.peer, self.run_type, ONEWAY)

    async def seen(self) -> int:
        """How many one-way messages the server has handled (a request)."""
        r = await self.node.request(self.peer, self.run_type, {"oneway": "seen"}, timeout=60)
        return int(r.payload["seen"])

    def frame_bytes(self) -> int | None:
        st = self.node.stats()
        return st.bytes_sent + st.bytes_received

    async def close(self) -> None:
        await self.node.close()


def make_client(
    contender: str, target: dict[str, Any]
) -> IacClient | baselines.Client | brokers.BrokerClient:
    if contender.startswith("iac-"):
        return IacClient(target)
    if contender in BASELINE_OF:  # sends PAYLOAD
        return baselines.baseline_client([PAYLOAD], target)
    if contender in brokers.KINDS:
        return brokers.make_client(contender, CLIENT_SEED, SERVER_SEED, json.dumps(PAYLOAD), target)
    raise SystemExit(f"unknown contender {contender}")


async def run_depth(
    one: Callable[[int], Awaitable[None]], depth: int, count: int, start: int = 0
) -> tuple[list[float], float, int]:
    """``count`` calls of ``one`` with ``depth`` outstanding; latencies (µs), elapsed (s), errors."""
    lat: list[float] = []
    errors = 0
    ids = iter(range(start, start + count))
    clock = time.perf_counter

    async def worker() -> None:
        nonlocal errors
        for i in ids:  # shared iterator: every id is used once
            t = clock()
            try:
                await one(i)
            except Exception:
                errors += 1
                continue
            lat.append((clock() - t) * 1e6)

    t0 = clock()
    await asyncio.gather(*(worker() for _ in range(max(1, min(depth, count)))))
    return lat, clock() - t0, errors


async def client(contender: str, target: dict[str, Any]) -> int:
    cl = make_client(contender, target)
    await cl.start()
    say({"ready": True})
    next_id, sent = 1, 0  # the next request's id, one-way messages so far
    try:
        async for cmd in commands():
            count = int(cmd.get("count", 0))
            if cmd.get("cmd") == "oneway":
                c0 = time.process_time()
                elapsed = await oneway(cl, count, next_id, sent + count)
                say({"elapsed_s": elapsed, "cpu_s": time.process_time() - c0, "count": count})
                sent += count
            elif cmd.get("cmd") == "run":
                b0 = cl.frame_bytes()
                c0 = time.process_time()
                lat, elapsed, errors = await run_depth(cl.request, int(cmd["depth"]), count, next_id)
                cpu = time.process_time() - c0
                b1 = cl.frame_bytes()
                lat_us = [round(x, 1) for x in lat]
                frames = None if b0 is None or b1 is None else b1 - b0
                say(
                    {
                        "lat_us": lat_us,
                        "elapsed_s": elapsed,
                        "cpu_s": cpu,
                        "errors": errors,
                        "frame_bytes": frames,
                    }
                )
            else:
                say({"error": f"unknown command {cmd!r}"})
            next_id += count
    finally:
        await cl.close()
    return 0


async def oneway(cl: Any, count: int, start: int, total: int, timeout: float = 120.0) -> float:
    """Send ``count`` one-way messages, then ask the server how many it has handled until it has
    them all (``total`` since the start); the seconds from the first send to that answer."""
    t0 = time.perf_counter()
    for i in range(start, start + count):
        await cl.event(i)
    async with asyncio.timeout(timeout):
        while await cl.seen() < total:
            pass
    return time.perf_counter() - t0


def endpoint_argv(role: str, contender: str, extra: list[str]) -> list[str]:
    return module_argv("iac.bench.contenders.endpoints", role, "--contender", contender, *extra)


def start_pair(
    contender: str,
    host: str,
    directory: Path,
    wrap_server: Callable[[list[str]], list[str]] = lambda a: a,
    wrap_client: Callable[[list[str]], list[str]] = lambda a: a,
    backend: str | None = None,
) -> Pair:
    env = child_env(backend)
    server = Endpoint(
        wrap_server(endpoint_argv("serve", contender, ["--host", host, "--dir", str(directory)])), env
    )
    try:
        target = json.dumps(server.first["target"])
        cl = Endpoint(wrap_client(endpoint_argv("client", contender, ["--target", target])), env)
    except BaseException:
        server.close()
        raise
    return Pair(contender, server, cl)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="(internal) a server or client endpoint of the suite")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s, c = sub.add_parser("serve"), sub.add_parser("client")
    for p in (s, c):
        p.add_argument("--contender", required=True, choices=sorted(NAMES))
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    c.add_argument("--target", required=True, help="the server's target JSON")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return asyncio.run(serve(args.contender, args.host, args.dir))
    return asyncio.run(client(args.contender, json.loads(args.target)))


if __name__ == "__main__":
    sys.exit(main())
