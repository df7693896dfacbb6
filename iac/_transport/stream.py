"""Frames back to back on one byte stream (TLS/TCP and UNIX sockets).

The adapters in :mod:`.tls` and :mod:`.unix` open the socket and hand the
asyncio streams to :func:`establish`, which runs the HELLO exchange and returns a
:class:`StreamConnection`. One task reads (frame decoder → :class:`SessionLogic`
→ bounded receive queue; reading stops while the queue is full), one task
writes (everything queued in an event-loop turn leaves in one write).

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
from collections.abc import Callable
from typing import Any

from .._errors import CloseCode, ConnectionClosed, IacError, ProtocolError, TransportError
from .._frames import Frame, FrameDecoder
from .._handshake import ClientHandshake, ServerHandshake
from .._pb.iac_pb2 import Hello
from .base import (
    Connection,
    HandshakeChannel,
    Incoming,
    Listener,
    OnConnection,
    PeerGoaway,
    PeerInfo,
    RecvQueue,
    SendQueue,
    SessionLogic,
    TransportConfig,
    goaway_frame,
    local_protocol_error,
    peer_closed_error,
    perform_handshake,
)

log = logging.getLogger("iac.transport")

READ_SIZE = 256 * 1024
#: What the network raises under us; translated to :class:`ConnectionClosed` at this boundary.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (OSError, ssl.SSLError, EOFError)


class StreamFramer(HandshakeChannel):
    """Frames in and out of an asyncio stream pair, with a bounded decoder."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, config: TransportConfig
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameDecoder(dictionaries=config.dictionaries, max_frame_size=config.max_frame_size)
        self.pending: deque[Frame] = deque()

    async def send_frame(self, frame: bytes) -> None:
        try:
            self.writer.write(frame)
            await self.writer.drain()
        except NETWORK_ERRORS as exc:
            raise ConnectionClosed(f"connection lost: {_describe(exc)}") from None

    async def read_frame(self) -> Frame:
        while not self.pending:
            try:
                data = await self.reader.read(READ_SIZE)
            except NETWORK_ERRORS as exc:
                raise ConnectionClosed(f"connection lost: {_describe(exc)}") from None
            if not data:
                self.decoder.feed(b"", final=True)
                raise ConnectionClosed("peer closed the connection")
            self.pending.extend(self.decoder.feed(data))
        return self.pending.popleft()


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


async def close_writer(writer: asyncio.StreamWriter, timeout: float) -> None:
    """Close a stream; abort it when a clean close (TLS close_notify) takes too long."""
    with contextlib.suppress(*NETWORK_ERRORS):
        writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), timeout)
    except NETWORK_ERRORS:  # TimeoutError is an OSError
        writer.transport.abort()


async def drain_until_eof(reader: asyncio.StreamReader, timeout: float) -> None:
    """Read and discard until the peer hangs up or ``timeout`` passes."""

    async def drain() -> None:
        while await reader.read(READ_SIZE):
            pass

    with contextlib.suppress(*NETWORK_ERRORS):
        await asyncio.wait_for(drain(), timeout)


