"""The QUIC adapter (aioquic 1.7, or qh3 2.x: see :mod:`._quic_backend`).

Mapping (SPEC section 4):

* ALPN ``iac/1``; a self-signed certificate per node (or the configured one).
  The client does not verify it against a CA; the HELLO's channel binding
  (SHA-256 of the certificate DER) ties the HELLOs to this very TLS session.
* The client opens bidirectional stream 0, the *control stream*, and sends
  HELLO; the server answers HELLO on it. GOAWAY travels on it as well.
* Every message goes on a new unidirectional stream. Frames queued in the same
  event-loop turn leave with one ``transmit()``; small ones share a stream
  (up to :data:`SHARE_LIMIT` bytes per stream). A stream is opened only when
  the peer's stream credit allows it; frames wait in this adapter's bounded
  queue otherwise (aioquic's own queue of blocked streams is scanned on every
  packet build, so it is never used). ``send()`` waits while the queue is full.
* Flushing: after a received datagram the flush is deferred to the end of the loop
  turn (``_transmit_soon``), so a reply that the woken ``recv()`` caller sends leaves
  in the same packet as the ACK; a packet that carries frames also carries any pending
  ACK (aioquic would otherwise hold it for its 1 ms ack delay and send it alone).
* Received stream data is handled as raw QUIC events (the stock protocol keeps
  a reader per stream forever): one :class:`FrameDecoder` per open stream, and
  the bytes of partly received frames plus frames waiting for ``recv()`` stay
  within ``recv_budget_bytes`` (else :class:`BufferExceeded` closes the
  connection). Frames that overtake the HELLO are held (``early_frames_limit``)
  until it verifies.
* Refusals close the connection with the :class:`CloseCode` as QUIC
  application error code and the reason as reason phrase; the dialing side
  raises the typed error (:func:`iac.protocol.handshake.error_from_close`).
* Keep-alive: a QUIC PING every ``keepalive_interval``; QUIC's own idle timer
  (three keep-alive intervals) notices a dead peer; ``idle_timeout`` closes a
  connection on which no frame moved (IDLE_TIMEOUT).
* 0-RTT: a client given a :class:`ClientTicketStore` resumes with the ticket it
  got from the same address, binds its HELLO to the certificate hash stored
  with the ticket and sends HELLO and its first frames as early data; ``dial``
  returns at once and the server's HELLO is checked in the background. Servers
  make tickets single-use (:class:`ServerTicketStore`).
* Backends: the QUIC library is chosen per listener and per dial (``backend=``,
  else :func:`set_backend`, ``IAC_QUIC_BACKEND``, the automatic choice); the
  library-specific internals live in :mod:`._quic_backend`. The two interoperate.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from iac.errors import (
    BufferExceeded,
    CloseCode,
    ConfigError,
    ConnectionClosed,
    HandshakeError,
    IacError,
    ProtocolError,
    TransportError,
    UnexpectedHello,
)
from iac.protocol.handshake import (
    ALPN,
    ClientHandshake,
    HelloOrder,
    HelloParams,
    NonceCache,
    ServerHandshake,
    channel_binding,
    error_from_close,
)
from iac.transport.base import (
    Address,
    Connection,
    Incoming,
    Listener,
    OnConnection,
    PeerInfo,
    TransportConfig,
    parse_address,
)
from iac.transport.certs import node_certificate
from iac.transport.queues import RecvQueue, SendQueue
from iac.transport.quic.backend import Backend, SessionTicketLike, get_backend, set_backend
from iac.transport.quic.tickets import ClientTicketStore, ServerTicketStore
from iac.transport.session import (
    DictState,
    EarlyFrames,
    HandshakeChannel,
    PeerGoaway,
    SessionLogic,
    goaway_frame,
    local_protocol_error,
    peer_closed_error,
    perform_handshake,
)
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.dicts import Dictionary
from iac.wire.frames import Frame, FrameDecoder, FrameType, encode_frame
from iac.wire.identity import Identity

#: Frames smaller than this share a stream with the other frames queued in the same turn.
SHARE_LIMIT = 1024
#: The control stream (client-initiated, bidirectional).
CONTROL_STREAM = 0
#: QUIC's own idle timeout when ``idle_timeout`` is None (keep-alive still detects a dead peer).
_NO_IDLE = 365 * 86400.0


@dataclass
class QuicStats:
    """Counters of one QUIC connection (tests and benchmarks read them)."""

    frames_sent: int = 0
    frames_received: int = 0
    streams_opened: int = 0
    credit_stalls: int = 0  # pumps that stopped for lack of stream credit
    transmits: int = 0
    max_blocked_streams: int = 0  # the library's internal queue of blocked streams (must stay 0)
    early_frames: int = 0


# --- certificates -------------------------------------------------------------------------------


def _load_certificate(
    identity: Identity, config: TransportConfig, backend: Backend
) -> tuple[Any, Any, list[Any], bytes]:
    """``(certificate, private_key, chain, certificate DER)`` for the backend: the
    configured files, else the node's self-signed certificate (the binding makes it safe)."""
    node = node_certificate(identity.agent_id, config.cert_file, config.key_file)
    chain_pem = node.chain_pem or node.cert_pem
    der = x509.load_pem_x509_certificates(chain_pem)[0].public_bytes(serialization.Encoding.DER)
    cert, key, chain = backend.load_certificates(chain_pem, node.key_pem)
    return cert, key, chain, der


