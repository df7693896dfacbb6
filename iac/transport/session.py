"""The session logic every adapter shares: the HELLO exchange and what each frame means.

* :func:`perform_handshake` drives a sans-IO HELLO exchange
  (:mod:`iac.protocol.handshake`) over any :class:`HandshakeChannel` (a QUIC control
  stream, a TLS or UNIX socket) and turns a refusal into a GOAWAY carrying the
  refusal's close code; :func:`client_handshake` and :func:`server_handshake` set
  up the two sides from a :class:`TransportConfig`.
* :class:`SessionLogic` judges each frame after the handshake; :class:`DictState`
  holds one connection's pushed dictionaries (DICT / DICT_ACK);
  :class:`EarlyFrames` holds what overtook the HELLO.
* :func:`peer_closed_error` and :func:`local_protocol_error` are the errors
  ``send``/``recv`` raise after a close.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import secrets
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zstandard
from google.protobuf.message import DecodeError

from iac.errors import (
    CloseCode,
    ConfigError,
    ConnectionClosed,
    HandshakeError,
    IacError,
    ProtocolError,
    StoreUnavailable,
)
from iac.protocol.clock import Clock
from iac.protocol.handshake import (
    ClientHandshake,
    HelloOrder,
    HelloParams,
    NonceStore,
    ServerHandshake,
    decode_goaway,
    encode_goaway,
    error_from_close,
)
from iac.transport.base import Incoming, TransportConfig
from iac.wire._pb.iac_pb2 import Dict, Hello
from iac.wire.dicts import MAX_DICT_SIZE, Dictionary, DictionarySet, derive_dictionary, message_prefix
from iac.wire.elide import ELIDE_CAPABILITY, FORWARD_CAPABILITY, elides, forwards_elided, pair_prefix
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, Frame, FrameType, PackedFrame, encode_frame
from iac.wire.identity import Identity

# --- the HELLO exchange over any channel ---------------------------------------------------------


class HandshakeChannel(ABC):
    """What :func:`perform_handshake` needs from an adapter: frames in and out."""

    #: Set by :func:`perform_handshake` when it sent a refusal (the adapter then
    #: lingers so that the peer can read it; after the peer's refusal it need not).
    goaway_sent: bool = False

    @abstractmethod
    async def send_frame(self, frame: bytes) -> None:
        """Write one encoded frame now."""

    @abstractmethod
    async def read_frame(self) -> Frame:
        """The next frame; raises :class:`ConnectionClosed` at end of stream."""


async def perform_handshake(
    hs: ClientHandshake | ServerHandshake,
    chan: HandshakeChannel,
    *,
    clock: Clock,
    initial_sent: bool = False,
    precheck: Callable[[], None] | None = None,
) -> Hello:
    """Run the HELLO exchange; return the peer's verified HELLO.

    A check that fails here sends GOAWAY with the error's close code and reason
    and re-raises the error; a GOAWAY from the peer raises the typed error for
    its code (:func:`error_from_close`). The caller applies the timeout and
    closes the transport on any exception. ``initial_sent``: this side's first
    HELLO already went (QUIC 0-RTT sends it before ``dial`` returns). A refusal of
    this side sets ``chan.goaway_sent``; the adapter does not send GOAWAY again.
    ``precheck``: called when the peer's HELLO arrived, before it is judged; a
    :class:`ProtocolError` it raises refuses the handshake (QUIC in CA mode checks
    the client's certificate there).
    """
    peer_error: IacError | None = None
    try:
        out = None if initial_sent else hs.initial(clock.now_us())
        if out is not None:
            await chan.send_frame(encode_frame(FrameType.HELLO, out, max_frame_size=1 << 30))
        while hs.peer_hello is None:
            frame = await chan.read_frame()
            if frame.type == FrameType.GOAWAY:
                code, reason = decode_goaway(frame.body)
                peer_error = error_from_close(code, reason, during_handshake=True)
                break
            if frame.type != FrameType.HELLO:
                raise HandshakeError(f"expected HELLO, got a {frame.type.name} frame")
            if precheck is not None:
                precheck()
            if isinstance(hs, ServerHandshake):
                out = await _server_receive(hs, frame.body, clock)
            else:
                out = hs.receive(frame.body, clock.now_us())
            if out is not None:
                await chan.send_frame(encode_frame(FrameType.HELLO, out, max_frame_size=1 << 30))
    except ProtocolError as exc:
        with contextlib.suppress(TimeoutError, OSError, IacError):
            chan.goaway_sent = True
            await chan.send_frame(goaway_frame(exc.close_code, str(exc)))
        raise
    if peer_error is not None:
        raise peer_error
    if hs.peer_hello is None:  # pragma: no cover - loop exits only with a HELLO or an error
        raise HandshakeError("handshake ended without a HELLO")
    return hs.peer_hello


async def _server_receive(hs: ServerHandshake, data: bytes, clock: Clock) -> bytes | None:
    """The server's side of :meth:`ServerHandshake.receive`: check the client's HELLO
    (admission included), then record its nonce — off the event loop when the cache is a
    shared store (SQLite, Redis) — then accept it."""
    now_us = clock.now_us()
    hello = hs.check(data, now_us)
    cache = hs.nonce_cache
    if cache is not None:
        try:
            if cache.shared:
                await asyncio.to_thread(cache.check_and_add, hello.nonce, now_us, max_skew_us=hs.max_skew_us)
            else:
                cache.check_and_add(hello.nonce, now_us, max_skew_us=hs.max_skew_us)
        except StoreUnavailable as exc:  # fail closed: an unchecked nonce could be a replay
            raise HandshakeError(f"busy: the HELLO nonce store is unavailable ({exc})") from None
    return hs.accept(hello, data, now_us)


def nonce_cache(config: TransportConfig) -> NonceStore:
    """The HELLO nonce cache of ``config``: the one every listener given it shares."""
    cache = config.nonce_cache
    if cache is None:  # pragma: no cover - TransportConfig makes one
        raise ConfigError("TransportConfig without a nonce cache")
    return cache


def parse_hello(data: bytes | None) -> Hello:
    """A HELLO this side sent, parsed (empty if a test hook sent bytes that do not parse)."""
    try:
        return Hello.FromString(data or b"")
    except DecodeError:
        return Hello()


def hello_params(config: TransportConfig, session_id: int = 0) -> HelloParams:
    """What this side announces in its HELLO, from the config."""
    return HelloParams(
        session_id=session_id or secrets.randbits(64) or 1,
        dict_ids=tuple(config.dictionaries.ids()),
        max_frame_size=config.max_frame_size,
        listen_addrs=config.listen_addrs,
        capabilities=_capabilities(config),
    )


def _capabilities(config: TransportConfig) -> tuple[str, ...]:
    """The HELLO's capabilities: the configured ones, plus ``elide/1`` and ``elide-forward/1``
    when they are on."""
    caps = config.capabilities
    if config.elide_prefixes and ELIDE_CAPABILITY not in caps:
        caps = (*caps, ELIDE_CAPABILITY)
    if config.elide_forwards and FORWARD_CAPABILITY not in caps:
        caps = (*caps, FORWARD_CAPABILITY)
    return caps


def client_handshake(
    identity: Identity,
    config: TransportConfig,
    *,
    order: HelloOrder,
    binding: bytes,
    expect: str | None,
    session_id: int = 0,
) -> ClientHandshake:
    """The dialing side's sans-IO handshake, set up from the config."""
    return ClientHandshake(
        identity,
        order,
        params=hello_params(config, session_id),
        binding=binding,
        max_skew_us=config.max_skew_us,
        hook=config.hello_hook,
        expect=expect,
    )


def server_handshake(
    identity: Identity,
    config: TransportConfig,
    *,
    order: HelloOrder,
    binding: bytes,
) -> ServerHandshake:
    """The accepting side's sans-IO handshake, set up from the config (its nonce cache and
    admission policy included)."""
    return ServerHandshake(
        identity,
        order,
        params=hello_params(config),
        binding=binding,
        max_skew_us=config.max_skew_us,
        hook=config.hello_hook,
        nonce_cache=nonce_cache(config),
        admission=config.admission,
    )


def goaway_frame(code: int, reason: str = "") -> bytes:
    return encode_frame(FrameType.GOAWAY, encode_goaway(code, reason))


# --- after the handshake: what each frame means -------------------------------------------------


#: Dictionaries a peer may push on one connection; one more is a protocol error.
MAX_PUSHED_DICTS = 2


#: Derived dictionaries and DICT frames made for recent peers, and dictionaries recently
#: installed from pushes (by SHA-256): a reconnect to the same peer reuses them instead of
#: deriving, compressing and loading 64 KiB again. Bounded; each entry holds zstd contexts.
_DICT_CACHE_SIZE = 32
_push_cache: OrderedDict[tuple[bytes, bytes, int], tuple[Dictionary, bytes]] = OrderedDict()
_install_cache: OrderedDict[bytes, Dictionary] = OrderedDict()


def _cache_get(cache: OrderedDict[Any, Any], key: Any) -> Any:
    value = cache.get(key)
    if value is not None:
        cache.move_to_end(key)
    return value


def _cache_put(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _DICT_CACHE_SIZE:  # the least recently used go
        cache.popitem(last=False)


def _dict_body(body: bytes, frame: str) -> Dict:
    """The ``Dict`` message in a DICT or DICT_ACK frame body (``bad_dictionary`` if it is not one)."""
    try:
        return Dict.FromString(body)
    except DecodeError:
        raise ProtocolError(f"{frame} body is not a Dict message", reason="bad_dictionary") from None


class DictState:
    """One connection's pushed dictionaries (sans-IO apart from the ``acked`` event).

    ``decode`` is this connection's own :class:`DictionarySet`: the configured
    dictionaries plus what the peer pushed (the frame decoders of the connection
    use it, so a push never reaches other connections). ``send_dictionary`` is
    the one this side pushed, once the peer acknowledged it.
    """

    def __init__(self, config: TransportConfig, send_control: Callable[[bytes], None] | None = None) -> None:
        self.config = config
        self.enabled = config.push_dictionaries
        self.decode = DictionarySet(config.dictionaries)
        self.send_control = send_control
        self.pushed: Dictionary | None = None
        self.send_dictionary: Dictionary | None = None
        self.installed: list[Dictionary] = []
        self.acked = asyncio.Event()

    def push_frame(self, local_agent_id: str, peer_hello: Hello) -> bytes | None:
        """Called once the peer's HELLO verified: the DICT frame to send, or None (disabled,
        no common dictionary, the peer's max_frame_size is too small for it, or both sides
        elide ``from``/``to``: then ``decode`` restores them on MESSAGE bodies instead)."""
        if forwards_elided(_capabilities(self.config), peer_hello.capabilities):
            self.decode.restore_forward = (peer_hello.agent_id, local_agent_id)
        if elides(_capabilities(self.config), peer_hello.capabilities):
            self.decode.restore_prefix = pair_prefix(peer_hello.agent_id, local_agent_id)
            return None
        if not self.enabled or self.pushed is not None:
            return None
        base = self.config.dictionaries.choose(peer_hello.dict_ids)
        if base is None:
            return None
        peer = peer_hello.agent_id
        tail = message_prefix(peer, local_agent_id) + message_prefix(local_agent_id, peer)
        limit = min(self.config.max_frame_size, peer_hello.max_frame_size or 1 << 30)
        key = (base.sha256, tail, limit)
        cached: tuple[Dictionary, bytes] | None = _cache_get(_push_cache, key)
        if cached is None:
            try:
                derived = derive_dictionary(base, tail)
                body = Dict(dict_id=derived.dict_id, sha256=derived.sha256, content=derived.content)
                frame = encode_frame(
                    FrameType.DICT, body.SerializeToString(), compress_with=base, max_frame_size=limit
                )
            except IacError:  # too large for the peer (frame_too_large) or for a dictionary (ConfigError)
                return None
            cached = (derived, frame)
            _cache_put(_push_cache, key, cached)
        self.pushed, frame = cached
        return frame

    def on_dict(self, body: bytes) -> None:
        """A DICT from the peer: check, install in ``decode``, answer DICT_ACK."""
        if not self.enabled:
            return
        msg = _dict_body(body, "DICT")
        content = msg.content
        if len(content) > MAX_DICT_SIZE:
            raise ProtocolError(
                f"pushed dictionary is {len(content)} bytes, above {MAX_DICT_SIZE}", reason="bad_dictionary"
            )
        if hashlib.sha256(content).digest() != msg.sha256:
            raise ProtocolError("pushed dictionary does not match its sha256", reason="bad_dictionary")
        known = self.decode.get(msg.dict_id)
        if known is None or known.sha256 != msg.sha256:
            if len(self.installed) >= MAX_PUSHED_DICTS:
                raise ProtocolError(
                    f"more than {MAX_PUSHED_DICTS} dictionaries pushed on one connection",
                    reason="bad_dictionary",
                )
            d: Dictionary | None = _cache_get(_install_cache, msg.sha256)
            if d is None:
                try:
                    d = Dictionary(content)
                except (ConfigError, zstandard.ZstdError) as exc:
                    raise ProtocolError(
                        f"pushed dictionary refused: {exc}", reason="bad_dictionary"
                    ) from None
                _cache_put(_install_cache, msg.sha256, d)
            if d.dict_id != msg.dict_id:
                raise ProtocolError(
                    f"DICT names id {msg.dict_id}, its content has id {d.dict_id}", reason="bad_dictionary"
                )
            try:
                self.decode.add(d)
            except ConfigError as exc:
                raise ProtocolError(str(exc), reason="bad_dictionary") from None
            self.installed.append(d)
        ack = Dict(dict_id=msg.dict_id, sha256=msg.sha256).SerializeToString()
        if self.send_control is not None:
            self.send_control(encode_frame(FrameType.DICT_ACK, ack))

    def on_ack(self, body: bytes) -> None:
        """A DICT_ACK: compress with the pushed dictionary from now on."""
        if not self.enabled:
            return
        msg = _dict_body(body, "DICT_ACK")
        pushed = self.pushed
        if pushed is None or msg.dict_id != pushed.dict_id or msg.sha256 != pushed.sha256:
            raise ProtocolError(
                f"DICT_ACK for dictionary {msg.dict_id}, which this side did not push",
                reason="bad_dictionary",
            )
        self.send_dictionary = pushed
        self.acked.set()


@dataclass(frozen=True)
class PeerGoaway:
    """The peer said GOAWAY."""

    code: int
    reason: str


class SessionLogic:
    """Judges frames on an established connection (sans-IO).

    * HELLO again → ``unexpected_hello`` (close).
    * MESSAGE and FORWARD → delivered as :class:`Incoming`, unopened: the node's receive
      pipeline verifies signatures (and that a MESSAGE's ``from`` is the HELLO peer).
    * GOAWAY → :class:`PeerGoaway`.
    * DICT / DICT_ACK → :class:`DictState` (install and acknowledge; switch to the
      pushed dictionary), None. A refused push raises ``bad_dictionary`` (close).
      Without a ``DictState`` (or with ``push_dictionaries`` off) both are ignored.
    * Unknown types and flags never get here: the frame decoder raises.
    """

    def __init__(self, peer_agent_id: str, dicts: DictState | None = None) -> None:
        self.peer_agent_id = peer_agent_id
        self.dicts = dicts
        self.dictionaries = dicts.decode if dicts is not None else DictionarySet()

    def judge(self, frame: PackedFrame) -> PackedFrame | PeerGoaway | None:
        """A frame as received, not decompressed. MESSAGE and FORWARD come back as they are,
        to wait for ``recv()`` compressed (their dictionary is checked now: a pushed one is
        installed before the frames that use it arrive). Any other frame is decoded and
        handled now, as by :meth:`on_frame`."""
        ftype = frame.type
        if ftype == FrameType.MESSAGE or ftype == FrameType.FORWARD:
            if frame.dict_id:
                self.dictionaries.require(frame.dict_id)
            return frame
        return self._control(frame.unpack(self.dictionaries))

    def on_frame(self, frame: Frame) -> Incoming | PeerGoaway | None:
        ftype = frame.type
        if ftype == FrameType.MESSAGE or ftype == FrameType.FORWARD:
            return Incoming(frame)
        return self._control(frame)

    def _control(self, frame: Frame) -> PeerGoaway | None:
        ftype = frame.type
        if ftype == FrameType.GOAWAY:
            return PeerGoaway(*decode_goaway(frame.body))
        if ftype == FrameType.HELLO:
            raise HandshakeError("a second HELLO on this connection", reason="unexpected_hello")
        if self.dicts is not None:
            if ftype == FrameType.DICT:
                self.dicts.on_dict(frame.body)
            elif ftype == FrameType.DICT_ACK:
                self.dicts.on_ack(frame.body)
        return None


class EarlyFrames:
    """Frames that arrived before the HELLO verified (QUIC uni streams), kept as they came
    (compressed: nothing is decompressed before the peer is known). Bounded in count
    (``limit``) and in wire bytes (``max_bytes``); one more is ``buffer_exceeded``."""

    def __init__(self, limit: int, max_bytes: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._frames: list[PackedFrame | Frame] = []

    def hold(self, frame: PackedFrame | Frame) -> None:
        size = frame.wire_size or len(frame.payload if isinstance(frame, PackedFrame) else frame.body)
        if len(self._frames) >= self.limit:
            raise ProtocolError(
                f"more than {self.limit} frames arrived before the HELLO verified", reason="buffer_exceeded"
            )
        if self.nbytes + size > self.max_bytes:
            raise ProtocolError(
                f"more than {self.max_bytes} bytes of frames arrived before the HELLO verified",
                reason="buffer_exceeded",
            )
        self.nbytes += size
        self._frames.append(frame)

    def release(self) -> list[PackedFrame | Frame]:
        out, self._frames = self._frames, []
        self.nbytes = 0
        return out

    def __len__(self) -> int:
        return len(self._frames)


def peer_closed_error(code: int, reason: str) -> IacError:
    """The error ``recv``/``send`` raise after the peer's GOAWAY."""
    if code == CloseCode.NO_ERROR:
        return ConnectionClosed(f"peer closed the connection{': ' + reason if reason else ''}", code, reason)
    return error_from_close(code, reason)


def local_protocol_error(exc: ProtocolError) -> ConnectionClosed:
    """The error ``recv``/``send`` raise after this side closed for the peer's fault."""
    err = ConnectionClosed(f"connection closed: {exc.reason}: {exc}", exc.close_code, str(exc))
    err.__cause__ = exc
    return err


__all__ = [
    "MAX_PUSHED_DICTS",
    "DictState",
    "EarlyFrames",
    "HandshakeChannel",
    "PeerGoaway",
    "SessionLogic",
    "client_handshake",
    "goaway_frame",
    "hello_params",
    "local_protocol_error",
    "nonce_cache",
    "parse_hello",
    "peer_closed_error",
    "perform_handshake",
    "server_handshake",
]
