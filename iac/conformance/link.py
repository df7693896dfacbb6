"""Raw links for the conformance tester: bytes on TLS/TCP, UNIX sockets and QUIC, nothing judged.

The tester must be able to send what a correct node never sends (a forged HELLO, a truncated
frame, the bytes of a negative test vector), so it does not go through :mod:`iac.transport`
(which only sends well-formed frames) but opens the sockets itself, as another implementation
would: TLS 1.3 with ALPN ``iac/1`` and no certificate verification (the HELLO's
``channel_binding`` is what binds), a UNIX stream socket, and QUIC (aioquic) with the control
stream 0 and one unidirectional stream per message (docs/PROTOCOL.md, "Transports").

A :class:`Link` gives back :class:`Data` and :class:`Ended` events; the frames inside are the
:mod:`iac.conformance.peer`'s business.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from iac.errors import ConfigError, TransportError
from iac.protocol.handshake import ALPN, channel_binding
from iac.transport.base import parse_address
from iac.transport.certs import NodeCertificate

CONTROL = 0  # the control stream (QUIC stream 0; the whole connection on TLS/TCP and UNIX)
_READ = 65536


@dataclass(frozen=True)
class Data:
    stream: int
    data: bytes
    end: bool = False
    reset: bool = False  # QUIC: the sender reset the stream (what it held of a frame is lost)


@dataclass(frozen=True)
class Ended:
    """The connection ended: ``code`` is a QUIC application close code (None on a socket EOF
    or a transport-level close)."""

    code: int | None
    reason: str


Event = Data | Ended


class Link:
    """One connection, either side. ``binding``: SHA-256 of the server certificate (DER) as this
    side sees it (empty on UNIX)."""

    transport: str = ""
    binding: bytes = b""
    client_first: bool = True

    def __init__(self) -> None:
        self.events: asyncio.Queue[Event] = asyncio.Queue()

    async def send(self, data: bytes, *, control: bool = True) -> None:
        raise NotImplementedError

    def end_sending(self) -> None:
        """End this side's byte stream (a half-close: the peer reads the end, this side still reads)."""
        raise NotImplementedError

    def close(self, code: int = 0, reason: str = "") -> None:
        raise NotImplementedError


# --- TLS/TCP and UNIX -----------------------------------------------------------------------------


