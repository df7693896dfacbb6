"""The transport interface and the session logic every adapter shares.

An adapter (QUIC, TLS/TCP, UNIX) moves frames; everything that decides what a
frame *means* lives here or in :mod:`iac.protocol.handshake`, so it is written once:

* :func:`perform_handshake` drives a sans-IO HELLO exchange over any
  :class:`HandshakeChannel` (a QUIC control stream, a TLS or UNIX socket) and
  turns a refusal into a GOAWAY carrying the refusal's close code.
* :class:`SessionLogic` judges each frame after the handshake.
* :class:`SendQueue` and :class:`RecvQueue` are the bounded queues between the
  application and an adapter's I/O (send waits when full; frames queued in
  one event-loop turn go out in one write).
* :class:`ConnectionTable` keeps one connection per peer pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import secrets
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import zstandard

from iac.errors import (
    BadDictionary,
    BufferExceeded,
    CloseCode,
    ConfigError,
    ConnectionClosed,
    HandshakeError,
    IacError,
    Impersonation,
    MessageRejected,
    ProtocolError,
    TransportError,
    UnexpectedHello,
)
from iac.protocol.clock import SYSTEM_CLOCK, Clock
from iac.protocol.handshake import (
    DEFAULT_MAX_SKEW_US,
    ClientHandshake,
    HelloHook,
    HelloOrder,
    HelloParams,
    NonceCache,
    ServerHandshake,
    decode_goaway,
    encode_goaway,
    error_from_close,
)
from iac.wire._pb.iac_pb2 import Dict, Hello, Message
from iac.wire.dicts import MAX_DICT_SIZE, Dictionary, DictionarySet, derive_dictionary, message_prefix
from iac.wire.frames import DEFAULT_MAX_FRAME_SIZE, Frame, FrameType, encode_frame
from iac.wire.identity import Identity
from iac.wire.message import open_message, sender_of

log = logging.getLogger("iac.transport")

MiB = 1024 * 1024
TRANSPORTS = ("quic", "tls", "unix")


@dataclass(frozen=True)
class TransportConfig:
    """Settings shared by every transport. All bounds are here, with their defaults.

    Timeouts are seconds. ``None`` for ``idle_timeout`` disables it.
    """

    #: Largest frame accepted (wire length and decompressed size); announced in HELLO.
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    #: HELLO timestamps further than this from the local clock are refused.
    max_skew_us: int = DEFAULT_MAX_SKEW_US
    #: Transport setup (TCP/TLS/QUIC handshake) plus the HELLO exchange.
    handshake_timeout: float = 5.0
    #: A connection on which no frame moved either way for this long is closed (GOAWAY IDLE_TIMEOUT).
    idle_timeout: float | None = 30.0
    #: Liveness probes: TCP keep-alive idle time on TLS/TCP; QUIC PING interval.
    keepalive_interval: float = 10.0
    #: Send-side backpressure: ``send()`` waits while this many frames / bytes are queued.
    send_queue_frames: int = 1024
    send_queue_bytes: int = 8 * MiB
    #: Receive side: decoded frames waiting for ``recv()``; reading stops while full.
    recv_queue_frames: int = 1024
    #: Bytes of partly received frames (all streams of a connection) plus frames
    #: waiting for ``recv()``.
    recv_budget_bytes: int = 16 * MiB
    #: Frames a server holds before the HELLO verifies (QUIC uni streams can overtake it).
    early_frames_limit: int = 256
    #: How long a closing side waits for the peer to read its GOAWAY and hang up.
    linger_timeout: float = 1.0
    #: Dictionaries this side decodes (announced in HELLO, preferred first).
    dictionaries: DictionarySet = field(default_factory=DictionarySet)
    #: After the handshake, push the peer a dictionary derived from the negotiated one
    #: (its content plus this pair's Message prefixes) and compress with it once the peer
    #: acknowledged it; acknowledge the peer's pushes. False: neither push nor acknowledge
    #: (a pushed DICT is ignored, so the peer keeps the HELLO-negotiated dictionary).
    push_dictionaries: bool = True
    #: Admission policy on the accepting side: AgentId -> admitted? None admits every
    #: authenticated peer (SPEC: default policy is open).
    admission: Callable[[str], bool] | None = None
    #: UNIX sockets: peer uids (SO_PEERCRED) accepted; None = only this process's uid.
    allowed_uids: frozenset[int] | None = None
    #: CA mode (TLS and QUIC): verify the peer's certificate chain against this CA;
    #: node certificate and key files (PEM). Without them a self-signed certificate
    #: is made at start and the channel binding secures the connection.
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: Announced in HELLO.
    listen_addrs: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()
    #: Where time comes from (tests skew it).
    clock: Clock = SYSTEM_CLOCK
    #: HELLO nonce replay cache; a listener makes its own when None.
    nonce_cache: NonceCache | None = None
    #: Test hook: rewrite this side's HELLO (forged HELLOs in the conformance tests).
    hello_hook: HelloHook | None = None

    def __post_init__(self) -> None:
        if self.max_frame_size < 1024:
            raise ConfigError("max_frame_size must be at least 1024")
        if self.send_queue_frames < 1 or self.send_queue_bytes < 1:
            raise ConfigError("send queue bounds must be positive")
        if self.recv_queue_frames < 1 or self.recv_budget_bytes < self.max_frame_size:
            raise ConfigError("recv_budget_bytes must be at least max_frame_size")
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("cert_file and key_file go together")


@dataclass(frozen=True)
class PeerInfo:
    """Who is on the other side, as the HELLO proved it."""

    agent_id: str
    transport: str  # 'quic' | 'tls' | 'unix'
    address: str  # URL of the remote end ("tls://127.0.0.1:4433", "unix:///run/x.sock")
    hello: Hello
    resumed: bool = False  # QUIC: the session was resumed (0-RTT possible)
    dialed: bool = True  # this side dialed the connection


@dataclass(frozen=True)
class Incoming:
    """One received frame after the session checks.

    ``message`` is set for a MESSAGE frame that verified; ``rejected`` for a
    well-formed one that failed a check (bad signature, invalid ``from``) — the
    connection goes on and the node layer counts and answers it. For FORWARD
    frames both are None (the node layer opens them).
    """

    frame: Frame
    message: Message | None = None
    rejected: MessageRejected | None = None


@dataclass(frozen=True)
class PeerGoaway:
    """The peer said GOAWAY."""

    code: int
    reason: str


class Connection(ABC):
    """One authenticated connection to one peer.

    ``send`` takes one encoded frame (``encode_frame`` / ``encode_message_frame``).
    ``recv`` returns the next MESSAGE or FORWARD frame; control frames are
    handled inside. After the connection closed, both raise the close error: a
    :class:`ConnectionClosed` carrying the close code and reason, or — for a
    handshake refusal that arrives after ``dial`` returned (UNIX, where the
    server's verdict on the client HELLO comes later) — the typed
    :class:`HandshakeError`.
    """

    peer: PeerInfo
    local_hello: Hello
    #: Pushed dictionaries of this connection (None on adapters without them).
    dicts: DictState | None = None

    @property
    def send_dictionary(self) -> Dictionary | None:
        """The dictionary this side pushed and the peer acknowledged: compress with it.
        None before the DICT_ACK (use the HELLO-negotiated one)."""
        d = self.dicts
        return d.send_dictionary if d is not None else None

    @abstractmethod
    async def send(self, frame: bytes) -> None:
        """Queue one frame. Waits while the send queue is full; frames queued in one
        event-loop turn are written together."""

    @abstractmethod
    async def recv(self) -> Incoming:
        """The next MESSAGE or FORWARD frame."""

    @abstractmethod
    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        """Flush queued frames, send GOAWAY, close. Idempotent."""

    @abstractmethod
    async def wait_closed(self) -> None:
        """Return once the connection is closed, for whatever reason."""

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True once closing has started."""

    @property
    @abstractmethod
    def close_error(self) -> IacError | None:
        """Why the connection closed (None while open)."""

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.peer.transport} {self.peer.agent_id[:16]}… {state}>"


