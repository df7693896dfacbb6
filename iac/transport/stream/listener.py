"""Accepting stream connections (TLS or UNIX): the handshake limit per source, the HELLO exchange
per socket, then the handler. Every refusal is counted in ``refused`` by reason and logged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from iac.errors import CloseCode, HandshakeError, IacError, ProtocolError
from iac.protocol.handshake import ServerHandshake
from iac.transport.base import Connection, Listener, OnConnection, TransportConfig
from iac.transport.bound import LOG_INTERVAL_S, bound_error
from iac.transport.limits import HandshakeLimiter, busy_error
from iac.transport.session import goaway_frame
from iac.transport.stream.connection import StreamConnection, establish
from iac.transport.stream.protocol import NETWORK_ERRORS, FrameProtocol, describe_error

log = logging.getLogger("iac.transport")


def accept_backlog(config: TransportConfig) -> int:
    """The ``listen(2)`` backlog of a stream listener: connections the kernel completed and
    holds until this side accepts them. asyncio's default, 100, is less than a dial burst: the
    kernel drops the SYNs beyond it and each of those clients sends its SYN again only after a
    second (then 3 s, 7 s), which made every dial of a 1,000-dial TLS burst take over 2 s. Sized
    like ``handshake_backlog`` (the kernel caps it at ``net.core.somaxconn``), at least 128."""
    return max(128, config.handshake_backlog)


class StreamListener(Listener):
    """Accepts stream connections (TLS or UNIX): the handshake limit of the source
    (``source``: UNIX peer uid; TLS checks the IP address before the TLS handshake, through
    :meth:`allow_source`), optional pre-check of the socket (UNIX peer uid), the HELLO
    exchange, then ``on_connection`` in the accepting task."""

    def __init__(
        self,
        *,
        config: TransportConfig,
        transport: str,
        on_connection: OnConnection,
        make_handshake: Callable[[], ServerHandshake],
        describe_peer: Callable[[asyncio.BaseTransport], str],
        precheck: Callable[[asyncio.BaseTransport], ProtocolError | None] | None = None,
        source: Callable[[asyncio.BaseTransport], str] | None = None,
    ) -> None:
        self.addresses: list[str] = []
        self.config = config
        self.transport = transport
        self._on_connection = on_connection
        self._make_handshake = make_handshake
        self._describe_peer = describe_peer
        self._precheck = precheck
        self._source = source
        self.limiter = HandshakeLimiter.from_config(config)
        self._server: asyncio.Server | None = None
        self._conns: set[Connection] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self._slots = asyncio.Semaphore(config.handshake_concurrency)  # HELLO exchanges running
        self._queued = 0  # connections waiting for a slot
        #: Connections refused or failed before the HELLO verified, by reason (the error's
        #: name: ``busy``, ``admission_denied``, ``replayed_hello``, ``transport_error``, ...).
        self.refused: dict[str, int] = {}

    def count_refusal(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def allow_source(self, source: str, peer_url: str) -> bool:
        """Take a handshake token for ``source``; False (counted as ``busy``, logged once per
        burst) when it has none left."""
        if self.limiter.allow(source, asyncio.get_running_loop().time()):
            return True
        self.count_refusal("busy")
        if self.limiter.first_refusal(source):
            log.info(
                "refused %s connections from %s: busy: over the handshake limit", self.transport, peer_url,
                extra={"transport": self.transport, "reason": "busy", "code": "HANDSHAKE_FAILED"},
            )  # fmt: skip
        return False

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
        peer_url = self._describe_peer(transport)
        bound = self.config.connections
        if not bound.try_take(fd=True):
            await self._refuse_over_bound(proto, peer_url)
            return
        released = False

        def release(conn: Connection | None = None) -> None:
            """The connection is over: forgotten, and no longer counted against the bound."""
            nonlocal released
            if conn is not None:
                self._conns.discard(conn)
            if not released:
                released = True
                bound.give(fd=True)

        conn: StreamConnection | None = None
        try:
            conn = await self._establish(proto, peer_url)
            if conn is None:
                return
            conn.on_closed = release
            if not conn.finished:
                self._conns.add(conn)
            await self._run(conn)
        finally:
            if conn is None or conn.finished:
                release(conn)

    async def _refuse_over_bound(self, proto: FrameProtocol, peer_url: str) -> None:
        """A connection over the node's bound: ``busy``, before the HELLO exchange; logged at
        most once per ten seconds, with the count."""
        bound = self.config.connections
        self.count_refusal("busy")
        n = bound.refused(asyncio.get_running_loop().time())
        if n:
            log.warning(
                "refused %d %s connection(s) in the last %.0f s (latest from %s): busy: the node holds "
                "its bound of %d connections", n, self.transport, LOG_INTERVAL_S, peer_url,
                bound.limit(fd=True),
                extra={"transport": self.transport, "reason": "busy", "code": "HANDSHAKE_FAILED"},
            )  # fmt: skip
        await self._refuse(proto, bound_error(bound.limit(fd=True)))

    async def _establish(self, proto: FrameProtocol, peer_url: str) -> StreamConnection | None:
        """The handshake limit, the precheck and the HELLO exchange: the connection, or None
        (refused or failed; counted and logged)."""
        transport = proto.transport
        assert transport is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.handshake_timeout
        if self._source is not None:
            source = self._source(transport)
            if not self.allow_source(source, peer_url):
                await self._refuse(proto, busy_error(source))
                return None
        # Dial bursts: at most handshake_concurrency HELLO exchanges at once, the rest wait in
        # order (at most handshake_backlog of them) within their handshake deadline.
        slots = self._slots
        if slots.locked() and self._queued >= self.config.handshake_backlog:
            self.count_refusal("busy")
            await self._refuse(proto, HandshakeError("busy: too many handshakes waiting; try again later"))
            return None
        self._queued += 1
        try:
            async with asyncio.timeout_at(deadline):
                await slots.acquire()
        except TimeoutError:
            self.count_refusal("handshake_timeout")
            log.info(
                "%s connection from %s: its handshake waited past its deadline", self.transport, peer_url
            )
            transport.abort()
            return None
        finally:
            self._queued -= 1
        try:
            return await self._exchange(proto, peer_url, deadline)
        finally:
            slots.release()

    async def _exchange(
        self, proto: FrameProtocol, peer_url: str, deadline: float
    ) -> StreamConnection | None:
        transport = proto.transport
        assert transport is not None
        try:
            refusal = self._precheck(transport) if self._precheck is not None else None
            if refusal is not None:
                raise refusal
            return await establish(
                proto,
                self._make_handshake(),
                config=self.config,
                transport=self.transport,
                address=peer_url,
                deadline=deadline,
            )
        except ProtocolError as exc:
            self.count_refusal(exc.reason)
            log.info(
                "refused %s connection from %s: %s: %s", self.transport, peer_url, exc.reason, exc,
                extra={"transport": self.transport, "reason": exc.reason, "code": exc.close_code.name},
            )  # fmt: skip
            await self._refuse(proto, exc)
        except IacError as exc:
            self.count_refusal(exc.reason)
            log.info("%s connection from %s failed: %s", self.transport, peer_url, exc)
        except NETWORK_ERRORS as exc:
            self.count_refusal("network_error")
            log.info("%s connection from %s failed: %s", self.transport, peer_url, describe_error(exc))
        return None

    async def _run(self, conn: StreamConnection) -> None:
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

    async def _refuse(self, proto: FrameProtocol, exc: ProtocolError) -> None:
        """A refusal before the HELLO exchange sent anything (limit, precheck): GOAWAY, linger,
        close. (A refusal in the exchange already went out and the socket is closed.)"""
        transport = proto.transport
        if transport is None or transport.is_closing():
            return
        with contextlib.suppress(*NETWORK_ERRORS, IacError):
            await proto.send_frame(goaway_frame(exc.close_code, str(exc)))
        await proto.wait_eof(self.config.linger_timeout)
        await proto.close_transport(0.1)

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


__all__ = ["StreamListener"]
