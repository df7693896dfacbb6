"""The HTTP contenders of the request endpoints: aiohttp POST of a JSON envelope, hashed with a shared
password (as Agent Zero does) or signed with Ed25519 both ways, over TCP, TLS 1.3 or a UNIX socket.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from iac.bench.contenders.baselines import dumps_compact
from iac.bench.contenders.common import (
    CLIENT_SEED,
    PASSWORD,
    PATH,
    PAYLOAD,
    REPLY,
    SERVER_SEED,
    Client,
    Server,
)


def _sha(payload: str) -> str:
    return hashlib.sha256((payload + PASSWORD).encode()).hexdigest()


def http_body(payload: str, msg_id: int, signer: Any | None) -> bytes:
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


def http_open(body: bytes, verifier: Any | None) -> dict[str, Any]:
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


def signing_keys(signed: bool, me: bytes, peer: bytes) -> tuple[Any, Any]:
    if not signed:
        return None, None
    import nacl.signing

    return nacl.signing.SigningKey(me), nacl.signing.SigningKey(peer).verify_key


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
        self.signer, self.verifier = signing_keys(signed, SERVER_SEED, CLIENT_SEED)
        self.transport = transport

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        from aiohttp import web

        async def handle(request: web.Request) -> web.Response:
            env = http_open(await request.read(), self.verifier)
            self.handled += 1
            body = http_body(json.dumps(REPLY), int(env["msg_id"]), self.signer)
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


class HttpClient(Client):
    def __init__(self, signed: bool) -> None:
        self.signer, self.verifier = signing_keys(signed, CLIENT_SEED, SERVER_SEED)
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
        body = http_body(self.payload, i, self.signer)
        async with self.session.post(
            self.url, data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            env = http_open(await resp.read(), self.verifier)
            if int(env["msg_id"]) != i:
                raise RuntimeError("reply to another request")

    async def close(self) -> None:
        await self.session.close()
