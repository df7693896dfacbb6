#!/usr/bin/env python3
"""Requests under loss and delay, and the subprocess endpoints the suite drives.

    sudo .venv/bin/python benchmarks/loss.py --quick --json out.json   # the loss scenario alone

**The loss scenario** (``run_loss``): 64 concurrent independent requests, again and again,
between two network namespaces joined by :class:`netem.Link` (10 ms each way = 20 ms RTT)
at 0 %, 1 % and 3 % loss per packet and per direction, for IAC over QUIC, IAC over
TLS/TCP and HTTP/1.1 (aiohttp keep-alive, JSON + SHA-256(payload+password), 64
connections; only when aiohttp is installed). The servers run in namespace b, the clients
in namespace a, each in its own process (``ip netns exec``). Per loss level the contenders
take turns (A B C C B A …); each turn is ``batches`` x 64 requests; a turn's p50/p99 come
from its requests, and the figures are the median [min .. max] over turns. At 0 % loss
the forwarder's counters also give the bytes on the wire per request: whole IP packets
both ways (IP, UDP/TCP, QUIC/TLS, HTTP headers and ACKs included).

**Endpoints** (``serve`` / ``client``), also used by the suite's ``requests`` and ``cpu``
scenarios on loopback: one server process and one client process per contender, driven
by JSON lines on stdin/stdout.

* ``loss.py serve --contender C --host H [--dir D]`` prints ``{"ready": true, "target":
  {...}}``; then ``{"cmd": "cpu"}`` answers ``{"cpu_s": ..., "handled": n}`` (its own
  ``time.process_time()``); end of input stops it.
* ``loss.py client --contender C --target JSON`` prints ``{"ready": true}``; then
  ``{"cmd": "run", "depth": D, "count": N}`` runs N requests with D in flight and
  answers ``{"lat_us": [...], "elapsed_s", "cpu_s", "errors", "frame_bytes"}``
  (``frame_bytes``: IAC frames both ways, from ``Node.stats()``; null for HTTP).

Contenders: ``iac-quic``, ``iac-tls``, ``iac-unix`` (``iac.Node.request``: sign, compress,
verify, replay check both ways; a small JSON payload), ``http`` (aiohttp POST of a JSON
envelope whose ``hash`` is SHA-256(payload + password), as Agent Zero does; the reply is
hashed the same way), ``http-ed25519`` (the same with the envelope signed by Ed25519
and verified on both sides: equal security to IAC), its transport-matched variants
``http-ed25519-tls`` (HTTPS, TLS 1.3) and ``http-ed25519-unix`` (a UNIX socket), and
``grpc`` (``benchmarks/baselines.py``'s grpcio aio unary call over an insecure HTTP/2
channel, no authentication). ``IAC_QUIC_BACKEND`` in the environment is passed through
to IAC (the hook for an accelerated QUIC backend).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from baselines import dumps_compact  # noqa: E402
from stats import median, percentile  # noqa: E402

PAYLOAD = {"task": "summarize", "args": {"doc": "q3-report.pdf", "max_words": 120}, "priority": 2}
REPLY = {"ok": True, "words": 118}
PASSWORD = "correct horse battery staple"
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
        import baselines

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
        import baselines

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


# --- driving endpoints from another process -----------------------------------------------------


class EndpointError(RuntimeError):
    pass


class Endpoint:
    """A ``serve`` or ``client`` subprocess and its JSON-lines conversation."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )
        self.first = self.read(timeout)
        if not self.first.get("ready"):
            raise EndpointError(f"endpoint did not start: {self.first}")

    def read(self, timeout: float) -> dict[str, Any]:
        out = self.proc.stdout
        assert out is not None
        ready, _, _ = select.select([out], [], [], timeout)
        if not ready:
            raise EndpointError(f"no answer within {timeout:.0f} s from {self.proc.args}")
        line = out.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise EndpointError(f"endpoint exited ({self.proc.poll()}): {err.strip()[-800:]}")
        obj: dict[str, Any] = json.loads(line)
        return obj

    def ask(self, cmd: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        inp = self.proc.stdin
        assert inp is not None
        inp.write(json.dumps(cmd) + "\n")
        inp.flush()
        return self.read(timeout)

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
        for stream in (self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()


def env_for(backend: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = str(HERE.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if backend:
        env["IAC_QUIC_BACKEND"] = backend
    return env


def endpoint_argv(role: str, contender: str, extra: list[str]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), role, "--contender", contender, *extra]


@dataclass
class Pair:
    """A server and a client endpoint of one contender."""

    contender: str
    server: Endpoint
    client: Endpoint

    def run(self, depth: int, count: int, timeout: float = 300.0) -> dict[str, Any]:
        s0 = self.server.ask({"cmd": "cpu"})
        res = self.client.ask({"cmd": "run", "depth": depth, "count": count}, timeout)
        s1 = self.server.ask({"cmd": "cpu"})
        res["server_cpu_s"] = s1["cpu_s"] - s0["cpu_s"]
        res["server_handled"] = s1["handled"] - s0["handled"]
        return res

    def close(self) -> None:
        self.client.close()
        self.server.close()


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


# --- the loss scenario --------------------------------------------------------------------------


@dataclass(frozen=True)
class LossPlan:
    losses: tuple[float, ...] = (0.0, 0.01, 0.03)
    one_way_delay: float = 0.010
    rounds: int = 5
    batches: int = 4  # 64-request batches per turn
    concurrency: int = 64


QUICK_PLAN = LossPlan(rounds=3, batches=2)
FULL_PLAN = LossPlan(rounds=7, batches=6)


def loss_contenders() -> list[str]:
    out = ["iac-quic", "iac-tls"]
    if have_aiohttp():
        out.append("http")
    return out


def run_loss(
    plan: LossPlan, progress: Callable[[str], None] = lambda s: None, seed: int = 7
) -> dict[str, Any]:
    """The loss scenario. Returns ``{"status": "ok"|"skipped", "reason", "levels": [...]}``."""
    import netem

    from iac.testing.relay import Impairment

    reason = netem.unavailable()
    if reason:
        return {"status": "skipped", "reason": reason}
    contenders = loss_contenders()
    notes = [] if have_aiohttp() else ["HTTP left out: aiohttp is not installed (pip install aiohttp)"]
    pairs: dict[str, Pair] = {}
    levels: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="iacb-loss-") as tmp:
        try:
            link = netem.Link(Impairment(delay=plan.one_way_delay), seed=seed)
            link.start()
        except netem.LinkError as exc:
            return {"status": "skipped", "reason": f"link emulator unavailable: {exc}"}
        try:
            for c in contenders:
                progress(f"starting {NAMES[c]} in the namespaces")
                pairs[c] = start_pair(
                    c,
                    netem.ADDR_B,
                    Path(tmp),
                    wrap_server=lambda a: link.command("b", a),
                    wrap_client=lambda a: link.command("a", a),
                )
            n = plan.concurrency * plan.batches
            for li, loss in enumerate(plan.losses):
                link.set_impairment(Impairment(delay=plan.one_way_delay, loss=loss))
                for c in contenders:  # warm-up at this loss level
                    pairs[c].run(plan.concurrency, plan.concurrency)
                p50: dict[str, list[float]] = {c: [] for c in contenders}
                p99: dict[str, list[float]] = {c: [] for c in contenders}
                wire: dict[str, list[float]] = {c: [] for c in contenders}
                samples: dict[str, list[float]] = {c: [] for c in contenders}
                errors = dict.fromkeys(contenders, 0)
                for r in range(plan.rounds):
                    progress(f"loss {loss:.0%}: round {r + 1}/{plan.rounds} ({li + 1}/{len(plan.losses)})")
                    for c in contenders if r % 2 == 0 else contenders[::-1]:
                        before = link.stats()
                        res = pairs[c].run(plan.concurrency, n)
                        after = link.stats()
                        lat = res["lat_us"]
                        errors[c] += res["errors"]
                        if lat:
                            p50[c].append(median(lat) / 1e3)
                            p99[c].append(percentile(lat, 99) / 1e3)
                            samples[c].extend(x / 1e3 for x in lat)
                        moved = sum(after[d]["bytes"] - before[d]["bytes"] for d in after)
                        wire[c].append(moved / n)
                levels.append(
                    {
                        "loss": loss,
                        "p50_ms": p50,
                        "p99_ms": p99,
                        "wire_bytes_per_request": wire,
                        "errors": errors,
                        "samples_ms": samples,
                        "link": link.stats(),
                    }
                )
        finally:
            for pair in pairs.values():
                pair.close()
            link.close()
    return {
        "status": "ok",
        "reason": None,
        "contenders": contenders,
        "names": {c: NAMES[c] for c in contenders},
        "plan": {
            "losses": list(plan.losses),
            "one_way_delay_s": plan.one_way_delay,
            "rounds": plan.rounds,
            "requests_per_turn": plan.concurrency * plan.batches,
            "concurrency": plan.concurrency,
        },
        "levels": levels,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("serve", help="(internal) a server endpoint")
    s.add_argument("--contender", required=True, choices=sorted(NAMES))
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    c = sub.add_parser("client", help="(internal) a client endpoint")
    c.add_argument("--contender", required=True, choices=sorted(NAMES))
    c.add_argument("--target", required=True, help="the server's target JSON")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "serve":
        return asyncio.run(serve(args.contender, args.host, args.dir))
    if args.cmd == "client":
        return asyncio.run(client(args.contender, json.loads(args.target)))
    res = run_loss(QUICK_PLAN if args.quick else FULL_PLAN, lambda m: print(m, file=sys.stderr))
    if res["status"] != "ok":
        print(f"loss scenario skipped: {res['reason']}")
        return 0
    for level in res["levels"]:
        for c in res["contenders"]:
            p50, p99 = level["p50_ms"][c], level["p99_ms"][c]
            if p50:
                print(
                    f"loss {level['loss']:4.0%}  {NAMES[c]:<20} p50 {median(p50):7.1f} ms  "
                    f"p99 {median(p99):7.1f} ms  errors {level['errors'][c]}"
                )
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
