"""Frames back to back on one byte stream (TLS/TCP and UNIX sockets).

The adapters in :mod:`.tls` and :mod:`.unix` open the socket with a
:class:`FrameProtocol` (a plain asyncio protocol around a frame decoder) and hand it
to :func:`establish`, which runs the HELLO exchange and returns a
:class:`StreamConnection`. No task sits between the socket and the application:

* reading: the transport's ``data_received`` decodes and judges the frames
  (:class:`SessionLogic`) and puts them straight into the bounded receive queue,
  waking ``recv()``. Frames that do not fit stay in a backlog (at most one read's
  worth) and reading stops until ``recv()`` made room.
* writing: ``send()`` queues the frame and, once per event-loop turn, one
  callback writes everything queued in that turn with one ``write``. While the
  transport is above its high-water mark nothing is written; frames wait in the
  bounded send queue and ``send()`` waits when it is full.

Closing: the closing side flushes what is queued (``close()``; a protocol error
drops it instead), writes GOAWAY, then keeps reading and discarding until the
peer hangs up or ``linger_timeout`` passes, and only then closes the socket —
closing with unread input would make TCP send a reset that can destroy the
GOAWAY before the peer reads it. A peer's GOAWAY closes the socket at once.

Idle: a connection on which no frame moved either way for ``idle_timeout`` is
closed with GOAWAY IDLE_TIMEOUT (there is no PING frame; a dead peer is found by
TCP keep-alive probes every ``keepalive_interval`` on TLS/TCP, by the kernel on
UNIX sockets, and by any write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, cast

from iac.errors import CloseCode, ConnectionClosed, IacError, ProtocolError, TransportError
from iac.protocol.handshake import ClientHandshake, ServerHandshake
from iac.transport.base import Connection, Incoming, Listener, OnConnection, PeerInfo, TransportConfig
from iac.transport.queues import RecvQueue, SendQueue
from iac.transport.session import (
    DictState,
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
from iac.wire.frames import Frame, FrameDecoder

log = logging.getLogger("iac.transport")

#: Frames judged and queued for ``recv()`` per event-loop turn. A read that brought more
#: leaves the rest for the next turns, so the application answers the first requests
#: (and their replies leave) while later ones wait, instead of the two peers taking
#: turns at whole batches.
FRAMES_PER_TURN = 16
#: What the network raises under us; translated to :class:`ConnectionClosed` at this boundary.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, ssl.SSLError, EOFError)


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


class FrameProtocol(HandshakeChannel, asyncio.Protocol):
    """One stream socket: a bounded frame decoder on the way in, the transport on the way out.

    Until a :class:`StreamConnection` attaches, decoded frames wait in ``pending``
    for :meth:`read_frame` (the HELLO exchange) and reading stops while any wait;
    afterwards every event goes to the connection.
    """

    def __init__(
        self, config: TransportConfig, on_connected: Callable[[FrameProtocol], None] | None = None
    ) -> None:
        self.config = config
        self.dicts = DictState(config)  # this connection's dictionaries (pushed ones join them)
        self.decoder = FrameDecoder(dictionaries=self.dicts.decode, max_frame_size=config.max_frame_size)
        self.pending: deque[Frame] = deque()
        self.transport: asyncio.Transport | None = None
        self.over_ssl = False
        self.eof = False  # the peer finished sending
        self.lost = False  # the transport is gone
        self.lost_exc: BaseException | None = None
        self.read_error: ProtocolError | None = None  # the decoder refused the input
        self.reading_paused = False
        self.writing_paused = False
        self.discarding = False  # lingering after a refused handshake: read and drop
        self._on_connected = on_connected
        self._conn: StreamConnection | None = None
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._lost_fut: asyncio.Future[None] = loop.create_future()
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream socket's transport
        self.over_ssl = self.transport.get_extra_info("sslcontext") is not None
        if self._on_connected is not None:
            self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is not None:
            conn._on_data(data)
            return
        if self.discarding or self.read_error is not None or self.eof:
            return
        try:
            frames = self.decoder.feed(data)
        except ProtocolError as exc:
            self.read_error = exc
        else:
            if frames:
                self.pending.extend(frames)
                self.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        conn = self._conn
        if conn is not None:
            conn._on_eof()
        self._wake_reader()
        return not self.over_ssl  # keep a TCP/UNIX socket open for our GOAWAY (SSL cannot)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.lost_exc = exc
        if not self._lost_fut.done():
            self._lost_fut.set_result(None)
        self._wake_reader()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        conn = self._conn
        if conn is not None:
            conn._on_lost(exc)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        conn = self._conn
        if conn is not None:
            conn._on_writable()

    # --- reading control ------------------------------------------------------------------------

    def pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            if not self.lost:
                self.transport.resume_reading()

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- HandshakeChannel -----------------------------------------------------------------------

    def _lost_error(self) -> ConnectionClosed:
        if self.lost_exc is not None:
            return ConnectionClosed(f"connection lost: {_describe(self.lost_exc)}")
        return ConnectionClosed("connection lost")

    async def send_frame(self, frame: bytes) -> None:
        if self.lost or self.transport is None or self.transport.is_closing():
            raise self._lost_error()
        self.transport.write(frame)
        await self.drain()

    async def drain(self) -> None:
        """Wait while the transport is above its high-water mark; raise once it is gone."""
        while self.writing_paused and not self.lost:
            self._drain_waiter = self._loop.create_future()
            await self._drain_waiter
        if self.lost:
            raise self._lost_error()

    async def read_frame(self) -> Frame:
        while not self.pending:
            if self.read_error is not None:
                raise self.read_error
            if self.eof or self.lost:
                self.decoder.feed(b"", final=True)  # a partial frame: TruncatedFrame
                if self.lost_exc is not None:
                    raise self._lost_error()
                raise ConnectionClosed("peer closed the connection")
            self.resume_reading()
            self._read_waiter = self._loop.create_future()
            try:
                await self._read_waiter
            finally:
                self._read_waiter = None
        return self.pending.popleft()

    # --- closing --------------------------------------------------------------------------------

    async def wait_eof(self, timeout: float) -> None:
        """Read and discard until the peer hangs up or ``timeout`` passes."""
        self.discarding = True
        self.pending.clear()
        self.resume_reading()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not (self.eof or self.lost):
                    self._read_waiter = self._loop.create_future()
                    try:
                        await self._read_waiter
                    finally:
                        self._read_waiter = None

    async def close_transport(self, timeout: float) -> None:
        """Close the socket; abort it when a clean close (TLS close_notify) takes too long."""
        transport = self.transport
        if transport is None or self.lost:
            return
        with contextlib.suppress(*NETWORK_ERRORS):
            transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._lost_fut), timeout)
        except TimeoutError:
            transport.abort()

    def attach(self, conn: StreamConnection) -> None:
        self._conn = conn


async def establish(
    proto: FrameProtocol,
    hs: ClientHandshake | ServerHandshake,
    *,
    config: TransportConfig,
    transport: str,
    address: str,
    deadline: float,
) -> StreamConnection:
    """Run the HELLO exchange on a fresh stream; return the connection, or close the
    stream and raise (the typed handshake error, :class:`ConnectionClosed`, or
    :class:`TransportError` on timeout)."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(deadline):
            peer_hello = await perform_handshake(hs, proto, clock=config.clock)
    except TimeoutError:
        await proto.close_transport(0.1)
        raise TransportError(f"{address}: handshake timed out after {config.handshake_timeout:g} s") from None
    except ProtocolError:
        if proto.goaway_sent:  # we refused: let the peer read our GOAWAY before we hang up
            await proto.wait_eof(min(config.linger_timeout, max(0.0, deadline - loop.time())))
        await proto.close_transport(0.1)
        raise
    except BaseException:
        await proto.close_transport(0.1)
        raise
    try:
        local_hello = Hello.FromString(hs.sent_bytes or b"")
    except Exception:  # a test hook sent bytes that do not parse
        local_hello = Hello()
    peer = PeerInfo(
        agent_id=peer_hello.agent_id,
        transport=transport,
        address=address,
        hello=peer_hello,
        dialed=isinstance(hs, ClientHandshake),
    )
    return StreamConnection(proto, peer, local_hello, config)


