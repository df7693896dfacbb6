"""The subprocess endpoints of the requests, cpu and loss scenarios: one server process and one
client process per contender, driven by JSON lines on stdin/stdout.

* ``python -m iac.bench.contenders.endpoints serve --contender C --host H [--dir D]`` prints
  ``{"ready": true, "target": {...}}``; then ``{"cmd": "cpu"}`` answers ``{"cpu_s": ...,
  "handled": n}`` (its own ``time.process_time()``); end of input stops it.
* ``python -m iac.bench.contenders.endpoints client --contender C --target JSON`` prints
  ``{"ready": true}``; then ``{"cmd": "run", "depth": D, "count": N}`` runs N requests with D in
  flight and answers ``{"lat_us": [...], "elapsed_s", "cpu_s", "errors", "frame_bytes"}``
  (``frame_bytes``: IAC frames both ways, from ``Node.stats()``; null for the others).

Contenders: ``iac-quic``, ``iac-tls``, ``iac-unix`` (``iac.Node.request``: sign, compress,
verify, replay check both ways; a small JSON payload), ``http`` (aiohttp POST of a JSON
envelope whose ``hash`` is SHA-256(payload + password), as Agent Zero does; the reply is
hashed the same way), ``http-ed25519`` (the same with the envelope signed by Ed25519
and verified on both sides: equal security to IAC), its transport-matched variants
``http-ed25519-tls`` (HTTPS, TLS 1.3) and ``http-ed25519-unix`` (a UNIX socket), ``grpc``
(:mod:`iac.bench.contenders.baselines`' grpcio aio unary call over an insecure HTTP/2 channel, no
authentication), and the messaging systems of :mod:`iac.bench.contenders.brokers` (NATS, ZeroMQ;
bare and Ed25519-signed). ``IAC_QUIC_BACKEND`` in the environment is passed through to IAC (the
hook for an accelerated QUIC backend).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from iac.bench.contenders.baselines import dumps_compact
from iac.bench.harness.paths import child_env, module_argv
from iac.bench.harness.process import Endpoint, Pair

PAYLOAD = {"task": "summarize", "args": {"doc": "q3-report.pdf", "max_words": 120}, "priority": 2}
REPLY = {"ok": True, "words": 118}
PASSWORD = "correct horse battery staple"  # noqa: S105 (the baseline's shared secret, public by design)
CLIENT_SEED = bytes(range(32))
SERVER_SEED = bytes(range(32, 64))
PATH = "/iac/v1/messages"

NAMES = {
    "iac-quic": "IAC-QUIC",
    "iac-tls": "IAC-TLS/TCP",
    "iac-unix": "IAC-UNIX",
    "http": "HTTP+JSON+SHA-256",
    "http-ed25519": "HTTP+Ed25519 JSON",
    "http-ed25519-tls": "HTTPS+Ed25519 JSON",
    "http-ed25519-unix": "HTTP+Ed25519 JSON/UNIX",
    "grpc": "gRPC unary (no auth)",
}
#: The HTTP contenders: name -> (signed, transport).
HTTP_KINDS = {
    "http": (False, "tcp"),
    "http-ed25519": (True, "tcp"),
    "http-ed25519-tls": (True, "tls"),
    "http-ed25519-unix": (True, "unix"),
}


def have_grpc() -> bool:
    return importlib.util.find_spec("grpc") is not None


def have_aiohttp() -> bool:
    return importlib.util.find_spec("aiohttp") is not None


# --- HTTP envelopes -----------------------------------------------------------------------------


def _sha(payload: str) -> str:
    return hashlib.sha256((payload + PASSWORD).encode()).hexdigest()


def _http_body(payload: str, msg_id: int, signer: Any | None) -> bytes:
    env = {
        "from": "agent-a",
        "to": "agent-b",
        "type": "RUN",
        "payload": payload,
        "timestamp": time.time_ns() // 1000,
        "msg_id": msg_id,
        "session_id": 1,
    }
    if signer is None:
        env["hash"] = _sha(payload)
        return dumps_compact(env).encode()
    raw = dumps_compact(env)
    sig = signer.sign(raw.encode()).signature.hex()
    return dumps_compact({"envelope": raw, "sig": sig}).encode()


def _http_open(body: bytes, verifier: Any | None) -> dict[str, Any]:
    obj = json.loads(body)
    if verifier is None:
        if obj.get("hash") != _sha(obj["payload"]):
            raise ValueError("bad hash")
        env: dict[str, Any] = obj
    else:
        verifier.verify(obj["envelope"].encode(), bytes.fromhex(obj["sig"]))
        env = json.loads(obj["envelope"])
    json.loads(env["payload"])
    return env


def _keys(signed: bool, me: bytes, peer: bytes) -> tuple[Any, Any]:
    if not signed:
        return None, None
    import nacl.signing

    return nacl.signing.SigningKey(me), nacl.signing.SigningKey(peer).verify_key


# --- servers ------------------------------------------------------------------------------------


class Server:
    handled = 0

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        raise NotImplementedError

    async def close(self) -> None:
        pass


class IacServer(Server):
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
            self.handled += 1
            return REPLY

        return {"agent_id": self.node.agent_id, "url": self.node.addresses[0]}

    async def close(self) -> None:
        await self.node.close()


def _tls_server_context() -> Any:
    import ssl

    from iac.transport.certs import generate_self_signed

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    generate_self_signed("bench.localhost").load_into(ctx)
    return ctx


def _tls_client_context() -> Any:
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a self-signed benchmark certificate: encryption, not trust, is measured
    return ctx


class HttpServer(Server):
    """aiohttp server; ``transport``: ``tcp`` (plain HTTP), ``tls`` (HTTPS, TLS 1.3) or ``unix``."""

    def __init__(self, signed: bool, transport: str = "tcp") -> None:
        self.signer, self.verifier = _keys(signed, SERVER_SEED, CLIENT_SEED)
        self.transport = transport

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            env = _http_open(await request.read(), self.verifier)
            self.handled += 1
            body = _http_body(json.dumps(REPLY), int(env["msg_id"]), self.signer)
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_post(PATH, handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        if self.transport == "unix":
            path = str(directory / f"http-{os.getpid()}.sock")
            await web.UnixSite(self.runner, path).start()
            return {"url": f"http://localhost{PATH}", "unix": path}
        tls = self.transport == "tls"
        site = web.TCPSite(self.runner, host, 0, ssl_context=_tls_server_context() if tls else None)
        await site.start()
        server = site._server
        port = server.sockets[0].getsockname()[1] if server is not None else 0  # type: ignore[attr-defined]
        return {"url": f"{'https' if tls else 'http'}://{host}:{port}{PATH}"}

    async def close(self) -> None:
        await self.runner.cleanup()


class GrpcServer(Server):
    """``benchmarks/baselines.py``'s gRPC server (aio unary, bytes in/out, insecure channel)."""

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        from iac.bench.contenders import baselines

        self.server = await baselines.start_grpc("grpc", directory)
        return dict(self.server.info)

    async def close(self) -> None:
        await self.server.close()


