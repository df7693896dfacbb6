"""The QUIC server: :class:`QuicListener` and :func:`listen_quic`.

One UDP socket serves many connections. Before the library's server takes a
datagram that would open a new connection, the listener applies the handshake
limit of its source address and decides whether to answer with Retry (address
validation; ``TransportConfig.quic_retry``). Each new QUIC connection gets a
:class:`QuicConn` at once, and the listener runs its HELLO exchange: a refusal
closes it (counted in ``refused`` by reason and logged), a verified peer goes to
``on_connection`` in a task of its own. Session tickets are single-use
(:class:`ServerTicketStore`), kept in ``TransportConfig.ticket_store`` when set.

CA mode (``ca_file``): the server asks for a client certificate on every full
handshake and verifies the chain against the CA itself when the client's HELLO
arrives (aioquic neither asks on its own nor verifies, and accepts an empty
certificate); a client without a valid chain is refused with
``admission_denied``. A session ticket carries the chain its session verified,
and a resumption (0-RTT included) is allowed only while that chain still verifies.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from iac.errors import CloseCode, ConfigError, HandshakeError, TransportError
from iac.protocol.handshake import channel_binding
from iac.protocol.records import is_ip_literal
from iac.transport.base import Address, Listener, OnConnection, TransportConfig, parse_address
from iac.transport.bound import LOG_INTERVAL_S, bound_error
from iac.transport.certs import verify_client_chain
from iac.transport.limits import HandshakeLimiter, RetryGate
from iac.transport.quic.backend import AIOQUIC_PINNED, Backend, SessionTicketLike, get_backend
from iac.transport.quic.configuration import server_configuration
from iac.transport.quic.connection import QuicConn, quic_url
from iac.transport.quic.dial import dial_quic
from iac.transport.quic.protocol import QuicProtocol, protocol_class
from iac.transport.quic.reset import (
    CHECK_BURST,
    CHECK_RATE,
    RESET_BURST,
    RESET_RATE,
    Bucket,
    ResetStats,
    ResetTokens,
    build_reset,
    may_be_reset,
)
from iac.transport.quic.tickets import ServerTicketStore
from iac.transport.session import nonce_cache
from iac.wire.identity import Identity

log = logging.getLogger("iac.transport.quic")
#: Queued connections a listener starts in one event-loop turn (each costs a TLS handshake step).
_STARTS_PER_TURN = 8


def initial_dcid(data: bytes) -> bytes:
    """The destination connection ID of a long-header packet (RFC 8999: its length at byte 5,
    itself from byte 6), what names a dial until the server's first answer."""
    return data[6 : 6 + data[5]] if len(data) > 6 else b""


