"""The IAC contender of the node scenario: a server :class:`~iac.node.node.Node` in its own process
answering RUN inline with ``baselines.answer`` and counting one-way CREATE messages
(:class:`OnewayCounter`), and the client Node that asks it (:class:`IacClient`). ``iac`` is
imported where it is used: a process that serves a baseline does not pay for it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines
from iac.bench.contenders.baselines import Client
from iac.testing.lanes import base_name

IAC = ("iac-quic", "iac-tls", "iac-unix")
QUIC_BACKEND = {"iac-quic": "aioquic", "iac-quic-qh3": "qh3"}


def transport_of(name: str) -> str:
    """``quic``, ``tls`` or ``unix`` of a contender name (``iac-tls-uvloop`` -> ``tls``)."""
    return base_name(name).split("-")[1]


class OnewayCounter:
    """Server side of the one-way phase: counts CREATE messages; a TERMINATE request
    ``{"until": n}`` answers once ``n`` arrived, with the ``time.monotonic()`` of the last."""

    def __init__(self) -> None:
        self.seen = 0
        self.last = 0.0
        self.waiters: list[tuple[int, asyncio.Future[float]]] = []

    def arrived(self, ctx: Any) -> None:
        self.seen += 1
        self.last = time.monotonic()
        if self.waiters:
            for w in [w for w in self.waiters if self.seen >= w[0]]:
                self.waiters.remove(w)
                if not w[1].done():
                    w[1].set_result(self.last)

    async def wait(self, ctx: Any) -> dict[str, Any]:
        until = int(ctx.payload["until"])
        if self.seen < until:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append((until, fut))
            await asyncio.wait_for(fut, 120)
        return {"t": self.last, "seen": self.seen}


async def start_iac(name: str, workdir: Path) -> baselines.Server:
    from iac.node.config import NodeConfig
    from iac.node.node import Context, Node
    from iac.wire._pb.iac_pb2 import MessageType

    transport = transport_of(name)
    if base_name(name) in QUIC_BACKEND:  # this process serves one contender: select its backend
        _set_quic_backend(QUIC_BACKEND[base_name(name)])
    url = f"unix://{workdir / name / 's.sock'}" if transport == "unix" else f"{transport}://127.0.0.1:0"
    node = Node(listen=[url], config=NodeConfig(sync_in_thread=False))

    @node.on(MessageType.RUN)
    def handler(ctx: Context) -> object:
        return baselines.answer(ctx.payload)

    counter = OnewayCounter()
    node.on(MessageType.CREATE)(counter.arrived)
    node.on(MessageType.TERMINATE)(counter.wait)
    await node.start()
    return baselines.Server({"name": name, "agent_id": node.agent_id, "url": node.addresses[0]}, node.close)


def _set_quic_backend(name: str | None) -> None:
    with contextlib.suppress(ImportError):
        from iac.transport.quic.backend import set_backend

        set_backend(name)


@contextlib.contextmanager
def _dialing_with(backend: str | None) -> Iterator[None]:
    """Connections dialed inside use QUIC ``backend`` (a connection keeps the one it was dialed with)."""
    if backend:
        _set_quic_backend(backend)
    try:
        yield
    finally:
        if backend:
            _set_quic_backend(None)


class IacClient(Client):
    def __init__(self, payloads: list[Any], info: dict[str, Any], *, url: str | None = None) -> None:
        super().__init__(payloads)
        self.name = info["name"]
        self.backend = QUIC_BACKEND.get(base_name(self.name))
        self.peer = info["agent_id"]
        self.url = url or info["url"]
        self.node: Any = None
        self.oneway_conn: Any = None
        self.oneway_total = 0
        self.oneway_identity: Any = None
        self.oneway_session: Any = None

    async def start(self) -> None:
        from iac.node.node import Node
        from iac.wire._pb.iac_pb2 import MessageType

        self.run_type = MessageType.RUN
        self.node = Node()
        await self.node.start()
        self.node.add_peer(self.peer, self.url)
        if self.backend:
            with _dialing_with(self.backend):
                await self.request(0)

    async def request(self, i: int) -> None:
        reply = await self.node.request(self.peer, self.run_type, self.payloads[i % len(self.payloads)])
        if reply.payload.get("ok") is not True:
            raise RuntimeError(f"{self.name}: bad reply {reply.payload!r}")

    async def oneway_connection(self) -> Any:
        """The one-way sender's own connection (its own identity, HELLO and DICT exchange done),
        dialed again when the node closed it for idling while other contenders ran."""
        import dataclasses

        from iac.bench.contenders import floor
        from iac.transport import dial
        from iac.wire.identity import Identity
        from iac.wire.message import Session

        conn = self.oneway_conn
        if conn is not None and not conn.closed:
            return conn
        if conn is None:
            self.oneway_identity = Identity.generate()
            self.oneway_session = Session()
        else:
            with contextlib.suppress(Exception):
                await conn.close()
        # no idle timer of its own; a loaded machine may take a while to answer a handshake
        config = dataclasses.replace(floor.CONFIG, idle_timeout=None, handshake_timeout=30.0)
        with _dialing_with(self.backend):
            for attempt in range(3):
                try:
                    conn = self.oneway_conn = await dial(
                        self.url, self.oneway_identity, expect=self.peer, config=config
                    )
                    break
                except Exception:
                    if attempt == 2:
                        raise
        for _ in range(1000):  # the pushed dictionary is acknowledged one round trip later
            if conn.send_dictionary is not None:
                break
            await asyncio.sleep(0.001)
        return conn

    async def prepare_oneway(self, n: int) -> list[bytes]:
        await self.oneway_connection()
        return self.presign(n)

    def presign(self, n: int) -> list[bytes]:
        """``n`` CREATE frames of the payloads, signed and compressed now with the connection's
        dictionary (fresh each batch: the node refuses replays)."""
        from iac.bench.contenders import floor
        from iac.wire._pb.iac_pb2 import MessageType
        from iac.wire.frames import FrameType, encode_frame
        from iac.wire.message import build_message, sign_message

        ident, session, pj = self.oneway_identity, self.oneway_session, self.payload_json
        dictionary = self.oneway_conn.send_dictionary or floor.DICT  # the connection's, as a node uses
        now = baselines.now_us()
        out = []
        for i in range(n):
            msg = build_message(
                sender=ident.agent_id,
                to=self.peer,
                msg_type=MessageType.CREATE,
                session=session,
                timestamp_us=now,
                payload_json=pj[i % len(pj)],
            )
            out.append(encode_frame(FrameType.MESSAGE, sign_message(ident, msg), compress_with=dictionary))
        return out

    async def oneway(self, frames: list[bytes]) -> float:
        """Messages/s from the first send to the node's handler seeing the last."""
        from iac.wire._pb.iac_pb2 import MessageType

        conn = await self.oneway_connection()
        t0 = time.monotonic()
        for f in frames:
            await conn.send(f)
        self.oneway_total += len(frames)
        r = await self.node.request(
            self.peer, MessageType.TERMINATE, {"until": self.oneway_total}, timeout=150
        )
        if r.payload["seen"] != self.oneway_total:
            raise RuntimeError(f"{self.name}: one-way: {r.payload['seen']} arrived, {self.oneway_total} sent")
        return float(len(frames) / (r.payload["t"] - t0))

    def frame_bytes(self) -> int:
        s = self.node.stats()
        return int(s.bytes_sent + s.bytes_received)

    async def close(self) -> None:
        if self.oneway_conn is not None:
            with contextlib.suppress(Exception):
                await self.oneway_conn.close()
        if self.node is not None:
            await self.node.close()