# --- the asyncio protocol -----------------------------------------------------------------------


class _ProtocolMixin(asyncio.DatagramProtocol):
    """The library's asyncio protocol, reduced to raw events handed to one :class:`QuicConn`.
    Mixed into each backend's ``QuicConnectionProtocol`` by :func:`_protocol_class`."""

    conn: QuicConn | None = None
    backend: Backend
    _quic: Any
    _loop: asyncio.AbstractEventLoop
    _transmit_task: asyncio.Handle | None
    _transport: asyncio.DatagramTransport | None

    if TYPE_CHECKING:  # provided by the library's QuicConnectionProtocol

        def __init__(self, quic: Any) -> None: ...
        def _process_events(self) -> None: ...
        def _transmit_soon(self) -> None: ...
        def connect(self, addr: Any) -> None: ...
        async def wait_connected(self) -> None: ...

    def quic_event_received(self, event: Any) -> None:
        if self.conn is not None:
            self.conn._on_event(event)

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        # As aioquic's, but the flush waits for the end of this loop turn: the tasks this
        # datagram woke (a recv() waiter) run first, so a reply they send leaves in the same
        # packet as the ACK instead of a packet of its own right after an ACK-less one.
        self._quic.receive_datagram(cast(bytes, data), addr, now=self._loop.time())
        self._process_events()
        self._transmit_soon()

    def datagrams_received(self, data: list[bytes], addr: Any) -> None:
        # qh3's batched receive path (its GRO transport; unused with asyncio's own), same rule.
        self._quic.receive_many_datagrams(data, addr, now=self._loop.time())
        self._process_events()
        self._transmit_soon()

    def transmit(self) -> None:
        handle = self._transmit_task
        if handle is not None:  # a direct flush makes the scheduled one redundant
            handle.cancel()
        conn = self.conn
        if conn is not None:
            if conn._pump():
                self.backend.ack_now(self._quic, self._loop.time())
            conn._stream_credit()
            conn.stats.transmits += 1
        super().transmit()  # type: ignore[misc]  # the library's QuicConnectionProtocol
        if conn is not None and conn._drain_waiters:
            conn._after_transmit()

    def error_received(self, exc: Exception) -> None:
        if self.conn is not None and isinstance(exc, OSError):
            self.conn._on_socket_error(exc)


_protocol_classes: dict[str, type[_ProtocolMixin]] = {}


def _protocol_class(backend: Backend) -> type[_ProtocolMixin]:
    """The backend's ``QuicConnectionProtocol`` with :class:`_ProtocolMixin` on top."""
    cls = _protocol_classes.get(backend.name)
    if cls is None:
        cls = type(
            f"_{backend.name}Protocol",
            (_ProtocolMixin, backend.QuicConnectionProtocol),
            {"backend": backend, "__module__": __name__},
        )
        _protocol_classes[backend.name] = cls
    return cls


_Protocol = _ProtocolMixin


def _server_protocol_factory(listener: QuicListener) -> Callable[..., _Protocol]:
    protocol = _protocol_class(listener.backend)

    def create(quic: Any, stream_handler: Any = None) -> _Protocol:
        proto = protocol(quic)
        proto.conn = QuicConn(proto, listener.identity, listener.config, dialed=False, listener=listener)
        return proto

    return create


class _ControlChannel(HandshakeChannel):
    def __init__(self, conn: QuicConn) -> None:
        self.conn = conn

    async def send_frame(self, frame: bytes) -> None:
        self.conn._send_control(frame)

    async def read_frame(self) -> Frame:
        return await self.conn._read_control()


# --- one connection -----------------------------------------------------------------------------


