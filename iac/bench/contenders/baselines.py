"""The HTTP and gRPC baselines (``BASELINES``): one server per process (``serve``), clients in the
benchmark's process. Every contender sends a payload and waits for the reply its server computes
(:func:`answer`). ``http-sha256`` hashes the payload with a shared password (as Agent Zero does);
``http-ed25519`` (and its ``-tls`` and ``-unix`` variants) signs a JSON envelope both ways and
checks ``to``, freshness and replay; ``grpc`` is a grpcio aio unary call with no authentication.
benchmarks/README.md ("Requests: the contenders") describes each."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import itertools
import json
import os
import secrets
import ssl
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iac.bench.harness.process import say

HTTP_PATH = "/iac/v1/messages"
HTTP_PASSWORD = "correct horse battery staple"  # noqa: S105 (the baseline's shared secret, public by design)
SIGN_DOMAIN = b"http-bench-env-v1\x00"
MAX_SKEW_US = 120_000_000
REPLAY_KEEP = 100_000
GRPC_METHOD = "/iac.bench.Bench/Call"

BASELINES = ("http-sha256", "http-ed25519", "http-ed25519-tls", "http-ed25519-unix", "grpc")

#: Compact JSON (no whitespace, UTF-8 left as it is), as every HTTP contender writes its bodies.
dumps_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_CANON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True).encode


def answer(payload: Any) -> dict[str, Any]:
    """The reply every contender's server computes from the parsed payload."""
    return {"ok": True, "keys": len(payload) if isinstance(payload, dict) else 0}


def canonical(obj: dict[str, Any]) -> bytes:
    """The bytes an Ed25519 envelope signs: domain tag + canonical JSON."""
    return SIGN_DOMAIN + _CANON(obj).encode()


def now_us() -> int:
    return time.time_ns() // 1000


# --- servers -----------------------------------------------------------------------------------


@dataclass
class Server:
    """A running server: ``info`` is sent to the parent as one JSON line."""

    info: dict[str, Any]
    close: Callable[[], Awaitable[None]]


