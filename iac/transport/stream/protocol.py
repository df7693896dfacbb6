"""The asyncio protocol under a stream connection: a bounded frame decoder on the way in,
the socket on the way out. Until a connection attaches it serves the HELLO exchange."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Protocol, cast

from iac.errors import ConnectionClosed, ProtocolError
from iac.transport.base import NETWORK_ERRORS, TransportConfig, describe_error
from iac.transport.session import DictState, HandshakeChannel
from iac.wire.frames import Frame, FrameDecoder, PackedFrame

#: asyncio's TLS layer reads the socket into a buffer of its own, 256 KiB per connection,
#: allocated and zeroed whether or not anything arrives; a TLS record holds at most 16 KiB.
SSL_READ_BUFFER = 64 * 1024


def _shrink_ssl_buffer(transport: asyncio.BaseTransport) -> None:
    """Give asyncio's TLS read buffer of this connection :data:`SSL_READ_BUFFER` bytes (an idle
    TLS connection costs a quarter of the memory). Left alone where asyncio differs."""
    ssl_proto = getattr(transport, "_ssl_protocol", None)
    if ssl_proto is None or getattr(ssl_proto, "max_size", 0) <= SSL_READ_BUFFER:
        return
    if not isinstance(getattr(ssl_proto, "_ssl_buffer", None), bytearray):
        return
    ssl_proto.max_size = SSL_READ_BUFFER
    ssl_proto._ssl_buffer = bytearray(SSL_READ_BUFFER)
    ssl_proto._ssl_buffer_view = memoryview(ssl_proto._ssl_buffer)


class StreamEvents(Protocol):
    """What :class:`FrameProtocol` hands the connection attached to it."""

    def on_data(self, data: bytes) -> None: ...
    def on_eof(self) -> None: ...
    def on_lost(self, exc: BaseException | None) -> None: ...
    def on_writable(self) -> None: ...


class FrameProtocol(HandshakeChannel, asyncio.Protocol):
    """One stream socket: a bounded frame decoder on the way in, the transport on the way out.

    Until a connection attaches (:meth:`attach`), received frames wait in ``pending``
    (compressed: nothing is decompressed before :meth:`read_frame` takes it, one at a
    time, for the HELLO exchange) and reading stops while any wait; afterwards every
    event goes to the connection.
    """

    def __init__(
        self, config: TransportConfig, on_connected: Callable[[FrameProtocol], None] | None = None
    ) -> None:
        self.config = config
        self.dicts = DictState(config)  # this connection's dictionaries (pushed ones join them)
        self.decoder = FrameDecoder(dictionaries=self.dicts.decode, max_frame_size=config.max_frame_size)
        self.pending: deque[PackedFrame] = deque()
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
        self._conn: StreamEvents | None = None
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._lost_fut: asyncio.Future[None] = loop.create_future()
        self._read_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream socket's transport
        self.over_ssl = self.transport.get_extra_info("sslcontext") is not None
        if self.over_ssl:
            _shrink_ssl_buffer(transport)
        if self._on_connected is not None:
            self._on_connected(self)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is not None:
            conn.on_data(data)
            return
        if self.discarding or self.read_error is not None or self.eof:
            return
        try:
            frames = self.decoder.feed_packed(data)
        except ProtocolError as exc:
            self.read_error = exc.with_traceback(None)
        else:
            if frames:
                self.pending.extend(frames)
                self.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        conn = self._conn
        if conn is not None:
            conn.on_eof()
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
            conn.on_lost(exc)

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)
        conn = self._conn
        if conn is not None:
            conn.on_writable()

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
            return ConnectionClosed(f"connection lost: {describe_error(self.lost_exc)}")
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
                self.decoder.feed(b"", final=True)  # a partial frame: truncated_frame
                if self.lost_exc is not None:
                    raise self._lost_error()
                raise ConnectionClosed("peer closed the connection")
            self.resume_reading()
            self._read_waiter = self._loop.create_future()
            try:
                await self._read_waiter
            finally:
                self._read_waiter = None
        return self.pending.popleft().unpack(self.dicts.decode)

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

    def attach(self, conn: StreamEvents) -> None:
        self._conn = conn


__all__ = ["NETWORK_ERRORS", "FrameProtocol", "StreamEvents", "describe_error"]
