"""Dialing over QUIC: :func:`dial_quic`, the TLS handshake and the client's HELLO.

1-RTT: wait for the TLS handshake, bind the HELLO to the server certificate's
hash, run the HELLO exchange; ``dial_quic`` returns once both HELLOs verified.

0-RTT: a client given a :class:`ClientTicketStore` resumes with the ticket it got
from the same address, binds its HELLO to the certificate hash stored with the
ticket and sends HELLO and its first frames as early data; ``dial_quic`` returns
at once and the server's HELLO is checked in the background (a refusal closes the
connection; ``send``/``recv`` then raise it). A new ticket is stored only once the
server's HELLO verified.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any, Protocol, cast

from iac.errors import CloseCode, ConfigError, HandshakeError, IacError, ProtocolError, TransportError
from iac.protocol.handshake import ClientHandshake, HelloOrder, HelloParams, channel_binding
from iac.transport.base import Address, PeerInfo, TransportConfig, parse_address
from iac.transport.quic.backend import Backend, SessionTicketLike, get_backend
from iac.transport.quic.configuration import client_configuration
from iac.transport.quic.connection import QuicConn
from iac.transport.quic.protocol import QuicProtocol, protocol_class
from iac.transport.quic.tickets import ClientTicketStore
from iac.transport.session import parse_hello
from iac.wire._pb.iac_pb2 import Hello
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity


class DialSocket(Protocol):
    """A listener whose UDP socket dials can leave from (:class:`~.listener.QuicListener`)."""

    backend: Backend

    @property
    def family(self) -> int | None: ...

    def _attach_dialed(self, proto: QuicProtocol) -> Callable[[], None]: ...


class _Resumption:
    """One dial's session tickets: a ticket the server sends is stored for this address,
    with the certificate hash and AgentId it goes with, once the server's HELLO verified."""

    def __init__(self, store: ClientTicketStore | None, key: str) -> None:
        self.store = store
        self.key = key
        self.conn: QuicConn | None = None
        self._ticket: SessionTicketLike | None = None

    def on_ticket(self, ticket: SessionTicketLike) -> None:
        if self.conn is None:
            return
        self._ticket = ticket
        self.save()

    def save(self) -> None:
        conn = self.conn
        if self._ticket is None or self.store is None or conn is None or not conn.peer_hello_verified:
            return
        self.store.put(self.key, self._ticket, conn._cert_sha256, conn.peer.agent_id)
        self._ticket = None


async def dial_quic(
    url: str | Address,
    identity: Identity,
    *,
    expect: str | None = None,
    config: TransportConfig | None = None,
    tickets: ClientTicketStore | None = None,
    session_id: int = 0,
    backend: str | None = None,
    listener: DialSocket | None = None,
) -> QuicConn:
    """Dial ``quic://host:port``; return the connection once the HELLOs verified.

    With ``tickets`` and a stored ticket for this address (from a server whose
    HELLO verified earlier, and whose AgentId is ``expect`` when given), the
    session resumes: HELLO and the frames sent right after ``dial`` returns go
    as 0-RTT early data, and the server's HELLO is checked in the background
    (a refusal closes the connection; ``send``/``recv`` then raise it).

    ``backend``: the QUIC library (``"aioquic"`` or ``"qh3"``); default: the selected
    one (:func:`set_backend`, ``IAC_QUIC_BACKEND``, else automatic).

    ``listener``: dial from this listener's UDP socket when its address family fits the
    peer's address (else from a socket of the dial's own), so that the peer, and any NAT
    on the way, sees this side at the address it listens on (the listener's backend is
    used; on a QUIC library other than aioquic :data:`~.backend.AIOQUIC_PINNED` this
    raises :class:`~iac.errors.ConfigError`).
    """
    config = config or TransportConfig()
    addr = url if isinstance(url, Address) else parse_address(url)
    if addr.scheme != "quic":
        raise ConfigError(f"{url!r} is not a quic:// address")
    lib = listener.backend if listener is not None else get_backend(backend)
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(config.handshake_timeout):
            infos = await loop.getaddrinfo(addr.host, addr.port, type=socket.SOCK_DGRAM)
    except (OSError, TimeoutError) as exc:
        raise TransportError(f"{url}: cannot resolve {addr.host}: {exc}") from None
    family, _, _, _, sockaddr = infos[0]
    qc = client_configuration(config, addr.host, lib, identity)
    stored = tickets.pop(addr.url) if tickets is not None else None
    if stored is not None and expect is not None and stored.agent_id != expect:
        stored = None
    if stored is not None:
        qc.session_ticket = stored.ticket

    resumption = _Resumption(tickets, addr.url)
    quic = lib.QuicConnection(
        configuration=qc, session_ticket_handler=resumption.on_ticket if tickets is not None else None
    )
    protocol = protocol_class(lib)
    detach: Callable[[], None] | None = None
    if listener is not None and listener.family == family:
        proto = protocol(quic)
        detach = listener._attach_dialed(proto)
    else:
        try:
            _, proto = await loop.create_datagram_endpoint(
                lambda: protocol(quic), remote_addr=cast(tuple[str, int], sockaddr), family=family
            )
        except OSError as exc:
            raise TransportError(f"{url}: {exc.strerror or exc}") from None
    conn = QuicConn(
        proto,
        identity,
        config,
        dialed=True,
        address=addr.url,
        on_finished=None if detach is None else (lambda _conn: detach()),
    )
    conn.shared_socket = detach is not None
    proto.conn = conn
    resumption.conn = conn
    try:
        return await _dial_handshake(
            conn,
            proto,
            resumption,
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
        if detach is not None:
            detach()
        elif proto._transport is not None:
            proto._transport.close()
        raise


async def _dial_handshake(
    conn: QuicConn,
    proto: QuicProtocol,
    resumption: _Resumption,
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
                await conn._wait_tls()
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
        conn._handshake_task = loop.create_task(_finish_early(conn, hs, deadline, resumption))
        return conn
    try:
        hello = await conn._exchange_hellos(hs, deadline)
    except TimeoutError:
        raise TransportError(f"{conn.address}: HELLO exchange timed out") from None
    except ProtocolError as exc:
        conn._refused(exc)
        raise
    conn._hello_verified(hs, hello)
    if conn._error is not None:  # a frame that came with the HELLO closed the connection
        raise conn._error
    resumption.save()
    return conn


async def _finish_early(
    conn: QuicConn, hs: ClientHandshake, deadline: float, resumption: _Resumption
) -> None:
    """The rest of a 0-RTT handshake: read and check the server's HELLO."""
    try:
        hello = await conn._exchange_hellos(hs, deadline, initial_sent=True)
    except ProtocolError as exc:
        if not conn._control.goaway_sent and conn._error is None:
            conn._error = exc  # the server refused: send/recv raise its typed error, as dial would
        conn._refused(exc)
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
    conn._hello_verified(hs, hello)  # resumed: what the TLS handshake says (the server may refuse)
    conn.early_data_accepted = accepted = conn.backend.early_data_accepted(conn._quic)
    if conn.on_early_outcome is not None:
        conn.on_early_outcome(accepted)
    resumption.save()


__all__ = ["dial_quic"]
