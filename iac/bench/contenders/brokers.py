"""The messaging systems agent builders reach for instead of IAC: NATS (nats-py, request/reply
through a ``nats-server`` the server endpoint starts and stops itself) and ZeroMQ (pyzmq, DEALER to
ROUTER), both plain TCP. Each is bare (a JSON envelope) or ``-ed25519``: request and reply signed
and verified with PyNaCl, the four Ed25519 operations IAC does per request."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iac.wire.jsonutil import dumps_compact

SUBJECT = "iac.bench.request"
NATS_SERVER = "nats-server"
#: How long a starting nats-server may take to say where it listens.
NATS_START_TIMEOUT = 15.0
_LISTENING = re.compile(rb"Listening for client connections on ([\d.]+):(\d+)")

#: name -> (system, signed, label)
KINDS = {
    "nats": ("nats", False, "NATS"),
    "nats-ed25519": ("nats", True, "NATS+Ed25519"),
    "zmq": ("zmq", False, "ZeroMQ"),
    "zmq-ed25519": ("zmq", True, "ZeroMQ+Ed25519"),
}


def missing(name: str) -> str | None:
    """Why contender ``name`` cannot run here, as ``<what is missing> — <the command that adds it>``."""
    module, package = ("nats", "nats-py") if KINDS[name][0] == "nats" else ("zmq", "pyzmq")
    if importlib.util.find_spec(module) is None:
        return f"{package} not installed — pip install 'iac[bench]'"
    if module == "nats" and shutil.which(NATS_SERVER) is None:
        return "nats-server not found — apt-get install nats-server"
    return None


# --- envelopes ------------------------------------------------------------------------------------


def keys(signed: bool, me: bytes, peer: bytes) -> tuple[Any, Any]:
    """(my signing key, the peer's verify key), or (None, None) when unsigned."""
    if not signed:
        return None, None
    import nacl.signing

    return nacl.signing.SigningKey(me), nacl.signing.SigningKey(peer).verify_key


def seal(payload: str, msg_id: int, signer: Any | None, kind: str = "RUN") -> bytes:
    """A JSON envelope of ``payload``; signed with ``signer`` (Ed25519) when given. ``kind``: RUN (a
    request), EVENT (one-way) or SEEN (how many EVENTs the server has handled)."""
    raw = dumps_compact({"type": kind, "payload": payload, "msg_id": msg_id, "ts": time.time_ns() // 1000})
    if signer is None:
        return raw.encode()
    return dumps_compact({"envelope": raw, "sig": signer.sign(raw.encode()).signature.hex()}).encode()


def unseal(body: bytes, verifier: Any | None) -> dict[str, Any]:
    """The envelope in ``body``, its signature checked when ``verifier`` is given; the payload parsed."""
    obj = json.loads(body)
    if verifier is not None:
        verifier.verify(obj["envelope"].encode(), bytes.fromhex(obj["sig"]))
        obj = json.loads(obj["envelope"])
    json.loads(obj["payload"])
    env: dict[str, Any] = obj
    return env


class Codec:
    """One side's envelope keys and the reply it sends."""

    def __init__(self, signed: bool, me: bytes, peer: bytes, reply: str) -> None:
        self.signer, self.verifier = keys(signed, me, peer)
        self.reply = reply
        self.handled = 0
        self.events = 0

    def answer(self, body: bytes) -> bytes | None:
        """The reply to ``body``, or None for a one-way message."""
        env = unseal(body, self.verifier)
        if env["type"] == "EVENT":
            self.events += 1
            return None
        if env["type"] == "SEEN":
            return seal(json.dumps({"seen": self.events}), int(env["msg_id"]), self.signer)
        self.handled += 1
        return seal(self.reply, int(env["msg_id"]), self.signer)


class Sender:
    """What both clients share: the envelope keys, the one-way messages and the count query."""

    def __init__(self, signed: bool, me: bytes, peer: bytes, payload: str, target: dict[str, Any]) -> None:
        self.signer, self.verifier = keys(signed, me, peer)
        self.payload, self.url = payload, target["url"]

    async def call(self, body: bytes, msg_id: int) -> dict[str, Any]:
        raise NotImplementedError

    async def push(self, body: bytes) -> None:
        raise NotImplementedError

    async def request(self, i: int) -> None:
        env = await self.call(seal(self.payload, i, self.signer), i)
        if int(env["msg_id"]) != i:
            raise RuntimeError("reply to another request")

    async def event(self, i: int) -> None:
        await self.push(seal(self.payload, i, self.signer, "EVENT"))

    async def seen(self) -> int:
        env = await self.call(seal("{}", 0, self.signer, "SEEN"), 0)
        return int(json.loads(env["payload"])["seen"])

    def frame_bytes(self) -> int | None:
        return None


# --- nats-server ----------------------------------------------------------------------------------


class NatsServerProcess:
    """A ``nats-server`` on a free loopback port, started and stopped by its owner."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.proc: asyncio.subprocess.Process | None = None
        self.url = ""

    async def start(self) -> str:
        path = shutil.which(NATS_SERVER)
        if path is None:
            raise RuntimeError("nats-server not found — apt-get install nats-server")
        self.proc = await asyncio.create_subprocess_exec(
            path, "-a", self.host, "-p", "-1", "-m", "0",
            stdout=subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stderr is not None
        try:
            async with asyncio.timeout(NATS_START_TIMEOUT):
                while True:
                    line = await self.proc.stderr.readline()
                    if not line:
                        raise RuntimeError(f"nats-server exited ({await self.proc.wait()}) before listening")
                    m = _LISTENING.search(line)
                    if m:
                        break
        except BaseException:
            await self.close()
            raise
        self._drain = asyncio.ensure_future(self._discard(self.proc.stderr))
        self.url = f"nats://{m.group(1).decode()}:{int(m.group(2))}"
        return self.url

    @staticmethod
    async def _discard(stream: asyncio.StreamReader) -> None:
        while await stream.readline():
            pass

    async def close(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


# --- NATS -----------------------------------------------------------------------------------------


class Responder:
    """A server endpoint: it answers with its :class:`Codec`."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec

    @property
    def handled(self) -> int:
        return self.codec.handled


class NatsResponder(Responder):
    """The server endpoint: its own nats-server, and a responder subscribed to :data:`SUBJECT`."""

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        import nats

        self.server = NatsServerProcess(host)
        url = await self.server.start()
        self.nc = await nats.connect(servers=[url], allow_reconnect=False)

        async def on_request(msg: Any) -> None:
            reply = self.codec.answer(msg.data)
            if reply is not None:
                await msg.respond(reply)

        await self.nc.subscribe(SUBJECT, cb=on_request)
        await self.nc.flush()
        return {"url": url}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.nc.drain()
        await self.server.close()


class NatsRequester(Sender):
    """The client endpoint: ``nc.request`` per call, ``nc.publish`` per one-way message."""

    async def start(self) -> None:
        import nats

        self.nc = await nats.connect(servers=[self.url], allow_reconnect=False, pending_size=64 << 20)

    async def call(self, body: bytes, msg_id: int) -> dict[str, Any]:
        msg = await self.nc.request(SUBJECT, body, timeout=60)
        return unseal(msg.data, self.verifier)

    async def push(self, body: bytes) -> None:
        await self.nc.publish(SUBJECT, body)

    async def close(self) -> None:
        await self.nc.close()


# --- ZeroMQ ---------------------------------------------------------------------------------------


class ZmqRouter(Responder):
    """The server endpoint: a ROUTER socket answering each request in order of arrival."""

    async def start(self, host: str, directory: Path) -> dict[str, Any]:
        self.ctx, self.sock = _zmq_socket("ROUTER")
        port = self.sock.bind_to_random_port(f"tcp://{host}")
        self.task = asyncio.ensure_future(self._serve())
        return {"url": f"tcp://{host}:{port}"}

    async def _serve(self) -> None:
        while True:
            ident, body = await self.sock.recv_multipart()
            reply = self.codec.answer(body)
            if reply is not None:
                await self.sock.send_multipart([ident, reply])

    async def close(self) -> None:
        await _zmq_close(self.task, self.sock, self.ctx)


class ZmqDealer(Sender):
    """The client endpoint: one DEALER socket; a reader task hands each reply to its request."""

    waiting: dict[int, asyncio.Future[dict[str, Any]]]

    async def start(self) -> None:
        self.waiting = {}
        self.ctx, self.sock = _zmq_socket("DEALER")
        self.sock.connect(self.url)
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while True:
            body = await self.sock.recv()
            try:
                env = unseal(body, self.verifier)
            except Exception as exc:  # a reply that does not verify fails every waiting request
                for fut in self.waiting.values():
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            done = self.waiting.pop(int(env["msg_id"]), None)
            if done is not None and not done.done():
                done.set_result(env)

    async def call(self, body: bytes, msg_id: int) -> dict[str, Any]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[msg_id] = fut
        await self.sock.send(body)
        try:
            return await asyncio.wait_for(fut, 60)
        finally:
            self.waiting.pop(msg_id, None)

    async def push(self, body: bytes) -> None:
        await self.sock.send(body)

    async def close(self) -> None:
        await _zmq_close(self.reader, self.sock, self.ctx)


def _zmq_socket(kind: str) -> tuple[Any, Any]:
    """A ``zmq.asyncio`` context and a socket of ``kind`` (ROUTER, DEALER) in it, not lingering."""
    import zmq
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    sock = ctx.socket(getattr(zmq, kind))
    sock.setsockopt(zmq.LINGER, 0)
    return ctx, sock


async def _zmq_close(task: asyncio.Future[None], sock: Any, ctx: Any) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    sock.close()
    ctx.term()


class NatsFanout:
    """Broadcast as NATS users do it: one publish on a subject that ``n - 1`` subscribers (one
    connection each, all in this process) receive; ``on_hit(key)`` runs for each delivery. Signed:
    the origin signs once, every subscriber verifies."""

    SUBJECT = "iac.bench.broadcast"

    def __init__(self, n: int, on_hit: Callable[[int], None]) -> None:
        self.n, self.on_hit = n, on_hit
        self.server = NatsServerProcess()
        self.conns: list[Any] = []
        self.signer, self.verifier = keys(True, bytes(range(32)), bytes(range(32)))

    async def setup(self) -> None:
        import nats

        url = await self.server.start()
        for _ in range(self.n):
            self.conns.append(await nats.connect(servers=[url], allow_reconnect=False))

        async def deliver(msg: Any) -> None:
            obj = json.loads(msg.data)
            env = unseal(msg.data, self.verifier) if "sig" in obj else obj
            self.on_hit(int(json.loads(env["payload"])["k"]))

        for nc in self.conns[1:]:
            await nc.subscribe(self.SUBJECT, cb=deliver)
            await nc.flush()

    async def publish(self, key: int, payload: dict[str, Any], signed: bool) -> None:
        body = seal(json.dumps(payload), key, self.signer if signed else None, "EVENT")
        await self.conns[0].publish(self.SUBJECT, body)
        await self.conns[0].flush()

    async def close(self) -> None:
        for nc in self.conns:
            with contextlib.suppress(Exception):
                await nc.close()
        await self.server.close()


BrokerServer = NatsResponder | ZmqRouter
BrokerClient = NatsRequester | ZmqDealer


def make_server(name: str, me: bytes, peer: bytes, reply: str) -> BrokerServer:
    system, signed, _ = KINDS[name]
    codec = Codec(signed, me, peer, reply)
    return NatsResponder(codec) if system == "nats" else ZmqRouter(codec)


def make_client(name: str, me: bytes, peer: bytes, payload: str, target: dict[str, Any]) -> BrokerClient:
    system, signed, _ = KINDS[name]
    return (NatsRequester if system == "nats" else ZmqDealer)(signed, me, peer, payload, target)
