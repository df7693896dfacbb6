"""Floor contenders (``floor-quic``, ``floor-tls``, ``floor-unix``, and ``…-uvloop``): the least a
signed, compressed request/reply can cost on each transport. Client and server do, inline in the
protocol's receive callback, exactly the codec work a request must do (:class:`Codec`, prepared
ahead: keys, the dictionaries an IAC connection ends up with) and send as IAC's transports do; no
freshness or replay check, no queues or tasks. The **echo** phase sends frames of the same sizes
with no codec work. benchmarks/README.md ("The floor") describes them."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from pathlib import Path
from typing import Any

from iac.bench.contenders import baselines
from iac.bench.contenders.baselines import Client, now_us
from iac.transport.base import TransportConfig
from iac.transport.certs import generate_self_signed
from iac.transport.tls import client_context, server_context
from iac.wire._pb.iac_pb2 import Message
from iac.wire.dicts import DictionarySet, default_dictionary, derive_dictionary, message_prefix
from iac.wire.enums import MessageType
from iac.wire.frames import FrameDecoder, FrameType, PackedFrame, encode_frame
from iac.wire.identity import Identity
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import Session, build_message, open_message, sign_message

DICT = default_dictionary()
DICTS = DictionarySet([DICT])
CONFIG = TransportConfig(dictionaries=DICTS)
ECHO = FrameType.FORWARD
#: QUIC idle timeout of a floor connection (s): it sits idle while the other contenders run.
IDLE = 3600.0
_RUN = int(MessageType.RUN)
_REPLY = int(MessageType.REPLY)


def as_echo(frame: bytes) -> bytes:
    """The same bytes as a FORWARD frame: echoed without codec work."""
    return bytes((ECHO,)) + frame[1:]


class Codec:
    """One side of one connection, prepared ahead: identity, session, and the dictionaries an IAC
    connection ends up with after its DICT exchange (the shipped one with both AgentIds' message
    prefixes appended), the one this side compresses with and the one the peer does."""

    def __init__(self, identity: Identity, peer: str) -> None:
        self.identity = identity
        self.me = identity.agent_id
        self.peer = peer
        self.session = Session()
        me_to_peer, peer_to_me = (
            message_prefix(identity.agent_id, peer),
            message_prefix(peer, identity.agent_id),
        )
        self.send_dict = derive_dictionary(DICT, peer_to_me + me_to_peer)
        self.dicts = DictionarySet([DICT, derive_dictionary(DICT, me_to_peer + peer_to_me)])

    def encode(self, msg_type: int, payload_json: str, reply_to: Message | None = None) -> tuple[int, bytes]:
        """``(msg_id, frame)``: build, sign, compress, frame."""
        msg = build_message(
            sender=self.me,
            to=self.peer,
            msg_type=msg_type,
            session=self.session,
            timestamp_us=now_us(),
            payload_json=payload_json,
            reply_to=reply_to.msg_id if reply_to is not None else 0,
            reply_session_id=reply_to.session_id if reply_to is not None else 0,
        )
        frame = encode_frame(
            FrameType.MESSAGE, sign_message(self.identity, msg), compress_with=self.send_dict
        )
        return msg.msg_id, frame

    def decode(self, packed: PackedFrame) -> Message:
        """Decompress, parse, verify."""
        return open_message(packed.unpack(self.dicts).body)

    def answer(self, packed: PackedFrame) -> bytes:
        """The server's whole job for one request frame."""
        req = self.decode(packed)
        reply = dumps_compact(baselines.answer(json.loads(req.payload_json)))
        return self.encode(_REPLY, reply, req)[1]


def hello_frame(identity: Identity) -> bytes:
    """The first frame of a floor connection: the client's AgentId (the server prepares its
    codec for the connection from it)."""
    return encode_frame(FrameType.HELLO, identity.agent_id.encode())


# --- server ------------------------------------------------------------------------------------