class QuicConn(Connection):
    """One IAC connection over one QUIC connection."""

    def __init__(
        self,
        proto: _Protocol,
        identity: Identity,
        config: TransportConfig,
        *,
        dialed: bool,
        listener: QuicListener | None = None,
        address: str = "",
    ) -> None:
        self._proto = proto
        self.backend = proto.backend
        self._quic: Any = proto._quic
        self._loop = asyncio.get_running_loop()
        self.identity = identity
        self.config = config
        self.dialed = dialed
        self.listener = listener
        self.address = address
        self.stats = QuicStats()
        # send side
        self._queue = SendQueue(config.send_queue_frames, config.send_queue_bytes)
        self._drain_waiters: list[asyncio.Future[None]] = []
        # receive side: the queue is bounded by withholding stream credit (``_recv_full``)
        self._decoders: dict[int, FrameDecoder] = {}
        self._partial = 0  # bytes held by the decoders
        self._ready = RecvQueue(config.recv_queue_frames, config.recv_budget_bytes)
        self._recv_full = False  # recv() is behind: new stream credit is withheld
        self._withheld = 0
        self._ctl_frames: deque[Frame] = deque()
        self._ctl_waiter: asyncio.Future[None] | None = None
        self._control = _ControlChannel(self)  # the HELLO exchange's view of the control stream
        self._early = EarlyFrames(config.early_frames_limit)
        self._session: SessionLogic | None = None
        self.dicts: DictState = DictState(config, self._send_control_soon)  # this connection's dictionaries
        # state
        self._error: IacError | None = None
        self._closing = False
        self._terminated = asyncio.Event()
        self._handshake_task: asyncio.Task[None] | None = None
        self._keepalive: asyncio.TimerHandle | None = None
        self._next_ping = 0.0
        self._last_activity = self._loop.time()
        self._ticket: SessionTicketLike | None = None
        self._cert_sha256 = b""
        self._ticket_store: ClientTicketStore | None = None
        self._ticket_key = ""
        self.peer_hello_verified = False
        self.early_data = False
        if listener is not None:
            self._cert_sha256 = listener.cert_sha256
            self._handshake_task = self._loop.create_task(self._server_handshake())

    # -- Connection API -------------------------------------------------------------------------

    async def send(self, frame: bytes) -> None:
        if self._error is not None:
            raise self._error
        if self._closing:
            raise ConnectionClosed("connection is closing")
        queue = self._queue
        if not queue.offer(frame):
            await queue.put(frame)  # waits for room; raises once the connection closes
        self._last_activity = self._loop.time()
        self._proto._transmit_soon()

    async def recv(self) -> Incoming:
        item = await self._ready.get()
        if self._recv_full and len(self._ready) <= self.config.recv_queue_frames // 2:
            self._recv_full = False
            self._proto._transmit_soon()  # grant the withheld stream credit
        return item

    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        if self._closing or self._terminated.is_set():
            await self.wait_closed()
            return
        self._closing = True
        self._queue.finish()  # no more frames: a waiting send() raises
        linger = self.config.linger_timeout
        if self._error is None and self.peer_hello_verified:
            # Flush: everything queued reaches the peer (bounded by linger_timeout).
            fut = self._loop.create_future()
            self._drain_waiters.append(fut)
            self._proto.transmit()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(fut, linger)
        if self._error is None:
            self._error = ConnectionClosed(
                f"connection closed by this side{': ' + reason if reason else ''}", int(code), reason
            )
        self._abort(int(code), reason, goaway=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._terminated.wait(), linger)
        self._finish()

    async def wait_closed(self) -> None:
        await self._terminated.wait()

    @property
    def send_dictionary(self) -> Dictionary | None:
        return self.dicts.send_dictionary

    @property
    def closed(self) -> bool:
        return self._closing or self._terminated.is_set() or self._error is not None

    @property
    def close_error(self) -> IacError | None:
        return self._error

    # -- send machinery -------------------------------------------------------------------------

    def _pump(self) -> bool:
        """Move queued frames into new uni streams while the peer's stream credit lasts;
        True if any moved."""
        queue = self._queue
        if not len(queue):
            return False
        quic = self._quic
        if not self.peer_hello_verified and not self.early_data:
            return False
        sent = 0
        credit = self.backend.remote_max_streams_uni(quic)
        while len(queue):
            stream_id = quic._local_next_stream_id_uni
            if stream_id // 4 >= credit:
                self.stats.credit_stalls += 1
                break
            parts = queue.take_shared(SHARE_LIMIT)  # wakes a send() waiting for room
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            quic.send_stream_data(stream_id, data, end_stream=True)
            sent += len(parts)
            self.stats.streams_opened += 1
        self.stats.frames_sent += sent
        blocked = self.backend.blocked_streams_uni(quic)
        if blocked > self.stats.max_blocked_streams:
            self.stats.max_blocked_streams = blocked
        return sent > 0

    def _stream_credit(self) -> None:
        """Receive-side backpressure: while ``recv()`` is behind, grant the peer no new
        unidirectional streams (the library would return one per finished stream).
        Not on a backend without ``credit_control`` (qh3)."""
        if self._recv_full or self._withheld:
            self._withheld = self.backend.withhold_credit(self._quic, self._recv_full, self._withheld)

    def _after_transmit(self) -> None:
        if self._drain_waiters and self._drained():
            waiters, self._drain_waiters = self._drain_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _drained(self) -> bool:
        if len(self._queue):
            return False
        return self.backend.uni_streams_finished(self._quic, self.dialed)

    def _send_control(self, frame: bytes) -> None:
        if self._terminated.is_set():
            raise self._error or ConnectionClosed("connection closed")
        self._quic.send_stream_data(CONTROL_STREAM, frame)
        self._proto.transmit()

    def _send_control_soon(self, frame: bytes) -> None:
        """A control frame (DICT, DICT_ACK) after the handshake: leaves with the next transmit."""
        if self._terminated.is_set() or self._closing:
            return
        self._quic.send_stream_data(CONTROL_STREAM, frame)
        self._proto._transmit_soon()

    # -- receive machinery ----------------------------------------------------------------------

    def _on_event(self, event: Any) -> None:
        events = self.backend.events
        try:
            if isinstance(event, events.StreamDataReceived):
                self._on_stream_data(event)
            elif isinstance(event, events.StreamReset):
                dec = self._decoders.pop(event.stream_id, None)
                if dec is not None:
                    self._partial -= dec.buffered
            elif isinstance(event, events.ConnectionTerminated):
                self._on_terminated(event)
            elif isinstance(event, events.HandshakeCompleted):
                self._on_tls_done(event)
        except ProtocolError as exc:
            self._protocol_error(exc)

    def _on_stream_data(self, event: Any) -> None:
        if self._terminated.is_set() or self._error is not None:
            return
        sid = event.stream_id
        unidirectional = bool(sid & 2)
        if not unidirectional and sid != CONTROL_STREAM:
            raise ProtocolError(f"unexpected bidirectional stream {sid} (only the control stream is used)")
        dec = self._decoders.get(sid)
        if dec is None:
            if not event.data and event.end_stream:
                return
            dec = self._decoders[sid] = FrameDecoder(
                dictionaries=self.dicts.decode, max_frame_size=self.config.max_frame_size
            )
        before = dec.buffered
        frames = dec.feed(event.data, final=event.end_stream and unidirectional)
        self._partial += dec.buffered - before
        if event.end_stream:
            self._decoders.pop(sid, None)
            self._partial -= dec.buffered
        if self._partial + self._ready.nbytes > self.config.recv_budget_bytes:
            raise BufferExceeded(
                "partly received and unread frames exceed recv_budget_bytes "
                f"({self.config.recv_budget_bytes})"
            )
        if not frames:
            return
        self._last_activity = self._loop.time()
        if not unidirectional:
            for frame in frames:
                self._on_control_frame(frame)
            return
        self.stats.frames_received += len(frames)
        if self._session is None:
            for frame in frames:
                if frame.type == FrameType.HELLO:
                    raise UnexpectedHello("HELLO on a unidirectional stream")
                self._early.hold(frame)
            self.stats.early_frames += len(frames)
            return
        for frame in frames:
            self._deliver(frame)

    def _on_control_frame(self, frame: Frame) -> None:
        if self._session is None:
            self._ctl_frames.append(frame)
            if self._ctl_waiter is not None and not self._ctl_waiter.done():
                self._ctl_waiter.set_result(None)
            return
        self._deliver(frame)

    def _deliver(self, frame: Frame) -> None:
        assert self._session is not None
        result = self._session.on_frame(frame)
        if result is None:
            return
        if isinstance(result, PeerGoaway):
            if self._error is None:
                self._error = peer_closed_error(result.code, result.reason)
            self._closing = True
            self._wake_all()
            return
        self._ready.put_nowait(result)  # wakes recv()
        if len(self._ready) >= self.config.recv_queue_frames:
            self._recv_full = True

    async def _read_control(self) -> Frame:
        while not self._ctl_frames:
            if self._error is not None:
                raise self._error
            if self._terminated.is_set():
                raise ConnectionClosed("connection closed during the handshake")
            self._ctl_waiter = self._loop.create_future()
            await self._ctl_waiter
            self._ctl_waiter = None
        return self._ctl_frames.popleft()

    async def _exchange_hellos(
        self, hs: ClientHandshake | ServerHandshake, deadline: float, *, initial_sent: bool = False
    ) -> Hello:
        """The HELLO exchange on the control stream, for both roles (``initial_sent``: the
        client's HELLO already went as 0-RTT data); returns the peer's verified HELLO.
        Raises what :func:`perform_handshake` raises, or TimeoutError at ``deadline``."""
        async with asyncio.timeout_at(deadline):
            return await perform_handshake(
                hs,
                self._control,
                clock=self.config.clock,
                max_frame_size=self.config.max_frame_size,
                initial_sent=initial_sent,
            )

    def _hello_verified(
        self, hs: ClientHandshake | ServerHandshake, hello: Hello, *, resumed: bool | None = None
    ) -> None:
        """The peer's HELLO verified (either role, 1-RTT or 0-RTT): record both HELLOs and
        the peer, process what arrived early, open the send path. ``resumed``: None reads
        it from the TLS session."""
        self.local_hello = parse_hello(hs.sent_bytes)
        self.peer = PeerInfo(
            agent_id=hello.agent_id,
            transport="quic",
            address=self.address,
            hello=hello,
            resumed=bool(self._quic.tls.session_resumed) if resumed is None else resumed,
            dialed=self.dialed,
        )
        self._session = SessionLogic(hello.agent_id, self.dicts)
        self.peer_hello_verified = True
        push = self.dicts.push_frame(self.identity.agent_id, hello)
        if push is not None:
            self._send_control_soon(push)  # on the control stream, behind our HELLO
        try:
            for frame in self._ctl_frames:
                self._deliver(frame)
            for frame in self._early.release():
                self._deliver(frame)
        except ProtocolError as exc:
            self._protocol_error(exc)
        self._ctl_frames.clear()
        if len(self._queue):
            self._proto._transmit_soon()

    # -- TLS and termination --------------------------------------------------------------------

    def _on_tls_done(self, event: Any) -> None:
        if event.alpn_protocol != ALPN:
            raise HandshakeError(f"peer negotiated ALPN {event.alpn_protocol!r}, not {ALPN!r}")
        self._schedule_keepalive()

    def _on_terminated(self, event: Any) -> None:
        if self._error is None:
            if event.frame_type is None:
                # An application close from the peer: code and reason are IAC's.
                if self._session is None:
                    self._error = error_from_close(
                        event.error_code, event.reason_phrase, during_handshake=True
                    )
                else:
                    self._error = peer_closed_error(event.error_code, event.reason_phrase)
            elif event.reason_phrase == "Idle timeout":
                self._error = ConnectionClosed("no answer from the peer (QUIC idle timeout)")
            else:
                self._error = ConnectionClosed(
                    f"QUIC transport error 0x{event.error_code:x}: {event.reason_phrase}"
                )
        self._terminated.set()
        self._finish()

    def _on_socket_error(self, exc: OSError) -> None:
        if self._error is None and not self.peer_hello_verified:
            self._error = TransportError(f"QUIC connect to {self.address} failed: {exc.strerror or exc}")
            self._abort(int(CloseCode.NO_ERROR), "socket error", goaway=False)
            self._terminated.set()
            self._finish()

    def _protocol_error(self, exc: ProtocolError, *, goaway: bool = True) -> None:
        if self._error is None:
            self._error = local_protocol_error(exc)
        self._abort(int(exc.close_code), str(exc)[:200], goaway=goaway)

    def _abort(self, code: int, reason: str, *, goaway: bool) -> None:
        """Close the QUIC connection now with ``code`` (an IAC close code)."""
        self._closing = True
        if self._terminated.is_set():
            return
        if goaway and not self.backend.is_closing(self._quic):
            with contextlib.suppress(Exception):  # best effort: the close frame carries the code anyway
                self._quic.send_stream_data(CONTROL_STREAM, goaway_frame(code, reason))
                self._proto.transmit()
        self._quic.close(error_code=code, reason_phrase=reason)
        self._proto.transmit()
        self._wake_all()

    def _wake_all(self) -> None:
        """The connection is closing: waiting ``send``/``recv`` calls raise the close error
        (``recv`` once it handed out what arrived before)."""
        error = self._error
        if error is not None:
            self._ready.fail(error)
        self._queue.finish(error)
        if self._ctl_waiter is not None and not self._ctl_waiter.done():
            self._ctl_waiter.set_result(None)
        for fut in self._drain_waiters:
            if not fut.done():
                fut.set_result(None)
        self._drain_waiters.clear()

    def _finish(self) -> None:
        """Release everything once the connection is over."""
        if self._error is None:
            self._error = ConnectionClosed("connection closed")
        self._closing = True
        self._queue.fail(self._error)  # drop what was not sent
        self._decoders.clear()
        self._partial = 0
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        self._wake_all()
        if self.listener is not None:
            self.listener._forget(self)
        if self.dialed and self._terminated.is_set():
            transport = self._proto._transport
            if transport is not None:
                transport.close()

    # -- keep-alive and idle --------------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        """Arm the one timer for the next PING or the idle deadline, whichever is first."""
        if self._keepalive is not None or self._terminated.is_set():
            return
        now = self._loop.time()
        if self._next_ping == 0.0:
            self._next_ping = now + self.config.keepalive_interval
        at = self._next_ping
        idle = self.config.idle_timeout
        if idle is not None:
            at = min(at, self._last_activity + idle)
        self._keepalive = self._loop.call_at(at, self._tick)

    def _tick(self) -> None:
        self._keepalive = None
        if self._terminated.is_set() or self._closing:
            return
        now = self._loop.time()
        idle = self.config.idle_timeout
        if idle is not None and now - self._last_activity >= idle:
            if self._error is None:
                self._error = ConnectionClosed(
                    f"connection idle for {idle:g} s", int(CloseCode.IDLE_TIMEOUT), "idle"
                )
            self._abort(int(CloseCode.IDLE_TIMEOUT), "idle", goaway=True)
            return
        if now >= self._next_ping:
            self._quic.send_ping(0)
            self._proto.transmit()
            self._next_ping = now + self.config.keepalive_interval
        self._schedule_keepalive()

    # -- handshakes -----------------------------------------------------------------------------

    def _params(self) -> HelloParams:
        return HelloParams(
            session_id=0,
            dict_ids=tuple(self.config.dictionaries.ids()),
            max_frame_size=self.config.max_frame_size,
            listen_addrs=self.config.listen_addrs,
            capabilities=self.config.capabilities,
        )

    async def _server_handshake(self) -> None:
        listener = self.listener
        assert listener is not None
        hs = ServerHandshake(
            self.identity,
            HelloOrder.CLIENT_FIRST,
            params=self._params(),
            binding=channel_binding(listener.cert_der),
            max_skew_us=self.config.max_skew_us,
            hook=self.config.hello_hook,
            nonce_cache=listener.nonce_cache,
            admission=self.config.admission,
        )
        try:
            hello = await self._exchange_hellos(hs, self._loop.time() + self.config.handshake_timeout)
        except ProtocolError as exc:
            # perform_handshake sent GOAWAY; the QUIC close carries the code as well.
            listener.refused[exc.name] = listener.refused.get(exc.name, 0) + 1
            self._protocol_error(exc)
            return
        except TimeoutError:
            self._error = ConnectionClosed("HELLO did not arrive in time", int(CloseCode.HANDSHAKE_FAILED))
            self._abort(int(CloseCode.HANDSHAKE_FAILED), "HELLO timeout", goaway=True)
            return
        except IacError:
            self._abort(int(CloseCode.HANDSHAKE_FAILED), "handshake failed", goaway=False)
            return
        self._hello_verified(hs, hello)
        listener._accepted(self)

    def _on_ticket(self, ticket: SessionTicketLike) -> None:
        self._ticket = ticket
        self._store_ticket()

    def _store_ticket(self) -> None:
        if self._ticket is None or self._ticket_store is None or not self.peer_hello_verified:
            return
        self._ticket_store.put(self._ticket_key, self._ticket, self._cert_sha256, self.peer.agent_id)
        self._ticket = None