class StreamConnection(Connection):
    """A verified connection over one byte stream."""

    def __init__(
        self, proto: FrameProtocol, peer: PeerInfo, local_hello: Hello, config: TransportConfig
    ) -> None:
        self.peer = peer
        self.local_hello = local_hello
        self.config = config
        self._proto = proto
        if proto.transport is None:  # pragma: no cover - establish runs after connection_made
            raise TransportError("stream connection without a transport")
        self._transport: asyncio.Transport = proto.transport
        self._decoder = proto.decoder
        self.dicts: DictState = proto.dicts
        self.dicts.send_control = self._send_control
        self._logic = SessionLogic(peer.agent_id, self.dicts)
        self._sendq = SendQueue(config.send_queue_frames, config.send_queue_bytes)
        self._recvq = RecvQueue(config.recv_queue_frames, config.recv_budget_bytes)
        self._backlog: deque[Frame] = deque()  # decoded, waiting for room in the receive queue
        self._eof_pending = False  # the peer hung up behind the backlog
        self._error: IacError | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._read_done = asyncio.Event()
        self._write_done = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._activity = loop.time()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._flush_handle: asyncio.Handle | None = None
        self._pump_handle: asyncio.Handle | None = None
        self._close_task: asyncio.Task[None] | None = None
        if config.idle_timeout:
            self._idle_handle = loop.call_later(config.idle_timeout, self._check_idle)
        proto.attach(self)
        # Our dictionary push goes first, ahead of any message.
        push = self.dicts.push_frame(local_hello.agent_id, peer.hello)
        if push is not None:
            self._send_control(push)
        # What arrived behind the HELLO, and what happened to the stream since.
        self._backlog.extend(proto.pending)
        proto.pending.clear()
        self._pump()
        if proto.read_error is not None:
            self._protocol_fault(proto.read_error)
        if proto.eof:
            self._on_eof()
        if proto.lost:
            self._on_lost(proto.lost_exc)

    # --- public ---------------------------------------------------------------------------------

    @property
    def send_dictionary(self) -> Dictionary | None:
        return self.dicts.send_dictionary

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def close_error(self) -> IacError | None:
        return self._error

    async def send(self, frame: bytes) -> None:
        if self._error is not None:
            raise self._error
        q = self._sendq
        if not q.offer(frame):
            await q.put(frame)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    async def recv(self) -> Incoming:
        item = await self._recvq.get()
        if self._proto.reading_paused and self._pump_handle is None:
            self._pump()
        return item

    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        if not self._closing:
            err = ConnectionClosed(
                f"connection closed by this side{': ' + reason if reason else ''}", int(code), reason
            )
            self._start_close(err, goaway=(int(code), reason), graceful=True)
        await self.wait_closed()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- reading (called by the protocol) -------------------------------------------------------

    def _on_data(self, data: bytes) -> None:
        if self._closing:
            return  # lingering: discard until the peer hangs up
        self._activity = self._loop.time()
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            self._protocol_fault(exc)
            return
        if frames:
            self._backlog.extend(frames)
            if self._pump_handle is None:
                self._pump()

    def _pump(self) -> None:
        """Judge backlog frames into the receive queue while it has room, at most
        :data:`FRAMES_PER_TURN` per event-loop turn; stop reading while a backlog is left."""
        self._pump_handle = None
        backlog = self._backlog
        recvq = self._recvq
        logic = self._logic
        budget = FRAMES_PER_TURN
        try:
            while backlog:
                if self._closing:
                    backlog.clear()
                    return
                frame = backlog[0]
                if not recvq.has_room(frame.wire_size or len(frame.body)):
                    self._proto.pause_reading()
                    return
                if budget == 0:  # let the application work on what it has; go on next turn
                    self._proto.pause_reading()
                    if self._pump_handle is None:
                        self._pump_handle = self._loop.call_soon(self._pump)
                    return
                budget -= 1
                backlog.popleft()
                event = logic.on_frame(frame)
                if event is None:
                    continue
                if type(event) is Incoming:
                    recvq.put_nowait(event)
                elif isinstance(event, PeerGoaway):
                    backlog.clear()
                    self._start_close(
                        peer_closed_error(event.code, event.reason), goaway=None, graceful=False
                    )
                    return
        except ProtocolError as exc:
            backlog.clear()
            self._protocol_fault(exc)
            return
        if self._eof_pending:
            self._eof_pending = False
            self._on_eof()
        elif not self._closing:
            self._proto.resume_reading()

    def _on_eof(self) -> None:
        if not self._closing:
            if self._backlog:
                self._eof_pending = True  # deliver what was read first
                return
            if not self._decoder.idle:
                self._protocol_fault(decoder_truncated())
            else:
                self._start_close(
                    ConnectionClosed("peer closed the connection without GOAWAY"), goaway=None, graceful=False
                )
        self._read_done.set()

    def _on_lost(self, exc: BaseException | None) -> None:
        if not self._closing:
            if exc is None:
                self._eof_pending = False
                self._backlog.clear()
                self._on_eof()
            else:
                self._start_close(
                    ConnectionClosed(f"connection lost: {_describe(exc)}"), goaway=None, graceful=False
                )
        self._read_done.set()
        self._write_done.set()

    def _protocol_fault(self, exc: ProtocolError) -> None:
        log.info("closing connection to %s: %s: %s", self.peer.agent_id[:16], exc.name, exc)
        self._start_close(local_protocol_error(exc), goaway=(exc.close_code, str(exc)), graceful=False)

    # --- writing --------------------------------------------------------------------------------

    def _flush(self) -> None:
        """Write everything queued in this event-loop turn with one write (unless backpressured)."""
        self._flush_handle = None
        proto = self._proto
        if proto.writing_paused or proto.lost:
            return  # resume_writing flushes
        batch = self._sendq.take_all()
        if batch:
            self._transport.write(batch[0] if len(batch) == 1 else b"".join(batch))
            self._activity = self._loop.time()
        if self._sendq.done and not proto.writing_paused:
            self._write_done.set()

    def _send_control(self, frame: bytes) -> None:
        """Queue a control frame (DICT, DICT_ACK) past the send bound; flush this turn."""
        if self._closing:
            return
        self._sendq.put_nowait(frame)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _on_writable(self) -> None:
        if self._flush_handle is None and (len(self._sendq) or self._sendq.done):
            self._flush_handle = self._loop.call_soon(self._flush)

    # --- closing --------------------------------------------------------------------------------

    def _start_close(self, error: IacError, *, goaway: tuple[int, str] | None, graceful: bool) -> None:
        if self._closing:
            return
        self._closing = True
        self._error = error
        self._recvq.fail(error)
        self._backlog.clear()
        self._proto.resume_reading()  # lingering reads and discards until the peer hangs up
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        if goaway is not None and graceful:
            self._sendq.put_nowait(goaway_frame(*goaway))
            self._sendq.finish(error)
        else:
            self._sendq.fail(error)
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        self._close_task = self._loop.create_task(self._finish_close(goaway, graceful))

    async def _finish_close(self, goaway: tuple[int, str] | None, graceful: bool) -> None:
        linger = self.config.linger_timeout
        proto = self._proto
        try:
            if goaway is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._write_done.wait(), linger)
                if not graceful and not proto.lost:
                    with contextlib.suppress(TimeoutError, *NETWORK_ERRORS, IacError):
                        self._transport.write(goaway_frame(*goaway))
                        await asyncio.wait_for(proto.drain(), linger)
                # Let the peer read the GOAWAY and hang up before we close.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._read_done.wait(), linger)
            await proto.close_transport(linger)
        finally:
            for handle in (self._flush_handle, self._pump_handle):
                if handle is not None:
                    handle.cancel()
            self._flush_handle = self._pump_handle = None
            self._closed.set()

    def _check_idle(self) -> None:
        self._idle_handle = None
        if self._closing or not self.config.idle_timeout:
            return
        idle_for = self._loop.time() - self._activity
        if idle_for >= self.config.idle_timeout:
            reason = f"idle for {self.config.idle_timeout:g} s"
            err = ConnectionClosed(f"connection closed: {reason}", CloseCode.IDLE_TIMEOUT, reason)
            self._start_close(err, goaway=(CloseCode.IDLE_TIMEOUT, reason), graceful=True)
        else:
            self._idle_handle = self._loop.call_later(self.config.idle_timeout - idle_for, self._check_idle)