class _Session:
    """The server's side of one connection."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.codec: Codec | None = None
        self.echo_reply = b""

    def reply(self, packed: PackedFrame) -> bytes | None:
        codec = self.codec
        if codec is not None:
            return self.echo_reply if packed.type is ECHO else codec.answer(packed)
        if packed.type is not FrameType.HELLO:
            raise RuntimeError("a floor connection starts with the client's AgentId")
        codec = self.codec = Codec(self.identity, packed.payload.decode())
        # an echo reply as large as a real one (``{"ok":true,"keys":N}`` signed and compressed)
        self.echo_reply = as_echo(codec.encode(_REPLY, dumps_compact(baselines.answer({"a": 1})))[1])
        return None


class _StreamServer(asyncio.Protocol):
    def __init__(self, identity: Identity) -> None:
        self.session = _Session(identity)
        self.decoder = FrameDecoder()
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reply = self.session.reply
        out = [r for p in self.decoder.feed_packed(data) if (r := reply(p)) is not None]
        if out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))


def _quic_protocols() -> tuple[type, type]:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic import events

    from iac.transport.quic.streams import SHARE_LIMIT

    class Flushing(QuicConnectionProtocol):
        """Frames go out as IAC's QUIC connection sends them: queued, then at the end of the loop
        turn each on a new unidirectional stream, frames queued together sharing one up to
        ``SHARE_LIMIT`` bytes."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.queued: list[bytes] = []
            self.decoders: dict[int, FrameDecoder] = {}

        def frames(self, event: Any) -> list[PackedFrame]:
            """The whole frames ``event`` completes (a decoder per stream)."""
            sid = event.stream_id
            dec = self.decoders.get(sid)
            if dec is None:
                dec = self.decoders[sid] = FrameDecoder()
            frames: list[PackedFrame] = dec.feed_packed(event.data, final=event.end_stream)
            if event.end_stream:
                del self.decoders[sid]
            return frames

        def send(self, frame: bytes) -> None:
            self.queued.append(frame)
            self._transmit_soon()

        def transmit(self) -> None:
            queued = self.queued
            if queued:
                quic = self._quic
                self.queued = []
                i, n = 0, len(queued)
                while i < n:
                    j, size = i + 1, len(queued[i])
                    while j < n and size + len(queued[j]) <= SHARE_LIMIT:
                        size += len(queued[j])
                        j += 1
                    data = queued[i] if j == i + 1 else b"".join(queued[i:j])
                    quic.send_stream_data(
                        quic.get_next_available_stream_id(is_unidirectional=True), data, True
                    )
                    i = j
            super().transmit()

        def datagram_received(self, data: bytes | str, addr: Any) -> None:
            # as IAC's QUIC protocol: the flush waits for the end of the loop turn, so the
            # datagrams that arrived together are answered (and acknowledged) in one flush
            raw = data if isinstance(data, bytes) else data.encode()
            self._quic.receive_datagram(raw, addr, now=self._loop.time())
            self._process_events()
            self._transmit_soon()

    class QuicServer(Flushing):
        identity: Identity

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.session = _Session(self.identity)

        def quic_event_received(self, event: Any) -> None:
            if not isinstance(event, events.StreamDataReceived):
                return
            if event.stream_id == 0 and not event.data:
                return
            for p in self.frames(event):
                reply = self.session.reply(p)
                if reply is not None:
                    self.send(reply)

    class QuicClient(Flushing):
        side: _ClientSide

        def quic_event_received(self, event: Any) -> None:
            if isinstance(event, events.StreamDataReceived):
                for p in self.frames(event):
                    self.side.on_frame(p)

    return QuicServer, QuicClient


async def start_floor(name: str, workdir: Path) -> baselines.Server:
    """Serve ``floor-quic``, ``floor-tls`` or ``floor-unix`` (this process: the server)."""
    from iac.testing.lanes import base_name

    transport = base_name(name).split("-")[1]
    identity = Identity.generate()
    info: dict[str, Any] = {"name": name, "agent_id": identity.agent_id, "transport": transport}
    loop = asyncio.get_running_loop()
    server: Any
    if transport == "quic":
        from aioquic.asyncio.server import serve

        from iac.transport.quic.backend import get_backend
        from iac.transport.quic.configuration import server_configuration

        server_cls, _ = _quic_protocols()
        server_cls.identity = identity  # type: ignore[attr-defined]
        qc, _der = server_configuration(identity, CONFIG, get_backend("aioquic"))
        qc.idle_timeout = IDLE  # no keep-alive here: idle while the other contenders run
        qserver = await serve("127.0.0.1", 0, configuration=qc, create_protocol=server_cls)
        info["host"], info["port"] = "127.0.0.1", qserver._transport.get_extra_info("sockname")[1]  # type: ignore[union-attr]
        server = qserver
    elif transport == "unix":
        path = str(workdir / f"{name}.sock")
        server = await loop.create_unix_server(lambda: _StreamServer(identity), path)
        info["unix"] = path
    else:
        ctx = server_context(generate_self_signed("floor.localhost"), CONFIG)
        server = await loop.create_server(lambda: _StreamServer(identity), "127.0.0.1", 0, ssl=ctx)
        info["host"], info["port"] = "127.0.0.1", server.sockets[0].getsockname()[1]

    async def close() -> None:
        server.close()

    return baselines.Server(info, close)