def make_server(contender: str) -> Server:
    if contender.startswith("iac-"):
        return IacServer(contender[4:])
    if contender in HTTP_KINDS:
        return HttpServer(*HTTP_KINDS[contender])
    if contender == "grpc":
        return GrpcServer()
    raise SystemExit(f"unknown contender {contender}")


async def _lines() -> Any:
    """Lines from stdin without blocking the event loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


def _say(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def serve(contender: str, host: str, directory: Path) -> int:
    server = make_server(contender)
    target = await server.start(host, directory)
    _say({"ready": True, "target": target})
    reader = await _lines()
    try:
        for _ in range(10_000_000):
            line = await reader.readline()
            if not line:
                break
            cmd = json.loads(line)
            if cmd.get("cmd") == "cpu":
                _say({"cpu_s": time.process_time(), "handled": server.handled})
    finally:
        await server.close()
    return 0


# --- clients ------------------------------------------------------------------------------------


class Client:
    async def start(self, target: dict[str, Any], depth: int) -> None:
        raise NotImplementedError

    async def one(self, i: int) -> None:
        raise NotImplementedError

    def frame_bytes(self) -> int | None:
        return None

    async def close(self) -> None:
        pass


class IacClient(Client):
    async def start(self, target: dict[str, Any], depth: int) -> None:
        from iac.node.config import NodeConfig
        from iac.node.node import Node
        from iac.wire._pb.iac_pb2 import MessageType

        self.run_type = MessageType.RUN
        cfg = NodeConfig(sync_in_thread=False, max_in_flight=max(64, depth), max_handlers=64)
        self.node = Node(config=cfg)
        await self.node.start()
        self.peer = target["agent_id"]
        self.node.add_peer(self.peer, target["url"])

    async def one(self, i: int) -> None:
        await self.node.request(self.peer, self.run_type, PAYLOAD, timeout=60)

    def frame_bytes(self) -> int | None:
        st = self.node.stats()
        return st.bytes_sent + st.bytes_received

    async def close(self) -> None:
        await self.node.close()


class HttpClient(Client):
    def __init__(self, signed: bool) -> None:
        self.signer, self.verifier = _keys(signed, CLIENT_SEED, SERVER_SEED)
        self.payload = json.dumps(PAYLOAD)

    async def start(self, target: dict[str, Any], depth: int) -> None:
        import aiohttp

        self.url = target["url"]
        limit = max(64, depth)
        connector: Any
        if "unix" in target:
            connector = aiohttp.UnixConnector(path=target["unix"], limit=limit)
        elif self.url.startswith("https:"):
            connector = aiohttp.TCPConnector(limit=limit, ssl=_tls_client_context())
        else:
            connector = aiohttp.TCPConnector(limit=limit)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))

    async def one(self, i: int) -> None:
        body = _http_body(self.payload, i, self.signer)
        async with self.session.post(
            self.url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            env = _http_open(await resp.read(), self.verifier)
            if int(env["msg_id"]) != i:
                raise RuntimeError("reply to another request")

    async def close(self) -> None:
        await self.session.close()


class GrpcClient(Client):
    """``benchmarks/baselines.py``'s gRPC client, sending :data:`PAYLOAD` as JSON bytes."""

    async def start(self, target: dict[str, Any], depth: int) -> None:
        from iac.bench.contenders import baselines

        self.client = baselines.GrpcClient([PAYLOAD], target)
        await self.client.start()

    async def one(self, i: int) -> None:
        await self.client.request(i)

    async def close(self) -> None:
        await self.client.close()