class StreamListener(Listener):
    """Accepts stream connections (TLS or UNIX): optional pre-check of the socket
    (UNIX peer uid), the HELLO exchange, then ``on_connection`` in the accepting task."""

    def __init__(
        self,
        *,
        config: TransportConfig,
        transport: str,
        on_connection: OnConnection,
        make_handshake: Callable[[], ServerHandshake],
        describe_peer: Callable[[asyncio.BaseTransport], str],
        precheck: Callable[[asyncio.BaseTransport], ProtocolError | None] | None = None,
    ) -> None:
        self.addresses: list[str] = []
        self.config = config
        self.transport = transport
        self._on_connection = on_connection
        self._make_handshake = make_handshake
        self._describe_peer = describe_peer
        self._precheck = precheck
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.refused = 0  # handshakes refused (any reason)

    def attach(self, server: asyncio.Server, addresses: list[str]) -> None:
        self._server = server
        self.addresses = addresses

    def protocol_factory(
        self, handler: Callable[[FrameProtocol], Coroutine[Any, Any, None]] | None = None
    ) -> Callable[[], FrameProtocol]:
        """For ``create_server``: each accepted socket runs ``handler`` (default :meth:`handle`) in a task."""
        run = handler if handler is not None else self.handle

        def connected(proto: FrameProtocol) -> None:
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(run(proto))
            self._tasks.add(task)
            task.add_done_callback(self._task_done)

        return lambda: FrameProtocol(self.config, connected)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s connection handler failed", self.transport, exc_info=task.exception())

    async def handle(self, proto: FrameProtocol) -> None:
        transport = proto.transport
        if transport is None:  # pragma: no cover - called from connection_made
            return
        if self._closing:
            transport.abort()
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.handshake_timeout
        peer_url = self._describe_peer(transport)
        try:
            refusal = self._precheck(transport) if self._precheck is not None else None
            if refusal is not None:
                raise refusal
            conn = await establish(
                proto,
                self._make_handshake(),
                config=self.config,
                transport=self.transport,
                address=peer_url,
                deadline=deadline,
            )
        except ProtocolError as exc:
            self.refused += 1
            log.info("refused %s connection from %s: %s: %s", self.transport, peer_url, exc.name, exc)
            if not transport.is_closing():  # precheck refusal: nothing was sent yet
                with contextlib.suppress(*NETWORK_ERRORS, IacError):
                    await proto.send_frame(goaway_frame(exc.close_code, str(exc)))
                await proto.wait_eof(self.config.linger_timeout)
                await proto.close_transport(0.1)
            return
        except IacError as exc:
            self.refused += 1
            log.info("%s connection from %s failed: %s", self.transport, peer_url, exc)
            return
        except NETWORK_ERRORS as exc:
            self.refused += 1
            log.info("%s connection from %s failed: %s", self.transport, peer_url, _describe(exc))
            return
        self._conns = {c for c in self._conns if not c.closed}
        self._conns.add(conn)
        try:
            await self._on_connection(conn)
        except asyncio.CancelledError:
            await conn.close(CloseCode.GOING_AWAY, "node shutting down")
            raise
        except IacError as exc:
            if not conn.closed:
                log.warning("on_connection failed for %s: %s", conn.peer.agent_id[:16], exc)
            await conn.close(CloseCode.INTERNAL_ERROR, "connection handler failed")
        except Exception:
            log.exception("on_connection failed for %s", conn.peer.agent_id[:16])
            await conn.close(CloseCode.INTERNAL_ERROR, "connection handler failed")

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._server is not None:
            self._server.close()
        await asyncio.gather(
            *(c.close(CloseCode.GOING_AWAY, "node shutting down") for c in list(self._conns)),
            return_exceptions=True,
        )
        for t in list(self._tasks):
            if t is not asyncio.current_task():
                t.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.config.linger_timeout)


def decoder_truncated() -> ProtocolError:
    from iac.errors import TruncatedFrame

    return TruncatedFrame("the peer hung up inside a frame")


__all__ = [
    "FrameProtocol",
    "StreamConnection",
    "StreamListener",
    "establish",
]
