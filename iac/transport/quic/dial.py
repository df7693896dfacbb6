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

from iac.errors import ConfigError, TransportError
from iac.transport.base import Address, TransportConfig, parse_address
from iac.transport.quic.backend import Backend, SessionTicketLike, get_backend
from iac.transport.quic.configuration import client_configuration
from iac.transport.quic.connection import QuicConn
from iac.transport.quic.dialslots import dial_slots
from iac.transport.quic.protocol import QuicProtocol, protocol_class
from iac.transport.quic.tickets import ClientTicketStore
from iac.wire.identity import Identity


class DialSocket(Protocol):
    """A listener whose UDP socket dials can leave from (:class:`~.listener.QuicListener`)."""

    backend: Backend

    @property
    def family(self) -> int | None: ...

    def attach_dialed(self, proto: QuicProtocol) -> Callable[[], None]: ...


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
        self.store.put(self.key, self._ticket, conn.channel_binding, conn.peer.agent_id)
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

    Dial bursts: at most ``config.quic_dial_concurrency`` handshakes run at once per event
    loop; a dial beyond waits its turn first (:mod:`~iac.transport.quic.dialslots`), and its
    ``handshake_timeout`` counts from then.

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
    # at most quic_dial_concurrency handshakes per event loop; handshake_timeout starts after the wait
    async with dial_slots(loop).slot(config.quic_dial_concurrency):
        return await _dial(
            addr, sockaddr, family, identity, expect, config, tickets, session_id, lib, listener
        )


async def _dial(
    addr: Address,
    sockaddr: Any,
    family: int,
    identity: Identity,
    expect: str | None,
    config: TransportConfig,
    tickets: ClientTicketStore | None,
    session_id: int,
    lib: Backend,
    listener: DialSocket | None,
) -> QuicConn:
    """The dial once it holds its handshake slot: the connection, once the HELLOs verified (or
    the 0-RTT HELLO went)."""
    loop = asyncio.get_running_loop()
    url = addr.url
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
        detach = listener.attach_dialed(proto)
    else:
        try:
            _, proto = await loop.create_datagram_endpoint(
                lambda: protocol(quic), remote_addr=cast(tuple[str, int], sockaddr), family=family
            )
        except OSError as exc:
            raise TransportError(f"{url}: {exc.strerror or exc}") from None
        proto.checks_resets = True
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
        await conn.connect(
            sockaddr,
            expect=expect,
            session_id=session_id,
            resumed=None if stored is None else (stored.cert_sha256, stored.agent_id),
            on_verified=resumption.save,
        )
    except BaseException:
        conn.abandon("dial failed")
        if detach is not None:
            detach()
        raise
    return conn


__all__ = ["dial_quic"]