def make_client(contender: str) -> Client:
    if contender.startswith("iac-"):
        return IacClient()
    if contender in HTTP_KINDS:
        return HttpClient(HTTP_KINDS[contender][0])
    if contender == "grpc":
        return GrpcClient()
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
    cl = make_client(contender)
    await cl.start(target, 64)
    _say({"ready": True})
    reader = await _lines()
    next_id = 1
    try:
        for _ in range(10_000_000):
            line = await reader.readline()
            if not line:
                break
            cmd = json.loads(line)
            if cmd.get("cmd") != "run":
                _say({"error": f"unknown command {cmd!r}"})
                continue
            depth, count = int(cmd["depth"]), int(cmd["count"])
            b0 = cl.frame_bytes()
            c0 = time.process_time()
            lat, elapsed, errors = await run_depth(cl.one, depth, count, next_id)
            cpu = time.process_time() - c0
            b1 = cl.frame_bytes()
            next_id += count
            _say(
                {
                    "lat_us": [round(x, 1) for x in lat],
                    "elapsed_s": elapsed,
                    "cpu_s": cpu,
                    "errors": errors,
                    "frame_bytes": None if b0 is None or b1 is None else b1 - b0,
                }
            )
    finally:
        await cl.close()
    return 0


env_for = child_env


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
    env = env_for(backend)
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
    s = sub.add_parser("serve", help="a server endpoint")
    s.add_argument("--contender", required=True, choices=sorted(NAMES))
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    c = sub.add_parser("client", help="a client endpoint")
    c.add_argument("--contender", required=True, choices=sorted(NAMES))
    c.add_argument("--target", required=True, help="the server's target JSON")
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return asyncio.run(serve(args.contender, args.host, args.dir))
    return asyncio.run(client(args.contender, json.loads(args.target)))


if __name__ == "__main__":
    sys.exit(main())