class Listener(ABC):
    """Accepts connections; ``addresses`` are the URLs it is reachable at (ports resolved)."""

    addresses: list[str]

    @abstractmethod
    async def close(self) -> None:
        """Stop accepting and close every connection it accepted (GOAWAY GOING_AWAY)."""

    async def __aenter__(self) -> Listener:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


OnConnection = Callable[[Connection], Awaitable[None]]


# --- addresses ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Address:
    """A parsed transport URL: ``quic://host:port``, ``tls://host:port``, ``unix:///path``."""

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def url(self) -> str:
        if self.scheme == "unix":
            return f"unix://{self.path}"
        return f"{self.scheme}://{format_host(self.host)}:{self.port}"

    def __str__(self) -> str:
        return self.url


def format_host(host: str) -> str:
    """Brackets around an IPv6 literal."""
    return f"[{host}]" if ":" in host else host


def parse_address(url: str) -> Address:
    """Parse a transport URL; :class:`ConfigError` for anything else."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in TRANSPORTS:
        raise ConfigError(f"{url!r}: not a transport address (quic://h:p, tls://h:p, unix:///path)")
    if scheme == "unix":
        if not rest:
            raise ConfigError(f"{url!r}: a unix address needs a path")
        return Address("unix", path=rest)
    try:
        parts = urlsplit(url)
        host = parts.hostname
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{url!r}: {exc}") from None
    if not host or port is None:
        raise ConfigError(f"{url!r}: needs host and port")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{url!r}: only scheme://host:port")
    with contextlib.suppress(ValueError):
        host = str(ipaddress.ip_address(host))
    return Address(scheme, host=host, port=port)


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
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
) -> Hello:
    """Run the HELLO exchange; return the peer's verified HELLO.

    A check that fails here sends GOAWAY with the error's close code and reason
    and re-raises the error; a GOAWAY from the peer raises the typed error for
    its code (:func:`error_from_close`). The caller applies the timeout and
    closes the transport on any exception.
    """
    peer_error: IacError | None = None
    try:
        out = hs.initial(clock.now_us())
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


def hello_params(config: TransportConfig, session_id: int = 0) -> HelloParams:
    """What this side announces in its HELLO, from the config."""
    return HelloParams(
        session_id=session_id or secrets.randbits(64) or 1,
        dict_ids=tuple(config.dictionaries.ids()),
        max_frame_size=config.max_frame_size,
        listen_addrs=config.listen_addrs,
        capabilities=config.capabilities,
    )


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
    nonce_cache: NonceCache,
) -> ServerHandshake:
    """The accepting side's sans-IO handshake, set up from the config."""
    return ServerHandshake(
        identity,
        order,
        params=hello_params(config),
        binding=binding,
        max_skew_us=config.max_skew_us,
        hook=config.hello_hook,
        nonce_cache=nonce_cache,
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
    while len(cache) > _DICT_CACHE_SIZE:
        cache.popitem(last=False)


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
        """The DICT frame to send after the handshake, or None (disabled, no common
        dictionary, or the peer's max_frame_size is too small for it)."""
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
            except IacError:  # too large for the peer (FrameTooLarge) or for a dictionary (ConfigError)
                return None
            cached = (derived, frame)
            _cache_put(_push_cache, key, cached)
        self.pushed, frame = cached
        return frame

    def on_dict(self, body: bytes) -> None:
        """A DICT from the peer: check, install in ``decode``, answer DICT_ACK."""
        if not self.enabled:
            return
        try:
            msg = Dict.FromString(body)
        except Exception:
            raise BadDictionary("DICT body is not a Dict message") from None
        content = msg.content
        if len(content) > MAX_DICT_SIZE:
            raise BadDictionary(f"pushed dictionary is {len(content)} bytes, above {MAX_DICT_SIZE}")
        if hashlib.sha256(content).digest() != msg.sha256:
            raise BadDictionary("pushed dictionary does not match its sha256")
        known = self.decode.get(msg.dict_id)
        if known is None or known.sha256 != msg.sha256:
            if len(self.installed) >= MAX_PUSHED_DICTS:
                raise BadDictionary(f"more than {MAX_PUSHED_DICTS} dictionaries pushed on one connection")
            d: Dictionary | None = _cache_get(_install_cache, msg.sha256)
            if d is None:
                try:
                    d = Dictionary(content)
                except (ConfigError, zstandard.ZstdError) as exc:
                    raise BadDictionary(f"pushed dictionary refused: {exc}") from None
                _cache_put(_install_cache, msg.sha256, d)
            if d.dict_id != msg.dict_id:
                raise BadDictionary(f"DICT names id {msg.dict_id}, its content has id {d.dict_id}")
            try:
                self.decode.add(d)
            except ConfigError as exc:
                raise BadDictionary(str(exc)) from None
            self.installed.append(d)
        ack = Dict(dict_id=msg.dict_id, sha256=msg.sha256).SerializeToString()
        if self.send_control is not None:
            self.send_control(encode_frame(FrameType.DICT_ACK, ack))

    def on_ack(self, body: bytes) -> None:
        """A DICT_ACK: compress with the pushed dictionary from now on."""
        if not self.enabled:
            return
        try:
            msg = Dict.FromString(body)
        except Exception:
            raise BadDictionary("DICT_ACK body is not a Dict message") from None
        pushed = self.pushed
        if pushed is None or msg.dict_id != pushed.dict_id or msg.sha256 != pushed.sha256:
            raise BadDictionary(f"DICT_ACK for dictionary {msg.dict_id}, which this side did not push")
        self.send_dictionary = pushed
        self.acked.set()


class SessionLogic:
    """Judges frames on an established connection (sans-IO).

    * HELLO again → :class:`UnexpectedHello` (close).
    * MESSAGE → :func:`open_message`: a scan or parse fault raises (close); a bad
      signature or invalid ``from`` comes back as ``Incoming(rejected=...)`` and the
      connection goes on; a verified message whose ``from`` is not the HELLO peer
      raises :class:`Impersonation` (close).
    * FORWARD → delivered as is (the node layer opens it and applies relay policy).
    * GOAWAY → :class:`PeerGoaway`.
    * DICT / DICT_ACK → :class:`DictState` (install and acknowledge; switch to the
      pushed dictionary), None. A refused push raises :class:`BadDictionary` (close).
      Without a ``DictState`` (or with ``push_dictionaries`` off) both are ignored.
    * Unknown types and flags never get here: the frame decoder raises.
    """

    def __init__(self, peer_agent_id: str, dicts: DictState | None = None) -> None:
        self.peer_agent_id = peer_agent_id
        self.dicts = dicts
        self.messages = 0
        self.rejected = 0

    def on_frame(self, frame: Frame) -> Incoming | PeerGoaway | None:
        ftype = frame.type
        if ftype == FrameType.MESSAGE:
            try:
                msg = open_message(frame.body)
            except MessageRejected as exc:
                self.rejected += 1
                return Incoming(frame, None, exc)
            sender = sender_of(msg)
            if sender != self.peer_agent_id:
                raise Impersonation(
                    f"MESSAGE from {sender[:16]}… on a connection whose HELLO proved "
                    f"{self.peer_agent_id[:16]}… (other origins travel inside FORWARD)"
                )
            self.messages += 1
            return Incoming(frame, msg, None)
        if ftype == FrameType.FORWARD:
            return Incoming(frame)
        if ftype == FrameType.GOAWAY:
            return PeerGoaway(*decode_goaway(frame.body))
        if ftype == FrameType.HELLO:
            raise UnexpectedHello("a second HELLO on this connection")
        if self.dicts is not None:
            if ftype == FrameType.DICT:
                self.dicts.on_dict(frame.body)
            elif ftype == FrameType.DICT_ACK:
                self.dicts.on_ack(frame.body)
        return None


class EarlyFrames:
    """Frames that arrived before the HELLO verified (QUIC uni streams). Bounded."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._frames: list[Frame] = []

    def hold(self, frame: Frame) -> None:
        if len(self._frames) >= self.limit:
            raise BufferExceeded(f"more than {self.limit} frames arrived before the HELLO verified")
        self._frames.append(frame)

    def release(self) -> list[Frame]:
        out, self._frames = self._frames, []
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
    err = ConnectionClosed(f"connection closed: {exc.name}: {exc}", exc.close_code, str(exc))
    err.__cause__ = exc
    return err


# --- bounded queues -----------------------------------------------------------------------------


def _wake(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)


class SendQueue:
    """Frames waiting to be written. ``put`` waits while the queue is full (bytes or
    frames); one frame larger than the byte bound still goes through an empty queue.
    ``get_batch`` returns everything queued so far, so frames queued in one
    event-loop turn leave in one write."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._items: deque[bytes] = deque()
        self._bytes = 0
        self._error: IacError | None = None
        self._finished = False
        self._finish_error: IacError | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._getter: asyncio.Future[None] | None = None

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def _full(self, size: int) -> bool:
        return bool(self._items) and (
            len(self._items) >= self.max_frames or self._bytes + size > self.max_bytes
        )

    def offer(self, frame: bytes) -> bool:
        """Queue ``frame`` if that needs no wait; False when full (or closing: ``put`` raises)."""
        if self._error is not None or self._finished or self._full(len(frame)):
            return False
        self._items.append(frame)
        self._bytes += len(frame)
        return True

    async def put(self, frame: bytes) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if self._finished:
                raise self._finish_error or ConnectionClosed("connection is closing")
            if not self._full(len(frame)):
                break
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            await fut
        self.put_nowait(frame)

    def put_nowait(self, frame: bytes) -> None:
        """Queue regardless of the bound (GOAWAY, internal control frames)."""
        self._items.append(frame)
        self._bytes += len(frame)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)

    async def get_batch(self) -> list[bytes] | None:
        """Everything queued (waits for at least one frame); None once finished and empty."""
        while not self._items:
            if self._finished or self._error is not None:
                return None
            self._getter = asyncio.get_running_loop().create_future()
            await self._getter
            self._getter = None
        return self.take_all()

    def take_all(self) -> list[bytes]:
        """Everything queued now (maybe nothing), without waiting; wakes waiting ``put`` calls."""
        out = list(self._items)
        self._items.clear()
        self._bytes = 0
        if self._putters:
            _wake(self._putters)
        return out

    @property
    def done(self) -> bool:
        """Finished or failed, and nothing left to write."""
        return (self._finished or self._error is not None) and not self._items

    def finish(self, error: IacError | None = None) -> None:
        """No more frames: the writer drains what is queued, then stops. Later and
        waiting ``put`` calls raise ``error``."""
        self._finished = True
        self._finish_error = error
        _wake(self._putters)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)

    def fail(self, error: IacError) -> None:
        """Drop everything queued; waiting and later ``put`` calls raise ``error``."""
        self._error = error
        self._items.clear()
        self._bytes = 0
        _wake(self._putters)
        if self._getter is not None and not self._getter.done():
            self._getter.set_result(None)