@dataclass
class _HttpApp:
    signed: bool
    signing_key: Any = None
    seen: OrderedDict[tuple[str, int, int], None] = field(default_factory=OrderedDict)

    async def handle(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        try:
            env = json.loads(body)
            reply = self._signed(env) if self.signed else self._hashed(env)
        except (ValueError, KeyError, TypeError) as exc:
            return web.Response(status=400, text=str(exc))
        return web.Response(body=reply, content_type="application/json")

    def _hashed(self, env: dict[str, Any]) -> bytes:
        payload = env["payload"]
        digest = hashlib.sha256((dumps_compact(payload) + HTTP_PASSWORD).encode()).hexdigest()
        if not hmac.compare_digest(digest, env["hash"]):
            raise ValueError("bad hash")
        return dumps_compact(answer(payload)).encode()

    def _signed(self, env: dict[str, Any]) -> bytes:
        import nacl.exceptions
        import nacl.signing

        sig = bytes.fromhex(env.pop("sig"))
        sender = env["from"]
        try:
            nacl.signing.VerifyKey(bytes.fromhex(sender)).verify(canonical(env), sig)
        except nacl.exceptions.BadSignatureError:
            raise ValueError("bad signature") from None
        me = self.signing_key.verify_key.encode().hex()
        if env["to"] != me:
            raise ValueError("not addressed to this server")
        now = now_us()
        if abs(now - int(env["timestamp"])) > MAX_SKEW_US:
            raise ValueError("stale")
        key = (sender, int(env["session_id"]), int(env["msg_id"]))
        if key in self.seen:
            raise ValueError("replayed")
        self.seen[key] = None
        if len(self.seen) > REPLAY_KEEP:
            self.seen.popitem(last=False)
        out = {
            "from": me,
            "to": sender,
            "type": "REPLY",
            "in_reply_to": env["msg_id"],
            "payload": answer(env["payload"]),
            "timestamp": now,
        }
        signed = self.signing_key.sign(canonical(out)).signature
        return dumps_compact({**out, "sig": signed.hex()}).encode()


async def start_http(name: str, workdir: Path, host: str = "127.0.0.1") -> Server:
    """``http-sha256``, ``http-ed25519``, ``http-ed25519-tls`` or ``http-ed25519-unix``."""
    import nacl.signing
    from aiohttp import web

    signed = name != "http-sha256"
    app_state = _HttpApp(signed, nacl.signing.SigningKey.generate() if signed else None)
    app = web.Application()
    app.router.add_post(HTTP_PATH, app_state.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    info: dict[str, Any] = {"name": name}
    if signed:
        info["server_key"] = app_state.signing_key.verify_key.encode().hex()
    site: Any
    if name == "http-ed25519-unix":
        path = str(workdir / f"{name}.sock")
        site = web.UnixSite(runner, path)
        await site.start()
        info["unix"] = path
    else:
        ctx = _server_tls() if name == "http-ed25519-tls" else None
        site = web.TCPSite(runner, host, 0, ssl_context=ctx)
        await site.start()
        info["host"], info["port"] = host, site._server.sockets[0].getsockname()[1]
        info["tls"] = ctx is not None
    return Server(info, runner.cleanup)


def _server_tls() -> ssl.SSLContext:
    from iac.transport.certs import generate_self_signed

    cert = generate_self_signed("bench.localhost")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    cert.load_into(ctx)
    return ctx


def _client_tls() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a self-signed test certificate; verification is not the point
    return ctx


async def start_grpc(name: str, workdir: Path, host: str = "127.0.0.1") -> Server:
    import grpc

    async def call(request: bytes, context: Any) -> bytes:
        return dumps_compact(answer(json.loads(request))).encode()

    handler = grpc.method_handlers_generic_handler(
        "iac.bench.Bench", {"Call": grpc.unary_unary_rpc_method_handler(call)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port(f"{host}:0")
    await server.start()
    return Server({"name": name, "host": host, "port": port}, functools.partial(server.stop, None))


async def start_baseline(name: str, workdir: Path, host: str = "127.0.0.1") -> Server:
    if name == "grpc":
        return await start_grpc(name, workdir, host)
    if name in BASELINES:
        return await start_http(name, workdir, host)
    raise ValueError(f"unknown baseline {name!r}")


# --- clients -----------------------------------------------------------------------------------


class Client:
    """One contender's client: ``request(i)`` sends payload ``i`` and waits for the reply."""

    name = ""

    def __init__(self, payloads: list[Any]) -> None:
        self.payloads = payloads
        self.payload_json = [dumps_compact(p) for p in payloads]  # reused by the hash baseline

    async def start(self) -> None:
        return None

    async def request(self, i: int) -> None:
        raise NotImplementedError

    def frame_bytes(self) -> int | None:
        return None

    async def close(self) -> None:
        return None


class HttpClient(Client):
    """aiohttp keep-alive client of the four HTTP contenders; ``via``: where to dial instead of the
    server (a counting proxy's ``("tcp", host, port)`` or ``("unix", path)``)."""

    def __init__(
        self, payloads: list[Any], info: dict[str, Any], *, via: tuple[Any, ...] | None = None
    ) -> None:
        super().__init__(payloads)
        import nacl.signing

        self.name = info["name"]
        self.info = info
        self.addr = via or server_target(info)
        self.signed = "server_key" in info
        self.key = nacl.signing.SigningKey.generate()
        self.me = self.key.verify_key.encode().hex()
        self.server_key = info.get("server_key", "")
        self.server_verify = nacl.signing.VerifyKey(bytes.fromhex(self.server_key)) if self.signed else None
        self.session_id = secrets.randbits(63)
        self.msg_ids = itertools.count(1)
        self.session: Any = None
        # through a proxy the Host header names the proxy's port (5 digits either way)
        host = "localhost" if "unix" in info else f"{self.addr[1]}:{self.addr[2]}"
        self.url = f"{'https' if info.get('tls') else 'http'}://{host}{HTTP_PATH}"

    async def start(self) -> None:
        import aiohttp

        kw: dict[str, Any] = {"limit": 64, "keepalive_timeout": 600}
        connector: Any
        if self.addr[0] == "unix":
            connector = aiohttp.UnixConnector(path=self.addr[1], **kw)
        else:
            connector = aiohttp.TCPConnector(ssl=_client_tls() if self.info.get("tls") else True, **kw)
        self.session = aiohttp.ClientSession(connector=connector)

    async def request(self, i: int) -> None:
        body = self._signed_body(i) if self.signed else self._hashed_body(i)
        async with self.session.post(
            self.url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            data = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{self.name}: HTTP {resp.status}: {data[:200]!r}")
        reply = json.loads(data)
        if self.signed:
            self._check_reply(reply)
        elif reply.get("ok") is not True:
            raise RuntimeError(f"{self.name}: bad reply {reply!r}")

    def _hashed_body(self, i: int) -> bytes:
        n = i % len(self.payloads)
        pj = self.payload_json[n]
        digest = hashlib.sha256((pj + HTTP_PASSWORD).encode()).hexdigest()
        head = f'{{"from":"{self.me}","to":"server","type":"RUN","payload":'
        tail = (
            f',"timestamp":{now_us()},"msg_id":{next(self.msg_ids)},"session_id":{self.session_id},'
            f'"hash":"{digest}"}}'
        )
        return (head + pj + tail).encode()

    def _signed_body(self, i: int) -> bytes:
        msg_id = next(self.msg_ids)
        env = {
            "from": self.me,
            "to": self.server_key,
            "type": "RUN",
            "payload": self.payloads[i % len(self.payloads)],
            "timestamp": now_us(),
            "msg_id": msg_id,
            "session_id": self.session_id,
        }
        body = canonical(env)
        sig = self.key.sign(body).signature.hex()
        # canonical JSON + one more member: still valid JSON, serialized once
        return body[len(SIGN_DOMAIN) : -1] + b',"sig":"' + sig.encode() + b'"}'

    def _check_reply(self, reply: dict[str, Any]) -> None:
        assert self.server_verify is not None
        sig = bytes.fromhex(reply.pop("sig"))
        self.server_verify.verify(canonical(reply), sig)  # raises BadSignatureError
        if reply["to"] != self.me or reply["from"] != self.server_key:
            raise RuntimeError(f"{self.name}: reply not for us")
        if abs(now_us() - int(reply["timestamp"])) > MAX_SKEW_US:
            raise RuntimeError(f"{self.name}: stale reply")

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


class GrpcClient(Client):
    def __init__(
        self, payloads: list[Any], info: dict[str, Any], *, via: tuple[Any, ...] | None = None
    ) -> None:
        super().__init__(payloads)
        self.name = info["name"]
        _, host, port = via or server_target(info)
        self.target = f"{host}:{port}"
        self.channel: Any = None
        self.call: Any = None

    async def start(self) -> None:
        import grpc

        self.channel = grpc.aio.insecure_channel(self.target)
        self.call = self.channel.unary_unary(GRPC_METHOD)

    async def request(self, i: int) -> None:
        data = await self.call(self.payload_json[i % len(self.payloads)].encode())
        if json.loads(data).get("ok") is not True:
            raise RuntimeError("grpc: bad reply")

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()


def baseline_client(
    payloads: list[Any], info: dict[str, Any], *, via: tuple[Any, ...] | None = None
) -> Client:
    if info["name"] == "grpc":
        return GrpcClient(payloads, info, via=via)
    return HttpClient(payloads, info, via=via)


def server_target(info: dict[str, Any]) -> tuple[Any, ...]:
    """Where a baseline server listens, as a ``CountingProxy`` target."""
    return ("unix", info["unix"]) if "unix" in info else ("tcp", info["host"], info["port"])


# --- server processes --------------------------------------------------------------------------


async def serve(start: Callable[[], Awaitable[Server]], profile: str | None = None) -> None:
    """Run a server until stdin closes, its info said first; with ``profile`` (a file path) under
    cProfile, the stats written there on exit."""
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    server = await start()
    say({"ready": True, **server.info, "pid": os.getpid()})
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)  # returns at EOF: the parent is done
    if prof is not None and profile is not None:
        prof.disable()
        prof.dump_stats(profile)
    await server.close()