def parse_hello(data: bytes | None) -> Hello:
    """A HELLO this side sent, parsed (empty if a test hook sent bytes that do not parse)."""
    try:
        return Hello.FromString(data or b"")
    except Exception:
        return Hello()


# --- dialing ------------------------------------------------------------------------------------


def _client_configuration(config: TransportConfig, host: str, backend: Backend) -> Any:
    qc = backend.QuicConfiguration(
        is_client=True,
        alpn_protocols=[ALPN],
        idle_timeout=_transport_idle(config),
        # CA mode verifies the chain, not a host name (as on TLS/TCP): the HELLO proves the
        # AgentId, and node certificates name nodes, not the addresses they listen on.
        server_name=None if config.ca_file is not None else host,
    )
    if config.ca_file is not None:
        qc.verify_mode = ssl.CERT_REQUIRED
        qc.load_verify_locations(cafile=config.ca_file)
    else:
        qc.verify_mode = ssl.CERT_NONE
    return qc


def _transport_idle(config: TransportConfig) -> float:
    """QUIC's own idle timer notices a dead peer: three keep-alive intervals without an
    answer. (``idle_timeout``, no frame moving, is IAC's and closes with IDLE_TIMEOUT.)"""
    return min(3 * config.keepalive_interval, _NO_IDLE)


