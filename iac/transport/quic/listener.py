"""The QUIC server: :class:`QuicListener` and :func:`listen_quic`.

One UDP socket serves many connections. Each new QUIC connection gets a
:class:`QuicConn` at once, and the listener runs its HELLO exchange: a refusal
closes it (and is counted in ``refused`` by error name), a verified peer goes to
``on_connection`` in a task of its own. Session tickets are single-use by default
(:class:`ServerTicketStore`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from iac.errors import CloseCode, ConfigError, ConnectionClosed, IacError, ProtocolError, TransportError
from iac.protocol.handshake import HelloOrder, NonceCache, ServerHandshake, channel_binding
from iac.transport.base import Address, Listener, OnConnection, TransportConfig, parse_address
from iac.transport.quic.backend import Backend, get_backend
from iac.transport.quic.configuration import server_configuration
from iac.transport.quic.connection import QuicConn
from iac.transport.quic.protocol import QuicProtocol, protocol_class
from iac.transport.quic.tickets import ServerTicketStore
from iac.wire.identity import Identity


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
        qc, self.cert_der = server_configuration(self.identity, self.config, lib)
        self.configuration = qc
        self.cert_sha256 = channel_binding(self.cert_der)
        try:
            self._server = await lib.serve(
                addr.host,
                addr.port,
                configuration=qc,
                create_protocol=self._protocol_factory(),
                session_ticket_fetcher=self.tickets.fetch,
                session_ticket_handler=self.tickets.add,
            )
        except OSError as exc:
            raise TransportError(f"cannot listen on {addr.url}: {exc.strerror or exc}") from None
        transport = self._server._transport
        assert transport is not None
        sockname = transport.get_extra_info("sockname")
        self.addresses = [Address("quic", host=addr.host, port=sockname[1]).url]

    def _protocol_factory(self) -> Callable[..., QuicProtocol]:
        """For the library's server: each new QUIC connection gets a protocol carrying a
        :class:`QuicConn`, whose HELLO exchange starts at once."""
        protocol = protocol_class(self.backend)

        def create(quic: Any, stream_handler: Any = None) -> QuicProtocol:
            proto = protocol(quic)
            conn = QuicConn(proto, self.identity, self.config, dialed=False, on_finished=self._forget)
            conn._cert_sha256 = self.cert_sha256
            proto.conn = conn
            conn._handshake_task = asyncio.get_running_loop().create_task(self._handshake(conn))
            return proto

        return create

    async def _handshake(self, conn: QuicConn) -> None:
        """One connection's HELLO exchange; a verified peer goes to ``on_connection``."""
        config = conn.config
        hs = ServerHandshake(
            conn.identity,
            HelloOrder.CLIENT_FIRST,
            params=conn._params(),
            binding=channel_binding(self.cert_der),
            max_skew_us=config.max_skew_us,
            hook=config.hello_hook,
            nonce_cache=self.nonce_cache,
            admission=config.admission,
        )
        try:
            hello = await conn._exchange_hellos(hs, conn._loop.time() + config.handshake_timeout)
        except ProtocolError as exc:
            self.refused[exc.name] = self.refused.get(exc.name, 0) + 1
            conn._refused(exc)
            return
        except TimeoutError:
            conn._error = ConnectionClosed("HELLO did not arrive in time", int(CloseCode.HANDSHAKE_FAILED))
            conn._abort(int(CloseCode.HANDSHAKE_FAILED), "HELLO timeout", goaway=True)
            return
        except IacError:
            conn._abort(int(CloseCode.HANDSHAKE_FAILED), "handshake failed", goaway=False)
            return
        conn._hello_verified(hs, hello)
        self._accepted(conn)

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


__all__ = ["QuicListener", "listen_quic"]