class RecvQueue:
    """Frames waiting for ``recv()``. ``put`` waits while full (the adapter stops
    reading, which pushes back on the peer). After ``fail`` the queued frames are
    still handed out, then ``get`` raises the error."""

    def __init__(self, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._items: deque[Incoming] = deque()
        self._bytes = 0
        self._error: IacError | None = None
        self._putters: deque[asyncio.Future[None]] = deque()
        self._getters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def has_room(self, size: int) -> bool:
        """Whether a frame of ``size`` bytes fits now (an empty queue takes any frame)."""
        return not self._items or (
            len(self._items) < self.max_frames and self._bytes + size <= self.max_bytes
        )

    def put_nowait(self, item: Incoming) -> None:
        """Queue regardless of the bound (the caller checked :meth:`has_room`); dropped after ``fail``."""
        if self._error is not None:
            return
        self._items.append(item)
        self._bytes += item.frame.wire_size or len(item.frame.body)
        if self._getters:
            _wake(self._getters)

    async def put(self, item: Incoming) -> None:
        size = item.frame.wire_size or len(item.frame.body)
        while (
            self._error is None
            and self._items
            and (len(self._items) >= self.max_frames or self._bytes + size > self.max_bytes)
        ):
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            await fut
        if self._error is not None:
            return
        self._items.append(item)
        self._bytes += size
        _wake(self._getters)

    async def get(self) -> Incoming:
        while not self._items:
            if self._error is not None:
                raise self._error
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            await fut
        item = self._items.popleft()
        self._bytes -= item.frame.wire_size or len(item.frame.body)
        if self._putters:
            _wake(self._putters)
        return item

    def fail(self, error: IacError) -> None:
        if self._error is None:
            self._error = error
        _wake(self._putters)
        _wake(self._getters)


# --- one connection per peer pair ---------------------------------------------------------------


class ConnectionTable:
    """One connection per peer. When two nodes dial each other at once, both end up
    with two connections; each side keeps the one dialed by the lower AgentId and
    closes the other (GOAWAY GOING_AWAY), so both keep the same one."""

    def __init__(self, local_agent_id: str) -> None:
        self.local_agent_id = local_agent_id
        self._by_peer: dict[str, Connection] = {}

    def get(self, agent_id: str) -> Connection | None:
        conn = self._by_peer.get(agent_id)
        if conn is not None and conn.closed:
            del self._by_peer[agent_id]
            return None
        return conn

    def _dialer_of(self, conn: Connection) -> str:
        return self.local_agent_id if conn.peer.dialed else conn.peer.agent_id

    def add(self, conn: Connection) -> tuple[Connection, Connection | None]:
        """Register ``conn``; return ``(kept, to_close)``. The caller closes ``to_close``."""
        old = self.get(conn.peer.agent_id)
        if old is None or old is conn:
            self._by_peer[conn.peer.agent_id] = conn
            return conn, None
        lower = min(self.local_agent_id, conn.peer.agent_id)
        old_ok = self._dialer_of(old) == lower
        new_ok = self._dialer_of(conn) == lower
        if new_ok and not old_ok:
            self._by_peer[conn.peer.agent_id] = conn
            return conn, old
        return old, conn

    def remove(self, conn: Connection) -> None:
        if self._by_peer.get(conn.peer.agent_id) is conn:
            del self._by_peer[conn.peer.agent_id]

    def __len__(self) -> int:
        return len(self._by_peer)

    def connections(self) -> list[Connection]:
        return [c for c in self._by_peer.values() if not c.closed]


__all__ = [
    "MAX_PUSHED_DICTS",
    "TRANSPORTS",
    "Address",
    "Connection",
    "ConnectionTable",
    "DictState",
    "EarlyFrames",
    "HandshakeChannel",
    "Incoming",
    "Listener",
    "OnConnection",
    "PeerGoaway",
    "PeerInfo",
    "RecvQueue",
    "SendQueue",
    "SessionLogic",
    "TransportConfig",
    "TransportError",
    "client_handshake",
    "format_host",
    "goaway_frame",
    "hello_params",
    "local_protocol_error",
    "parse_address",
    "peer_closed_error",
    "perform_handshake",
    "server_handshake",
]