async def dial_quic(
    url: str | Address,
    identity: Identity,
    *,
    expect: str | None = None,
    config: TransportConfig | None = None,
    tickets: ClientTicketStore | None = None,
    session_id: int = 0,
    backend: str | None = None,
) -> QuicConn:
    """Dial ``quic://host:port``; return the connection once the HELLOs verified.

    With ``tickets`` and a stored ticket for this address (from a server whose
    HELLO verified earlier, and whose AgentId is ``expect`` when given), the
    session resumes: HELLO and the frames sent right after ``dial`` returns go
    as 0-RTT early data, and the server's HELLO is checked in the background
    (a refusal closes the connection; ``send``/``recv`` then raise it).

    ``backend``: the QUIC library (``"aioquic"`` or ``"qh3"``); default: the selected
    one (:func:`set_backend`, ``IAC_QUIC_BACKEND``, else automatic).
    """
    config = config or TransportConfig()
    addr = url if isinstance(url, Address) else parse_address(url)
    if addr.scheme != "quic":
        raise ConfigError(f"{url!r} is not a quic:// address")
    lib = get_backend(backend)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(config.handshake_timeout):
            infos = await loop.getaddrinfo(addr.host, addr.port, type=socket.SOCK_DGRAM)
    except (OSError, TimeoutError) as exc:
        raise TransportError(f"{url}: cannot resolve {addr.host}: {exc}") from None
    family, _, _, _, sockaddr = infos[0]
    qc = _client_configuration(config, addr.host, lib)
    stored = tickets.pop(addr.url) if tickets is not None else None
    if stored is not None and expect is not None and stored.agent_id != expect:
        stored = None
    if stored is not None:
        qc.session_ticket = stored.ticket

    holder: list[QuicConn] = []

    def on_ticket(ticket: SessionTicketLike) -> None:
        if holder:
            holder[0]._on_ticket(ticket)

    quic = lib.QuicConnection(
        configuration=qc, session_ticket_handler=on_ticket if tickets is not None else None
    )
    protocol = _protocol_class(lib)
    try:
        _, proto = await loop.create_datagram_endpoint(
            lambda: protocol(quic), remote_addr=cast(tuple[str, int], sockaddr), family=family
        )
    except OSError as exc:
        raise TransportError(f"{url}: {exc.strerror or exc}") from None
    conn = QuicConn(proto, identity, config, dialed=True, address=addr.url)
    proto.conn = conn
    holder.append(conn)
    conn._ticket_store = tickets
    conn._ticket_key = addr.url
    try:
        return await _dial_handshake(
            conn,
            proto,
            sockaddr,
            expect,
            stored.cert_sha256 if stored else None,
            stored.agent_id if stored else "",
            session_id,
        )
    except BaseException:
        if not conn._terminated.is_set():
            conn._abort(int(CloseCode.NO_ERROR), "dial failed", goaway=False)
            conn._terminated.set()
            conn._finish()
        if proto._transport is not None:
            proto._transport.close()
        raise