# --- client ------------------------------------------------------------------------------------


class _ClientSide:
    """Replies in: codec frames matched by ``reply_to``, echo frames in order."""

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self.pending: dict[int, asyncio.Future[Message]] = {}
        self.echoes: collections.deque[asyncio.Future[None]] = collections.deque()

    def on_frame(self, packed: PackedFrame) -> None:
        if packed.type is ECHO:
            fut: asyncio.Future[Any] = self.echoes.popleft()
            fut.set_result(None)
            return
        msg = self.codec.decode(packed)
        self.pending.pop(msg.reply_to).set_result(msg)

    def fail(self, exc: BaseException) -> None:
        waiting: list[asyncio.Future[Any]] = [*self.pending.values(), *self.echoes]
        for f in waiting:
            if not f.done():
                f.set_exception(exc)
        self.pending.clear()
        self.echoes.clear()


class _StreamClient(asyncio.Protocol):
    def __init__(self, side: _ClientSide) -> None:
        self.side = side
        self.decoder = FrameDecoder()
        self.transport: Any = None
        self._batch: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        on_frame = self.side.on_frame
        for p in self.decoder.feed_packed(data):
            on_frame(p)

    def connection_lost(self, exc: Exception | None) -> None:
        self.side.fail(exc or ConnectionError("floor connection closed"))

    def send(self, frame: bytes) -> None:
        """The first frame of a loop turn is written at once; the others sent in that turn
        follow in one write at its end."""
        if self._batch is not None:
            self._batch.append(frame)
            return
        self.transport.write(frame)
        self._batch = []
        asyncio.get_running_loop().call_soon(self._end_batch)

    def _end_batch(self) -> None:
        batch, self._batch = self._batch, None
        if batch:
            self.transport.write(batch[0] if len(batch) == 1 else b"".join(batch))


class FloorClient(Client):
    """``request(i)``: payload ``i`` through the codec both ways; ``echo(i)``: the same frame
    sizes, no codec work. ``via`` as for the baselines (a counting relay)."""

    def __init__(
        self, payloads: list[Any], info: dict[str, Any], *, via: tuple[Any, ...] | None = None
    ) -> None:
        super().__init__(payloads)
        self.name = info["name"]
        self.info = info
        self.via = via
        self.peer = info["agent_id"]
        self.codec = Codec(Identity.generate(), self.peer)
        self.side = _ClientSide(self.codec)
        self.proto: Any = None
        self.transport: Any = None
        self.echo_frames: list[bytes] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        info = self.info
        kind, *addr = self.via or baselines.server_target(info)
        if info["transport"] == "quic":
            from aioquic.quic.connection import QuicConnection

            from iac.transport.quic.backend import get_backend
            from iac.transport.quic.configuration import client_configuration

            host, port = addr
            _, client_cls = _quic_protocols()
            qc = client_configuration(CONFIG, host, get_backend("aioquic"))
            qc.idle_timeout = IDLE
            quic = QuicConnection(configuration=qc)
            self.transport, self.proto = await loop.create_datagram_endpoint(
                lambda: client_cls(quic), remote_addr=(host, port)
            )
            self.proto.side = self.side
            self.proto.connect((host, port))
            await self.proto.wait_connected()
        elif kind == "unix":
            self.transport, self.proto = await loop.create_unix_connection(
                lambda: _StreamClient(self.side), addr[0]
            )
        else:
            ctx = client_context(self.codec.identity, CONFIG)
            self.transport, self.proto = await loop.create_connection(
                lambda: _StreamClient(self.side), *addr, ssl=ctx, server_hostname="floor.localhost"
            )
        self.proto.send(hello_frame(self.codec.identity))
        # echo frames: each payload's real request frame, as FORWARD
        self.echo_frames = [as_echo(self.codec.encode(_RUN, pj)[1]) for pj in self.payload_json]

    async def request(self, i: int) -> None:
        msg_id, frame = self.codec.encode(_RUN, dumps_compact(self.payloads[i % len(self.payloads)]))
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.side.pending[msg_id] = fut
        self.proto.send(frame)
        reply = await fut
        if json.loads(reply.payload_json).get("ok") is not True:
            raise RuntimeError(f"{self.name}: bad reply {reply.payload_json!r}")

    async def echo(self, i: int) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.side.echoes.append(fut)
        self.proto.send(self.echo_frames[i % len(self.echo_frames)])
        await fut

    async def close(self) -> None:
        if self.proto is None:
            return
        if self.info["transport"] == "quic":
            self.proto.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proto.wait_closed(), 2)
        self.transport.close()
        self.proto = None