@dataclass
class _ClientAuth:
    """One connection's client identity in CA mode: the chain a resumed session's ticket
    carried (None: not resumed from a ticket)."""

    resumed_chain: tuple[bytes, ...] | None = None


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
        self.nonce_cache = nonce_cache(config)  # the one every listener of this config uses
        self.limiter = HandshakeLimiter.from_config(config)
        self.retry = RetryGate(config.quic_retry, config.retry_threshold)
        self.ca_file = config.ca_file
        self.addresses: list[str] = []
        self._server: Any = None  # the library's QuicServer
        self._conns: set[QuicConn] = set()
        self._counted: set[QuicConn] = set()  # counted against the node's connection bound
        self._over: set[QuicConn] = set()  # over it: refused busy when their HELLO arrives
        #: Connections in their handshake (TLS and HELLO), and new connections waiting to start
        #: (their first datagram by dial: source address and destination connection ID, oldest
        #: first; ``handshake_backlog``).
        self._handshaking: set[QuicConn] = set()
        #: Each with whether the library's server takes it with Retry tokens checked.
        self._waiting: OrderedDict[tuple[Any, bytes], tuple[Any, bytes, float, bool]] = OrderedDict()
        #: Dials given up on (dropped from the queue, or refused before their HELLO verified),
        #: by (address, destination connection ID), until when: their client's later Initials
        #: (its retransmissions, the close of the attempt it gave up) are dropped instead of
        #: opening a connection of their own.
        self._gone: OrderedDict[tuple[Any, bytes], float] = OrderedDict()
        #: The dial the library's server is about to open a connection for, and each
        #: handshaking connection's.
        self._opening: tuple[Any, bytes] | None = None
        self._dial_of: dict[QuicConn, tuple[Any, bytes]] = {}
        self._drain_handle: asyncio.Handle | None = None
        #: While a queued datagram is handed to the library's server: when it arrived.
        self._arrived: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Connections refused before or during the HELLO exchange, by reason (``busy``,
        #: ``replayed_hello``, ``admission_denied``, ``handshake_timeout``, ...).
        self.refused: dict[str, int] = {}
        #: New connections answered with Retry instead of a handshake.
        self.retries = 0
        #: Initial datagrams of dials already given up on, dropped (``_gone``).
        self.stale = 0
        self.accepted = 0
        self.cert_der = b""
        self.cert_sha256 = b""
        self.configuration: Any = None  # the library's QuicConfiguration
        #: Datagrams for connection IDs this socket does not know: stateless resets sent and
        #: received (:mod:`.reset`), within their rate bounds.
        self.resets = ResetStats()
        self._reset_tokens = ResetTokens(identity.seed())
        self._reset_checks = Bucket(CHECK_RATE, CHECK_BURST)
        self._reset_sends = Bucket(RESET_RATE, RESET_BURST)

    async def start(self, addr: Address) -> None:
        """Bind the UDP socket at ``addr`` and serve (:func:`listen_quic` calls this)."""
        lib = self.backend
        if self.ca_file is not None and (
            lib.request_client_certificate is None
            or lib.peer_certificate_chain is None
            or lib.connection_tickets is None
        ):
            raise ConfigError(
                f"CA mode over QUIC needs aioquic {AIOQUIC_PINNED} (the QUIC library in use, "
                f"{lib.name} {lib.version}, cannot be made to verify client certificates)"
            )
        qc, self.cert_der = server_configuration(self.identity, self.config, lib)
        self.configuration = qc
        self.cert_sha256 = channel_binding(self.cert_der)
        per_connection = lib.connection_tickets is not None
        try:
            if lib.initial_gate is not None and lib.set_retry is not None and lib.QuicServer is not None:
                server_cls = _gated_server(lib)
                _, self._server = await asyncio.get_running_loop().create_datagram_endpoint(
                    lambda: server_cls(configuration=qc, create_protocol=self._protocol_factory()),
                    local_addr=(addr.host, addr.port),
                )
                self._server.iac_gate = self._admit_datagram
            else:  # qh3: no limit before the handshake, no Retry
                self._server = await lib.serve(
                    addr.host,
                    addr.port,
                    configuration=qc,
                    create_protocol=self._protocol_factory(),
                    session_ticket_fetcher=None if per_connection else self.tickets.fetch,
                    session_ticket_handler=None if per_connection else self.tickets.add,
                )
        except OSError as exc:
            raise TransportError(f"cannot listen on {addr.url}: {exc.strerror or exc}") from None
        transport = lib.server_transport(self._server)
        assert transport is not None
        sockname = transport.get_extra_info("sockname")
        self.addresses = [Address("quic", host=addr.host, port=sockname[1]).url]

    # -- dials from this socket ------------------------------------------------------------------

    @property
    def family(self) -> int | None:
        """The address family of the listener's socket (None once closed)."""
        server = self._server
        transport = None if server is None else self.backend.server_transport(server)
        if transport is None or transport.is_closing():
            return None
        sock = transport.get_extra_info("socket")
        return None if sock is None else int(sock.family)

    @property
    def can_dial(self) -> bool:
        """Whether dials can leave from this listener's socket (aioquic :data:`AIOQUIC_PINNED`)."""
        return self.backend.attach_dialed is not None and self.family is not None

    def check_dial(self) -> None:
        """Raise :class:`~iac.errors.ConfigError` unless dials can leave from this socket."""
        lib = self.backend
        if lib.attach_dialed is None:
            raise ConfigError(
                f"dialing from a QUIC listener's socket needs aioquic {AIOQUIC_PINNED} (the QUIC "
                f"library in use is {lib.name} {lib.version}); set NodeConfig.one_socket=False "
                "to dial from a socket per connection"
            )
        if self._server is None:
            raise TransportError("the QUIC listener is closed")

    def attach_dialed(self, proto: QuicProtocol) -> Callable[[], None]:
        """Put a dialed connection on this listener's socket; return what takes it off."""
        self.check_dial()
        assert self.backend.attach_dialed is not None
        return self.backend.attach_dialed(self._server, proto)

    def punch(self, dest: tuple[str, int], data: bytes = b"\x00") -> bool:
        """Send one punch datagram from this listener's socket to ``dest`` (host, port), so that
        a NAT in front of this side opens a mapping toward it (docs/PROTOCOL.md, "Through
        NATs"). False when the socket is closed or cannot reach ``dest``'s address family."""
        if not is_ip_literal(dest[0]):  # a host name: sendto would resolve it, blocking the loop
            return False
        server = self._server
        transport = None if server is None else self.backend.server_transport(server)
        if transport is None or transport.is_closing():
            return False
        host = dest[0]
        if (":" in host) != (self.family == socket.AF_INET6):
            return False
        transport.sendto(data, dest)
        return True

    async def dial(
        self,
        url: str | Address,
        *,
        expect: str | None = None,
        tickets: Any = None,
        session_id: int = 0,
        config: TransportConfig | None = None,
    ) -> QuicConn:
        """Dial ``url`` from this listener's UDP socket (:func:`~iac.transport.quic.dial_quic`
        with ``listener=self``): the peer sees this side at the listener's address."""
        return await dial_quic(
            url,
            self.identity,
            expect=expect,
            config=config or self.config,
            tickets=tickets,
            session_id=session_id,
            backend=self.backend.name,
            listener=self,
        )

    # -- before the library's server: handshake limit and Retry --------------------------------

    def _admit_datagram(self, server: Any, data: bytes, addr: Any) -> bool:
        """Whether the library's server may take this datagram. Only a datagram that would
        open a connection is judged: it counts toward the Retry threshold; with Retry on and
        no token it is answered with Retry (not counted against its source, which may be
        spoofed); otherwise it takes a token from its source's bucket or is dropped."""
        lib = self.backend
        if data and not data[0] & 0x80 and lib.resets is not None:  # a short header
            return self._short_header(server, data, addr)
        assert lib.initial_gate is not None and lib.set_retry is not None
        new, token = lib.initial_gate(server, data)
        if not new:
            return True
        now = asyncio.get_running_loop().time()
        dial = (addr, initial_dcid(data))
        if self._is_gone(dial, now):
            self.stale += 1
            return False
        self._opening = None
        self.retry.observe(now)
        retry = self.retry.active(now)
        checked = bool(retry or (token and self.retry.mode != "never"))
        lib.set_retry(server, checked)
        if retry and not token:
            self.retries += 1
            # a first Initial of this source still queued is void now: the client answers the
            # Retry with a new Initial (new connection ID, the token), which takes its place
            self._waiting.pop(dial, None)
            return True
        source = str(addr[0])
        if self.limiter.allow(source, now):
            return self._start_or_queue(server, data, dial, now, checked)
        self._count("busy")
        if self.limiter.first_refusal(source):
            log.info(
                "refused quic connections from %s: busy: over the handshake limit", quic_url(addr),
                extra={"transport": "quic", "reason": "busy"},
            )  # fmt: skip
        return False

    # -- stateless reset (RFC 9000 10.3, :mod:`.reset`) ----------------------------------------

    def _short_header(self, server: Any, data: bytes, addr: Any) -> bool:
        """A short-header datagram: the library's server takes it when its connection ID is
        known (a connection ID a connection issued is in the table before the frame that
        issues it reaches the peer: :meth:`.QuicProtocol.transmit`). Otherwise (within
        :data:`~.reset.CHECK_RATE`) it is a stateless reset of a connection toward its sender
        (which then ends), or a packet for a connection this node lost (a restart): answered
        with a stateless reset, within :data:`~.reset.RESET_RATE`, always shorter than the
        packet."""
        lib = self.backend
        hooks = lib.resets
        assert hooks is not None
        cid = hooks.unknown(server, data)
        if cid is None:
            return True
        stats = self.resets
        now = asyncio.get_running_loop().time()
        if not self._reset_checks.take(now):
            stats.unanswered += 1
            return False
        if may_be_reset(data):
            for proto in hooks.protocols(server):
                conn = proto.conn
                if conn is not None and lib.peer_address(proto.quic) == addr and conn.stateless_reset(data):
                    stats.received += 1
                    return False
            stats.ignored += 1
        reset = build_reset(self._reset_tokens(cid), len(data)) if self._reset_sends.take(now) else None
        transport = lib.server_transport(server)
        if reset is None or transport is None or transport.is_closing():
            stats.unanswered += 1
            return False
        transport.sendto(reset, addr)
        stats.sent += 1
        return False

    # -- dial bursts: handshakes queued, a few started per loop turn ---------------------------

    def _start_or_queue(
        self, server: Any, data: bytes, dial: tuple[Any, bytes], now: float, checked: bool
    ) -> bool:
        """A new connection's first datagram (``dial``: its source address and destination
        connection ID): take it now while fewer than ``handshake_concurrency`` handshakes run
        and none wait; else queue it, or drop it when the queue is full. A dial keeps its first
        datagram (the client's first Initial, which carries its ClientHello: a later one may be
        only an ACK or the close of a dial it gave up, and would not open a connection); dials
        from one address (a node dialing from its listener's socket) queue side by side.
        ``checked``: whether the library's server is to check its Retry token (set again when
        it is started: the switch is the server's, and the datagrams taken in between set it
        for themselves)."""
        waiting = self._waiting
        if not waiting and len(self._handshaking) < self.config.handshake_concurrency:
            self._opening = dial
            return True
        if dial not in waiting:
            if len(waiting) < self.config.handshake_backlog:
                waiting[dial] = (server, data, now, checked)
            else:
                self._count("handshake_backlog")
        return False

    def _give_up(self, dial: tuple[Any, bytes], now: float) -> None:
        """Remember a dial given up on for ``handshake_timeout`` (its client gives up on it by
        then), at most ``handshake_backlog`` + ``handshake_concurrency`` of them."""
        gone = self._gone
        gone[dial] = now + self.config.handshake_timeout
        gone.move_to_end(dial)
        while len(gone) > self.config.handshake_backlog + self.config.handshake_concurrency:
            gone.popitem(last=False)

    def _is_gone(self, dial: tuple[Any, bytes], now: float) -> bool:
        gone = self._gone
        while gone:  # the oldest first: they expire in order
            first, until = next(iter(gone.items()))
            if until > now:
                break
            del gone[first]
        return dial in gone

    def _handshake_done(self, conn: QuicConn, *, refused: bool = False) -> None:
        dial = self._dial_of.pop(conn, None)
        if refused and dial is not None:  # its client's later Initials must not open another
            self._give_up(dial, asyncio.get_running_loop().time())
        if conn in self._handshaking:
            self._handshaking.discard(conn)
            if self._waiting and self._drain_handle is None:
                self._drain_handle = asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        """Start queued connections while there is room, at most :data:`_STARTS_PER_TURN` in
        this loop turn; those that waited longer than half of ``handshake_timeout`` are dropped
        (their client is about to give up on them, and dials again with a new one)."""
        self._drain_handle = None
        lib = self.backend
        loop = asyncio.get_running_loop()
        now = loop.time()
        waiting = self._waiting
        started = 0
        while (
            waiting
            and started < _STARTS_PER_TURN
            and len(self._handshaking) < self.config.handshake_concurrency
        ):
            dial, (server, data, since, checked) = waiting.popitem(last=False)
            if now - since > self.config.handshake_timeout / 2 or server is not self._server:
                self._count("handshake_backlog")
                self._give_up(dial, now)
                continue
            assert lib.QuicServer is not None and lib.set_retry is not None
            lib.set_retry(server, checked)  # else a token answering a Retry is not checked
            self._arrived = since  # the connection it opens is due its HELLO counting from then
            self._opening = dial
            try:
                lib.QuicServer.datagram_received(server, data, dial[0])
            finally:
                self._arrived = self._opening = None
            started += 1
        if waiting and len(self._handshaking) < self.config.handshake_concurrency:
            self._drain_handle = loop.call_soon(self._drain)

    # -- each connection -----------------------------------------------------------------------

    def _protocol_factory(self) -> Callable[..., QuicProtocol]:
        """For the library's server: each new QUIC connection gets a protocol carrying a
        :class:`QuicConn`, whose HELLO exchange starts at once."""
        lib = self.backend
        protocol = protocol_class(lib)

        def create(quic: Any, stream_handler: Any = None) -> QuicProtocol:
            proto = protocol(quic)
            conn = QuicConn(proto, self.identity, self.config, dialed=False, on_finished=self._forget)
            proto.conn = conn
            self._handshaking.add(conn)
            if self._opening is not None:
                self._dial_of[conn] = self._opening
                self._opening = None
            auth = _ClientAuth()
            if lib.connection_tickets is not None:
                lib.connection_tickets(
                    quic,
                    lambda label: self._fetch_ticket(auth, label),
                    lambda ticket: self._keep_ticket(quic, auth, ticket),
                )
            if self.ca_file is not None and lib.request_client_certificate is not None:
                lib.request_client_certificate(quic)
            precheck = self._client_certificate_check(conn, auth)
            if self.config.connections.try_take(fd=False):
                self._counted.add(conn)
            else:
                self._over.add(conn)
                precheck = self._over_bound(conn)
            conn.accept(
                binding=self.cert_sha256,
                precheck=precheck,
                on_open=self._accepted,
                on_refused=self._refused,
                arrived=self._arrived,
            )
            return proto

        return create

    def _over_bound(self, conn: QuicConn) -> Callable[[], None]:
        """The refusal of a connection over the node's bound: ``busy`` when the client's HELLO
        arrives (before its signature is checked), closed with that code; logged at most once
        per ten seconds, with the count."""
        bound = self.config.connections

        def refuse() -> None:
            n = bound.refused(asyncio.get_running_loop().time())
            if n:
                log.warning(
                    "refused %d quic connection(s) in the last %.0f s (latest from %s): busy: the node "
                    "holds its bound of %d connections", n, LOG_INTERVAL_S, conn.address or "?",
                    bound.limit(fd=False),
                    extra={"transport": "quic", "reason": "busy", "code": "HANDSHAKE_FAILED"},
                )  # fmt: skip
            raise bound_error(bound.limit(fd=False))

        return refuse

    def _fetch_ticket(self, auth: _ClientAuth, label: bytes) -> SessionTicketLike | None:
        """The library asks for a ticket to resume with. In CA mode a ticket resumes only
        while the client chain it carries still verifies (else a full handshake asks for a
        certificate again)."""
        issued = self.tickets.take(label)
        if issued is None:
            return None
        if self.ca_file is not None:
            try:
                verify_client_chain(issued.client_chain, self.ca_file)
            except HandshakeError as exc:
                log.info("quic session ticket not resumed: %s", exc)
                return None
            auth.resumed_chain = issued.client_chain
        return issued.ticket

    def _keep_ticket(self, quic: Any, auth: _ClientAuth, ticket: SessionTicketLike) -> None:
        """The library issued a ticket (after the client's Finished). In CA mode it is kept
        with the client chain this session verified, and not kept without one."""
        chain: tuple[bytes, ...] = ()
        if self.ca_file is not None:
            lib = self.backend
            if lib.session_resumed(quic):
                if auth.resumed_chain is None:
                    return
                chain = auth.resumed_chain
            else:
                assert lib.peer_certificate_chain is not None
                chain = tuple(lib.peer_certificate_chain(quic))
                try:
                    verify_client_chain(chain, self.ca_file)
                except HandshakeError:
                    return  # the HELLO exchange refuses the connection
        self.tickets.add(ticket, chain)

    def _client_certificate_check(self, conn: QuicConn, auth: _ClientAuth) -> Callable[[], None] | None:
        """CA mode: the check that runs when the client's HELLO arrives (then the TLS session
        is either resumed from a ticket whose chain verified, or a full handshake that ended
        with the client's certificate, if any)."""
        ca_file = self.ca_file
        lib = self.backend
        if ca_file is None or lib.peer_certificate_chain is None:
            return None
        chain_of = lib.peer_certificate_chain

        def check() -> None:
            if lib.session_resumed(conn.quic):
                if auth.resumed_chain is None:
                    raise HandshakeError(
                        "resumed session without a verified client certificate", reason="admission_denied"
                    )
                return
            verify_client_chain(chain_of(conn.quic), ca_file)

        return check

    def _count(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def _refused(self, conn: QuicConn, reason: str, detail: str) -> None:
        self._handshake_done(conn, refused=True)
        if conn in self._over:  # over the node's bound: counted as busy, logged by _over_bound
            self._over.discard(conn)
            self._count("busy")
            return
        self._count(reason)
        log.info(
            "refused quic connection from %s: %s: %s", conn.address or "?", reason, detail,
            extra={"transport": "quic", "reason": reason},
        )  # fmt: skip

    def connections(self) -> list[QuicConn]:
        return [c for c in self._conns if not c.closed]

    def _accepted(self, conn: QuicConn) -> None:
        self._handshake_done(conn)
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
        self._handshake_done(conn)
        self._over.discard(conn)
        self._conns.discard(conn)
        if conn in self._counted:
            self._counted.discard(conn)
            self.config.connections.give(fd=False)

    async def close(self) -> None:
        conns = list(self._conns)
        await asyncio.gather(*(c.close(CloseCode.GOING_AWAY, "listener closing") for c in conns))
        for task in list(self._tasks):
            task.cancel()
        self._waiting.clear()
        self._gone.clear()
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None
        if self._server is not None:
            self._server.close()
            self._server = None


_gated: dict[str, type[Any]] = {}


def _gated_server(lib: Backend) -> type[Any]:
    """The library's server class, with the listener's look at each datagram first."""
    cls = _gated.get(lib.name)
    if cls is None:
        base = lib.QuicServer
        assert base is not None

        def datagram_received(self: Any, data: bytes, addr: Any) -> None:
            gate = self.iac_gate
            if gate is None or gate(self, data, addr):
                base.datagram_received(self, data, addr)

        cls = type(
            f"_{lib.name}GatedServer",
            (base,),
            {"iac_gate": None, "datagram_received": datagram_received, "__module__": __name__},
        )
        _gated[lib.name] = cls
    return cls


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

    ``tickets``: the server's session-ticket store; default: one over
    ``config.ticket_store`` (in memory when None), every ticket single-use. Pass
    ``ServerTicketStore(reuse=True)`` only in tests.
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
        tickets if tickets is not None else ServerTicketStore(config.ticket_store),
        get_backend(backend),
    )
    await listener.start(addr)
    return listener


__all__ = ["QuicListener", "listen_quic"]