async def _dial_handshake(
    conn: QuicConn,
    proto: _Protocol,
    sockaddr: Any,
    expect: str | None,
    resumed_cert: bytes | None,
    resumed_agent: str,
    session_id: int,
) -> QuicConn:
    config = conn.config
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.handshake_timeout
    proto.connect(sockaddr)
    params = conn._params()
    if session_id:
        params = HelloParams(
            session_id=session_id,
            dict_ids=params.dict_ids,
            max_frame_size=params.max_frame_size,
            listen_addrs=params.listen_addrs,
            capabilities=params.capabilities,
        )
    early = resumed_cert is not None and conn.backend.zero_rtt_ready(conn._quic)
    if early and resumed_cert is not None:
        conn._cert_sha256 = resumed_cert
    else:
        try:
            async with asyncio.timeout_at(deadline):
                await _wait_tls(conn, proto)
        except TimeoutError:
            raise TransportError(f"{conn.address}: QUIC handshake timed out") from None
        der = conn.backend.peer_certificate_der(conn._quic)
        if der is None:
            if resumed_cert is None:
                raise HandshakeError("server sent no certificate")
            conn._cert_sha256 = resumed_cert
        else:
            conn._cert_sha256 = channel_binding(der)
    hs = ClientHandshake(
        conn.identity,
        HelloOrder.CLIENT_FIRST,
        params=params,
        binding=conn._cert_sha256,
        max_skew_us=config.max_skew_us,
        hook=config.hello_hook,
        expect=expect,
    )
    if early:
        # 0-RTT: the HELLO goes now; frames sent from here on ride as early data.
        conn.early_data = True
        first = hs.initial(config.clock.now_us())
        if first is None:  # pragma: no cover - CLIENT_FIRST always has a first HELLO
            raise HandshakeError("no client HELLO")
        conn._send_control(encode_frame(FrameType.HELLO, first, max_frame_size=1 << 30))
        conn.local_hello = parse_hello(first)
        conn.peer = PeerInfo(
            agent_id=expect or resumed_agent,
            transport="quic",
            address=conn.address,
            hello=Hello(),
            resumed=True,
            dialed=True,
        )
        conn._handshake_task = loop.create_task(_finish_early(conn, hs, deadline))
        return conn
    try:
        hello = await conn._exchange_hellos(hs, deadline)
    except TimeoutError:
        raise TransportError(f"{conn.address}: HELLO exchange timed out") from None
    except ProtocolError as exc:
        conn._protocol_error(exc)
        raise
    conn._hello_verified(hs, hello)
    if conn._error is not None:  # a frame that came with the HELLO closed the connection
        raise conn._error
    conn._store_ticket()
    return conn