class StreamLink(Link):
    def __init__(self, transport: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self.transport = transport
        self.client_first = transport != "unix"
        self._writer = writer
        self._task = asyncio.get_running_loop().create_task(self._pump(reader))

    async def _pump(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                data = await reader.read(_READ)
                if not data:
                    break
                self.events.put_nowait(Data(CONTROL, data))
        except (OSError, ssl.SSLError) as exc:
            self.events.put_nowait(Ended(None, f"{type(exc).__name__}: {exc}"))
            return
        self.events.put_nowait(Data(CONTROL, b"", end=True))
        self.events.put_nowait(Ended(None, "end of stream"))

    async def send(self, data: bytes, *, control: bool = True) -> None:
        if self._writer.is_closing():
            return
        self._writer.write(data)
        with contextlib.suppress(OSError, ssl.SSLError):
            await self._writer.drain()

    def end_sending(self) -> None:
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)

    def close(self, code: int = 0, reason: str = "") -> None:
        self._task.cancel()
        self._writer.close()


def _tls_client_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the HELLO's channel_binding is the check
    ctx.set_alpn_protocols([ALPN])
    return ctx


def _tls_server_context(cert: NodeCertificate) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([ALPN])
    cert.load_into(ctx)
    return ctx


async def _dial_stream(url: str) -> Link:
    addr = parse_address(url)
    if addr.scheme == "unix":
        reader, writer = await asyncio.open_unix_connection(addr.path)
        return StreamLink("unix", reader, writer)
    reader, writer = await asyncio.open_connection(addr.host, addr.port, ssl=_tls_client_context())
    sslobj = writer.get_extra_info("ssl_object")
    der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
    if sslobj is None or sslobj.selected_alpn_protocol() != ALPN or not der:
        writer.close()
        raise TransportError(f"{url}: the server did not negotiate ALPN {ALPN!r} (not an IAC node?)")
    link = StreamLink("tls", reader, writer)
    link.binding = channel_binding(der)
    return link


# --- QUIC ---------------------------------------------------------------------------------------


def _quic_protocol(link_ready: Callable[[QuicLink], None] | None) -> type[Any]:
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.quic.events import (
        ConnectionTerminated,
        HandshakeCompleted,
        StreamDataReceived,
        StreamReset,
    )

    class Protocol(QuicConnectionProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.link = QuicLink(self)

        def quic_event_received(self, event: Any) -> None:
            link = self.link
            if isinstance(event, HandshakeCompleted):
                link.alpn = event.alpn_protocol
                link.announced = link.peer_parameters()  # before any MAX_STREAMS can raise them
                if link_ready is not None:
                    link_ready(link)
            elif isinstance(event, StreamDataReceived):
                link.events.put_nowait(Data(event.stream_id, event.data, event.end_stream))
            elif isinstance(event, StreamReset):
                link.events.put_nowait(Data(event.stream_id, b"", end=True, reset=True))
            elif isinstance(event, ConnectionTerminated):
                code = event.error_code if event.frame_type is None else None
                if event.frame_type is not None:  # a QUIC transport error (RFC 9000 section 20.1)
                    link.transport_error = event.error_code
                link.events.put_nowait(Ended(code, event.reason_phrase))

    return Protocol


class QuicLink(Link):
    transport = "quic"

    def __init__(self, protocol: Any) -> None:
        super().__init__()
        self._protocol = protocol
        self.alpn: str | None = None
        self.udp: asyncio.BaseTransport | None = None  # a dialed link owns its UDP socket
        self.announced: dict[str, float | int | None] = {}  # the peer's transport parameters
        #: The QUIC transport error code the connection closed with (None: none, or not yet).
        self.transport_error: int | None = None
        self._extra_frames: list[tuple[int, bytes]] = []
        self._frames_hooked = False

    @property
    def _quic(self) -> Any:
        return self._protocol._quic

    def set_binding_from_peer(self) -> None:
        from cryptography.hazmat.primitives.serialization import Encoding

        cert = self._quic.tls._peer_certificate
        if cert is not None:
            self.binding = channel_binding(cert.public_bytes(Encoding.DER))

    async def send(self, data: bytes, *, control: bool = True) -> None:
        if control:
            self._quic.send_stream_data(CONTROL, data, end_stream=False)
        else:
            sid = self._quic.get_next_available_stream_id(is_unidirectional=True)
            self._quic.send_stream_data(sid, data, end_stream=True)
        self._protocol.transmit()

    def end_sending(self) -> None:
        self._quic.send_stream_data(CONTROL, b"", end_stream=True)
        self._protocol.transmit()

    async def send_on_new_bidi(self, data: bytes) -> None:
        """``data`` on a new bidirectional stream (which the mapping forbids: a case sends it)."""
        sid = self._quic.get_next_available_stream_id(is_unidirectional=False)
        self._quic.send_stream_data(sid, data, end_stream=True)
        self._protocol.transmit()

    async def send_and_reset(self, data: bytes) -> None:
        """``data`` on a new unidirectional stream, then RESET_STREAM instead of FIN."""
        sid = self._quic.get_next_available_stream_id(is_unidirectional=True)
        self._quic.send_stream_data(sid, data, end_stream=False)
        self._protocol.transmit()
        self._quic.reset_stream(sid, 0)
        self._protocol.transmit()

    async def send_and_reset_control(self, data: bytes) -> None:
        """``data`` on the control stream, then RESET_STREAM of the control stream."""
        self._quic.send_stream_data(CONTROL, data, end_stream=False)
        self._protocol.transmit()
        self._quic.reset_stream(CONTROL, 0)
        self._protocol.transmit()

    async def send_quic_frame(self, frame_type: int, body: bytes) -> None:
        """One QUIC frame of ``frame_type`` (the library does not know it) with ``body``, in the
        next 1-RTT packet, with a PING (so that a packet leaves)."""
        q = self._quic
        if not self._frames_hooked:
            self._frames_hooked = True
            write_limits = q._write_connection_limits

            def write_limits_and_extra(builder: Any, space: Any) -> None:
                write_limits(builder=builder, space=space)
                while self._extra_frames and builder.remaining_flight_space > 64:
                    kind, data = self._extra_frames.pop(0)
                    builder.start_frame(kind, capacity=len(data) + 8).push_bytes(data)

            q._write_connection_limits = write_limits_and_extra
        self._extra_frames.append((frame_type, body))
        q.send_ping(0)
        self._protocol.transmit()

    def peer_parameters(self) -> dict[str, float | int | None]:
        """The QUIC version in use and the transport parameters the peer announced (RFC 9000
        section 18.2; ``max_idle_timeout`` in seconds, None when not announced)."""
        q = self._quic
        return {
            "version": int(q._version),
            "max_idle_timeout": q._remote_max_idle_timeout,
            "initial_max_streams_bidi": int(q._remote_max_streams_bidi),
            "initial_max_streams_uni": int(q._remote_max_streams_uni),
            "initial_max_data": int(q._remote_max_data),
        }

    def close(self, code: int = 0, reason: str = "") -> None:
        self._protocol.close(error_code=code, reason_phrase=reason)
        if self.udp is not None:
            udp, self.udp = self.udp, None
            # the CONNECTION_CLOSE is written at once; then no timer may fire on a closed socket
            asyncio.get_running_loop().call_soon(_drop_udp, self._protocol, udp)


def _drop_udp(protocol: Any, udp: asyncio.BaseTransport) -> None:
    """Close a dialed link's UDP socket and the library's timer with it."""
    timer = protocol._timer
    if timer is not None:
        timer.cancel()
        protocol._timer = None
    protocol._handle_timer = lambda: None  # a timer re-armed while closing has nothing to send to
    udp.close()


def _quic_config(*, is_client: bool, idle: float) -> Any:
    from aioquic.quic.configuration import QuicConfiguration

    qc = QuicConfiguration(is_client=is_client, alpn_protocols=[ALPN], idle_timeout=idle)
    if is_client:
        qc.verify_mode = ssl.CERT_NONE
    return qc


async def _dial_quic(url: str, timeout: float) -> Link:
    from aioquic.quic.connection import QuicConnection

    addr = parse_address(url)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(addr.host, addr.port, type=socket.SOCK_DGRAM)
    family, _, _, _, remote = infos[0]
    qc = _quic_config(is_client=True, idle=max(timeout * 4, 5.0))
    qc.server_name = addr.host
    quic = QuicConnection(configuration=qc)
    factory = _quic_protocol(None)
    local = ("::", 0) if family == socket.AF_INET6 else ("0.0.0.0", 0)
    transport, protocol = await loop.create_datagram_endpoint(lambda: factory(quic), local_addr=local)
    link: QuicLink = protocol.link
    link.udp = transport
    try:
        protocol.connect(remote)
        await protocol.wait_connected()
    except BaseException:
        _drop_udp(protocol, transport)
        raise
    if link.alpn != ALPN:
        link.close()
        raise TransportError(f"{url}: the server did not negotiate ALPN {ALPN!r} (not an IAC node?)")
    link.set_binding_from_peer()
    return link


async def dial(url: str, timeout: float, *, said: float | None = None) -> Link:
    """A raw connection to ``url`` (``tls://``, ``unix://``, ``quic://``), TLS or QUIC handshake
    done, no IAC byte sent yet, within ``timeout`` seconds (``said``: the timeout to name when it
    passes). Raises :class:`TransportError` (refused, unreachable, no answer)."""
    scheme = url.split(":", 1)[0]
    try:
        coro = _dial_quic(url, timeout) if scheme == "quic" else _dial_stream(url)
        return await asyncio.wait_for(coro, timeout)
    except TimeoutError:
        raise TransportError(f"{url}: no answer in {said or timeout:g} s") from None
    except (OSError, ssl.SSLError, ConnectionError) as exc:
        raise TransportError(f"{url}: {type(exc).__name__}: {exc}") from None


# --- listening (the tester as server, ``--client``) ----------------------------------------------


class Server:
    """A listening socket that hands every accepted connection, as a :class:`Link`, to a callback."""

    def __init__(
        self, url: str, cert: NodeCertificate, on_link: Callable[[Link], Coroutine[Any, Any, None]]
    ) -> None:
        self.url = url
        self.cert = cert
        self._on_link = on_link
        self._close: Callable[[], None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.address = ""
        #: The QUIC library's server of a ``quic://`` listener (tests wrap what it receives).
        self.quic_server: Any = None

    def _spawn(self, link: Link) -> None:
        task = asyncio.get_running_loop().create_task(self._on_link(link))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> str:
        addr = parse_address(self.url)
        if addr.scheme == "unix":

            async def unix_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                self._spawn(StreamLink("unix", r, w))

            os.makedirs(os.path.dirname(addr.path) or ".", mode=0o700, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(addr.path)
            srv = await asyncio.start_unix_server(unix_conn, addr.path)
            os.chmod(addr.path, 0o600)
            self._close = srv.close
            self.address = f"unix://{addr.path}"
        elif addr.scheme == "tls":

            async def tls_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                link = StreamLink("tls", r, w)
                link.binding = self.cert.binding
                self._spawn(link)

            srv = await asyncio.start_server(
                tls_conn, addr.host, addr.port, ssl=_tls_server_context(self.cert)
            )
            self._close = srv.close
            port = srv.sockets[0].getsockname()[1]
            self.address = f"tls://{addr.host}:{port}"
        elif addr.scheme == "quic":
            from aioquic.asyncio.server import serve

            qc = _quic_config(is_client=False, idle=30.0)
            with self.cert.files() as (cert_file, key_file):
                qc.load_cert_chain(cert_file, key_file)

            def ready(link: QuicLink) -> None:
                link.binding = self.cert.binding
                self._spawn(link)

            qsrv = await serve(addr.host, addr.port, configuration=qc, create_protocol=_quic_protocol(ready))
            self._close = qsrv.close
            self.quic_server = qsrv
            udp: Any = qsrv._transport
            port = udp.get_extra_info("sockname")[1]
            self.address = f"quic://{addr.host}:{port}"
        else:
            raise ConfigError(f"cannot listen on {self.url!r}: tls://, unix:// or quic:// only")
        return self.address

    def close(self) -> None:
        if self._close is not None:
            self._close()
        for task in self._tasks:
            task.cancel()