async def establish(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
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
    framer = StreamFramer(reader, writer, config)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(deadline):
            peer_hello = await perform_handshake(hs, framer, clock=config.clock)
    except TimeoutError:
        await close_writer(writer, 0.1)
        raise TransportError(f"{address}: handshake timed out after {config.handshake_timeout:g} s") from None
    except ProtocolError:
        if framer.goaway_sent:  # we refused: let the peer read our GOAWAY before we hang up
            await drain_until_eof(reader, min(config.linger_timeout, max(0.0, deadline - loop.time())))
        await close_writer(writer, 0.1)
        raise
    except BaseException:
        await close_writer(writer, 0.1)
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
    return StreamConnection(framer, peer, local_hello, config)


class StreamConnection(Connection):
    """A verified connection over one byte stream."""

    def __init__(
        self, framer: StreamFramer, peer: PeerInfo, local_hello: Hello, config: TransportConfig
    ) -> None:
        self.peer = peer
        self.local_hello = local_hello
        self.config = config
        self._framer = framer
        self._reader = framer.reader
        self._writer = framer.writer
        self._logic = SessionLogic(peer.agent_id)
        self._sendq = SendQueue(config.send_queue_frames, config.send_queue_bytes)
        self._recvq = RecvQueue(config.recv_queue_frames, config.recv_budget_bytes)
        self._error: IacError | None = None
        self._closing = False
        self._closed = asyncio.Event()
        self._read_done = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._activity = loop.time()
        self._idle_handle: asyncio.TimerHandle | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._reader_task = loop.create_task(self._read_loop())
        self._writer_task = loop.create_task(self._write_loop())
        if config.idle_timeout:
            self._idle_handle = loop.call_later(config.idle_timeout, self._check_idle)

    # --- public ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def close_error(self) -> IacError | None:
        return self._error

    async def send(self, frame: bytes) -> None:
        if self._error is not None:
            raise self._error
        await self._sendq.put(frame)

    async def recv(self) -> Incoming:
        return await self._recvq.get()

    async def close(self, code: int = CloseCode.NO_ERROR, reason: str = "") -> None:
        if not self._closing:
            err = ConnectionClosed(
                f"connection closed by this side{': ' + reason if reason else ''}", int(code), reason
            )
            self._start_close(err, goaway=(int(code), reason), graceful=True)
        await self.wait_closed()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    @property
    def queued_bytes(self) -> int:
        return self._sendq.nbytes

    # --- internals ------------------------------------------------------------------------------

    def _start_close(self, error: IacError, *, goaway: tuple[int, str] | None, graceful: bool) -> None:
        if self._closing:
            return
        self._closing = True
        self._error = error
        self._recvq.fail(error)
        if self._idle_handle is not None:
            self._idle_handle.cancel()
        if goaway is not None and graceful:
            self._sendq.put_nowait(goaway_frame(*goaway))
            self._sendq.finish(error)
        else:
            self._sendq.fail(error)
        self._close_task = self._loop.create_task(self._finish_close(goaway, graceful))

    async def _finish_close(self, goaway: tuple[int, str] | None, graceful: bool) -> None:
        linger = self.config.linger_timeout
        try:
            if goaway is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self._writer_task), linger)
                if not graceful and not self._writer_task.done():
                    self._writer_task.cancel()
                if not graceful:
                    with contextlib.suppress(*NETWORK_ERRORS):
                        self._writer.write(goaway_frame(*goaway))
                        await asyncio.wait_for(self._writer.drain(), linger)
                # Let the peer read the GOAWAY and hang up before we close.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._read_done.wait(), linger)
            else:
                self._writer_task.cancel()
            await close_writer(self._writer, linger)
        finally:
            for task in (self._reader_task, self._writer_task):
                if not task.done():
                    task.cancel()
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

    async def _deliver(self, frames: list[Frame]) -> None:
        for frame in frames:
            if self._closing:
                return
            event = self._logic.on_frame(frame)
            if isinstance(event, Incoming):
                await self._recvq.put(event)
            elif isinstance(event, PeerGoaway):
                self._start_close(peer_closed_error(event.code, event.reason), goaway=None, graceful=False)
                return

    async def _read_loop(self) -> None:
        decoder = self._framer.decoder
        reader = self._reader
        failed = False
        try:
            pending = list(self._framer.pending)
            self._framer.pending.clear()
            try:
                await self._deliver(pending)
            except ProtocolError as exc:
                failed = True
                self._protocol_fault(exc)
            while True:
                data = await reader.read(READ_SIZE)
                if not data:
                    break
                if self._closing or failed:
                    continue  # lingering: discard until the peer hangs up
                self._activity = self._loop.time()
                try:
                    await self._deliver(decoder.feed(data))
                except ProtocolError as exc:
                    failed = True
                    self._protocol_fault(exc)
            if not self._closing:
                if not decoder.idle:
                    self._protocol_fault(decoder_truncated())
                else:
                    self._start_close(
                        ConnectionClosed("peer closed the connection without GOAWAY"),
                        goaway=None,
                        graceful=False,
                    )
        except NETWORK_ERRORS as exc:
            self._start_close(
                ConnectionClosed(f"connection lost: {_describe(exc)}"), goaway=None, graceful=False
            )
        finally:
            self._read_done.set()

    def _protocol_fault(self, exc: ProtocolError) -> None:
        log.info("closing connection to %s: %s: %s", self.peer.agent_id[:16], exc.name, exc)
        self._start_close(local_protocol_error(exc), goaway=(exc.close_code, str(exc)), graceful=False)

    async def _write_loop(self) -> None:
        writer = self._writer
        try:
            while True:
                batch = await self._sendq.get_batch()
                if batch is None:
                    return
                writer.write(batch[0] if len(batch) == 1 else b"".join(batch))
                self._activity = self._loop.time()
                await writer.drain()
        except NETWORK_ERRORS as exc:
            self._start_close(
                ConnectionClosed(f"connection lost: {_describe(exc)}"), goaway=None, graceful=False
            )


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
        describe_peer: Callable[[asyncio.StreamWriter], str],
        precheck: Callable[[asyncio.StreamWriter], ProtocolError | None] | None = None,
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

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._closing:
            writer.transport.abort()
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.handshake_timeout
        peer_url = self._describe_peer(writer)
        try:
            refusal = self._precheck(writer) if self._precheck is not None else None
            if refusal is not None:
                raise refusal
            conn = await establish(
                reader,
                writer,
                self._make_handshake(),
                config=self.config,
                transport=self.transport,
                address=peer_url,
                deadline=deadline,
            )
        except ProtocolError as exc:
            self.refused += 1
            log.info("refused %s connection from %s: %s: %s", self.transport, peer_url, exc.name, exc)
            if not writer.is_closing():  # precheck refusal: nothing was sent yet
                with contextlib.suppress(*NETWORK_ERRORS):
                    writer.write(goaway_frame(exc.close_code, str(exc)))
                    await writer.drain()
                await drain_until_eof(reader, self.config.linger_timeout)
                await close_writer(writer, 0.1)
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
    from .._errors import TruncatedFrame

    return TruncatedFrame("the peer hung up inside a frame")


__all__ = [
    "READ_SIZE",
    "StreamConnection",
    "StreamFramer",
    "StreamListener",
    "close_writer",
    "drain_until_eof",
    "establish",
]