async def _finish_early(conn: QuicConn, hs: ClientHandshake, deadline: float) -> None:
    """The rest of a 0-RTT handshake: read and check the server's HELLO."""
    try:
        hello = await conn._exchange_hellos(hs, deadline, initial_sent=True)
    except ProtocolError as exc:
        # A refusal of ours went out as GOAWAY already; a refusal of the server's is answered.
        conn._protocol_error(exc, goaway=not conn._control.goaway_sent)
        return
    except TimeoutError:
        conn._error = TransportError(f"{conn.address}: HELLO exchange timed out")
        conn._abort(int(CloseCode.HANDSHAKE_FAILED), "HELLO timeout", goaway=True)
        return
    except IacError as exc:
        if conn._error is None:
            conn._error = exc
        conn._abort(int(CloseCode.HANDSHAKE_FAILED), str(exc)[:200], goaway=False)
        return
    if conn.peer.agent_id and hello.agent_id != conn.peer.agent_id:
        conn._protocol_error(HandshakeError("resumed server is not the one that issued the ticket"))
        return
    conn._hello_verified(hs, hello, resumed=True)
    conn._store_ticket()


async def _wait_tls(conn: QuicConn, proto: _Protocol) -> None:
    """Wait for the TLS handshake (or the connection's end)."""
    waiter = asyncio.ensure_future(proto.wait_connected())
    ended = asyncio.ensure_future(conn._terminated.wait())
    try:
        await asyncio.wait({waiter, ended}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        ended.cancel()
    if not waiter.done() or waiter.cancelled() or waiter.exception() is not None:
        waiter.cancel()
        raise conn._error or TransportError(f"{conn.address}: QUIC handshake failed")


# --- listening ----------------------------------------------------------------------------------


class QuicListener(Listener):
    """A QUIC server: one UDP socket, many connections."""

    def __init__(
        self,
        identity: Identity,
        config: TransportConfig,
        on_connection: OnConnection,
        tickets: ServerTicketStore,
        backend: Backend | None = None,
    ) -> None:
        self.backend = backend or get_backend()
        self.identity = identity
        self.config = config
        self.on_connection = on_connection
        self.tickets = tickets
        self.nonce_cache = config.nonce_cache or NonceCache(config.max_skew_us)
        self.addresses: list[str] = []
        self._server: Any = None  # the library's QuicServer
        self._conns: set[QuicConn] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Handshakes refused, by error name (``replayed_hello``, ``stale_hello``, ...).
        self.refused: dict[str, int] = {}
        self.accepted = 0
        self.cert_der = b""
        self.cert_sha256 = b""
        self.configuration: Any = None  # the library's QuicConfiguration

    async def _start(self, addr: Address) -> None:
        lib = self.backend
        qc = lib.QuicConfiguration(
            is_client=False, alpn_protocols=[ALPN], idle_timeout=_transport_idle(self.config)
        )
        qc.certificate, qc.private_key, qc.certificate_chain, self.cert_der = _load_certificate(
            self.identity, self.config, lib
        )
        self.configuration = qc
        self.cert_sha256 = channel_binding(self.cert_der)
        try:
            self._server = await lib.serve(
                addr.host,
                addr.port,
                configuration=qc,
                create_protocol=_server_protocol_factory(self),
                session_ticket_fetcher=self.tickets.fetch,
                session_ticket_handler=self.tickets.add,
            )
        except OSError as exc:
            raise TransportError(f"cannot listen on {addr.url}: {exc.strerror or exc}") from None
        transport = self._server._transport
        assert transport is not None
        sockname = transport.get_extra_info("sockname")
        self.addresses = [Address("quic", host=addr.host, port=sockname[1]).url]

    def connections(self) -> list[QuicConn]:
        return [c for c in self._conns if not c.closed]

    def _accepted(self, conn: QuicConn) -> None:
        self.accepted += 1
        self._conns.add(conn)
        task = asyncio.get_running_loop().create_task(self._run_handler(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_handler(self, conn: QuicConn) -> None:
        try:
            await self.on_connection(conn)
        except Exception:  # a handler's bug closes its connection, not the listener
            await conn.close(CloseCode.INTERNAL_ERROR, "connection handler failed")

    def _forget(self, conn: QuicConn) -> None:
        self._conns.discard(conn)

    async def close(self) -> None:
        conns = list(self._conns)
        await asyncio.gather(*(c.close(CloseCode.GOING_AWAY, "listener closing") for c in conns))
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
            self._server = None


async def listen_quic(
    url: str | Address,
    identity: Identity,
    on_connection: OnConnection,
    *,
    config: TransportConfig | None = None,
    tickets: ServerTicketStore | None = None,
    backend: str | None = None,
) -> QuicListener:
    """Listen on ``quic://host:port`` (port 0: any). ``on_connection`` runs per verified peer.

    ``tickets``: the server's session-ticket store; the default makes every ticket
    single-use. Pass ``ServerTicketStore(reuse=True)`` only in tests.
    ``backend``: the QUIC library, as for :func:`dial_quic`.
    """
    config = config or TransportConfig()
    addr = url if isinstance(url, Address) else parse_address(url)
    if addr.scheme != "quic":
        raise ConfigError(f"{url!r} is not a quic:// address")
    listener = QuicListener(
        identity,
        config,
        on_connection,
        tickets if tickets is not None else ServerTicketStore(),
        get_backend(backend),
    )
    await listener._start(addr)
    return listener


__all__ = [
    "SHARE_LIMIT",
    "ClientTicketStore",
    "QuicConn",
    "QuicListener",
    "QuicStats",
    "ServerTicketStore",
    "dial_quic",
    "listen_quic",
    "set_backend",
]
