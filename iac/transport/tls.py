"""TLS 1.3 over TCP: ALPN ``iac/1``, frames back to back, the client's HELLO first.

Default mode: each node presents a self-signed certificate (made at start) and
the client does not verify it against any CA; the HELLO's channel binding —
SHA-256 of the server certificate as each side saw it, signed by both agents —
is what defeats a relay in the middle. The client reads the server certificate
after the TLS handshake (``getpeercert(binary_form=True)``).

CA mode (``config.ca_file`` plus ``cert_file``/``key_file``): both sides present
CA-signed certificates and verify the peer's chain against the CA, in addition
to the binding. A server refuses a client certificate in the TLS handshake with
an alert (certificate required, unknown CA, certificate expired, ...); the
client reports it in its error. (asyncio drops the alert of a failed server-side
handshake and only closes the socket, so the listener runs its own subclass of
asyncio's TLS protocol, :class:`_ServerTLS`, which sends it first.)

The listener applies the handshake limit (``handshake_rate``) to each source IP
address when the TCP connection arrives, before the TLS handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import ssl
from asyncio import sslproto
from collections import OrderedDict
from typing import Any, cast

from iac.errors import ConfigError, ConnectionClosed, IacError, TransportError
from iac.protocol.handshake import ALPN, HelloOrder, ServerHandshake, channel_binding
from iac.transport.base import (
    Address,
    Connection,
    Listener,
    OnConnection,
    TransportConfig,
    format_host,
)
from iac.transport.certs import NodeCertificate, node_certificate
from iac.transport.debug import keylog_path, set_tls_keylog
from iac.transport.session import client_handshake, server_handshake
from iac.transport.stream.connection import connect_errors, establish
from iac.transport.stream.listener import StreamListener, accept_backlog
from iac.transport.stream.protocol import FrameProtocol
from iac.wire.identity import Identity

log = logging.getLogger("iac.transport")


def _base_context(purpose: int) -> ssl.SSLContext:
    ctx = ssl.SSLContext(purpose)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.set_alpn_protocols([ALPN])
    set_tls_keylog(ctx)  # SSLKEYLOGFILE, when set
    return ctx


def _require_ca(ctx: ssl.SSLContext, ca_file: str) -> None:
    """CA mode: the peer must present a certificate that chains to ``ca_file``."""
    try:
        ctx.load_verify_locations(ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{ca_file}: cannot load CA: {exc}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED


def server_context(cert: NodeCertificate, config: TransportConfig) -> ssl.SSLContext:
    ctx = _base_context(ssl.PROTOCOL_TLS_SERVER)
    cert.load_into(ctx)
    if config.ca_file:
        _require_ca(ctx, config.ca_file)
    return ctx


#: The client contexts built, most recently used last (a dial builds none: see client_context).
_CLIENT_CONTEXTS: OrderedDict[tuple[object, ...], ssl.SSLContext] = OrderedDict()
#: At most this many are kept (one per identity and configuration a process dials with).
MAX_CLIENT_CONTEXTS = 16


def _file_key(path: str | None) -> tuple[object, ...] | None:
    """A file as a context depends on it: its path, and its size and mtime (a rewritten CA,
    certificate or key file builds a new context)."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return (path,)
    return (path, st.st_size, st.st_mtime_ns)


def client_context(identity: Identity, config: TransportConfig) -> ssl.SSLContext:
    """The context this side dials with, built once per identity, CA mode files (while they
    are unchanged) and key log file, and then shared by every dial: building one is work of
    OpenSSL's that the first dial of a process would otherwise pay (the node builds it at
    ``start()`` and ``add_peer``, :func:`prepare_dial`)."""
    key = (
        identity.agent_id,
        _file_key(config.ca_file),
        _file_key(config.cert_file),
        _file_key(config.key_file),
        keylog_path(),
    )
    ctx = _CLIENT_CONTEXTS.get(key)
    if ctx is not None:
        _CLIENT_CONTEXTS.move_to_end(key)
        return ctx
    ctx = _new_client_context(identity, config)
    _CLIENT_CONTEXTS[key] = ctx
    while len(_CLIENT_CONTEXTS) > MAX_CLIENT_CONTEXTS:
        _CLIENT_CONTEXTS.popitem(last=False)
    return ctx


def prepare_dial(identity: Identity, config: TransportConfig) -> None:
    """Build the context a TLS dial of ``identity`` with ``config`` uses, before the first dial
    (what fails is the dial's to report: it builds the context again)."""
    with contextlib.suppress(IacError, OSError, ValueError):
        client_context(identity, config)


def _new_client_context(identity: Identity, config: TransportConfig) -> ssl.SSLContext:
    ctx = _base_context(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    if config.ca_file:
        _require_ca(ctx, config.ca_file)
        node_certificate(identity.agent_id, config.cert_file, config.key_file).load_into(ctx)
    else:
        ctx.verify_mode = ssl.CERT_NONE  # the channel binding secures the connection
    return ctx


def set_keepalive(sock: socket.socket | None, interval: float) -> None:
    """TCP keep-alive probes after ``interval`` s of silence, 3 probes ``interval`` apart."""
    if sock is None:
        return
    secs = max(1, int(interval))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, secs)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, secs)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except OSError:
        pass


def _peer_url(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"tls://{format_host(str(peer[0]))}:{peer[1]}"
    return "tls://?"


def tls_alert(exc: BaseException | None) -> str | None:
    """The TLS alert an SSL error reports (``"certificate required"``), or None."""
    if not isinstance(exc, ssl.SSLError):
        return None
    match = re.search(r"ALERT_([A-Z0-9_]+)", exc.reason or str(exc))
    return match.group(1).lower().replace("_", " ") if match else None


def _refused_by_alert(url: str, alert: str) -> ConnectionClosed:
    hint = ""
    if "certificate" in alert or alert in ("unknown ca", "access denied"):
        hint = (
            ": the server refused this client's certificate (in CA mode it accepts only a "
            "certificate that chains to its CA: TransportConfig ca_file, cert_file, key_file)"
        )
    return ConnectionClosed(f"{url}: TLS alert from the server: {alert}{hint}", None, f"tls alert: {alert}")


#: asyncio's TLS protocol has what :class:`_ServerTLS` extends (Python 3.11 to 3.13 do).
_SERVER_TLS_OK = all(
    hasattr(sslproto.SSLProtocol, name) for name in ("_on_handshake_complete", "_process_outgoing")
)


class _ServerTLS(sslproto.SSLProtocol):
    """asyncio's server-side TLS, with two additions: the source's handshake limit is
    checked before the TLS handshake starts, and a failed TLS handshake sends its alert
    before the socket closes (asyncio would drop it) and is counted and logged."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, app: asyncio.Protocol, ctx: ssl.SSLContext, listener: Any
    ) -> None:
        super().__init__(
            loop,
            app,
            ctx,
            None,  # type: ignore[arg-type]  # no waiter (asyncio's own servers pass None too)
            server_side=True,
            ssl_handshake_timeout=listener.config.handshake_timeout,
        )
        self._listener = listener
        self._peer = "tls://?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._peer = _peer_url(transport)
        peer = transport.get_extra_info("peername")
        source = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if not self._listener.allow_source(source, self._peer):
            cast(
                asyncio.Transport, transport
            ).abort()  # before the TLS handshake: nothing to say that it could read
            return
        super().connection_made(transport)

    def _on_handshake_complete(self, handshake_exc: BaseException | None) -> None:
        if handshake_exc is not None:
            with contextlib.suppress(Exception):  # best effort: the socket may be gone already
                self._process_outgoing()  # type: ignore[attr-defined]  # the alert, before the close
            reason = getattr(handshake_exc, "reason", None) or type(handshake_exc).__name__
            detail = getattr(handshake_exc, "verify_message", None) or str(handshake_exc)
            self._listener.count_refusal("tls_handshake_failed")
            log.info(
                "refused tls connection from %s: TLS handshake failed: %s (%s)", self._peer, reason, detail,
                extra={"transport": "tls", "reason": "tls_handshake_failed"},
            )  # fmt: skip
        super()._on_handshake_complete(handshake_exc)


async def dial_tls(
    address: Address,
    identity: Identity,
    *,
    expect: str | None = None,
    config: TransportConfig,
    session_id: int = 0,
) -> Connection:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + config.handshake_timeout
    ctx = client_context(identity, config)
    url = address.url
    with connect_errors(url, config, what="TLS connection"):
        try:
            async with asyncio.timeout_at(deadline):
                transport, proto = await loop.create_connection(
                    lambda: FrameProtocol(config),
                    address.host,
                    address.port,
                    ssl=ctx,
                    ssl_handshake_timeout=config.handshake_timeout,
                )
        except ssl.SSLError as exc:
            raise TransportError(f"{url}: TLS handshake failed: {exc.reason or exc}") from None
    sslobj = transport.get_extra_info("ssl_object")
    der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
    if sslobj is None or sslobj.selected_alpn_protocol() != ALPN or not der:
        await proto.close_transport(0.1)
        raise TransportError(f"{url}: the peer does not speak {ALPN} (ALPN) or sent no certificate")
    set_keepalive(transport.get_extra_info("socket"), config.keepalive_interval)
    hs = client_handshake(
        identity,
        config,
        order=HelloOrder.CLIENT_FIRST,
        binding=channel_binding(der),
        expect=expect,
        session_id=session_id,
    )
    try:
        return await establish(proto, hs, config=config, transport="tls", address=url, deadline=deadline)
    except ConnectionClosed:
        # TLS 1.3: the server judges this client's certificate after the client finished its
        # handshake, so a refusal arrives as an alert on the first read.
        alert = tls_alert(proto.lost_exc)
        if alert is None:
            raise
        raise _refused_by_alert(url, alert) from None


async def listen_tls(
    address: Address,
    identity: Identity,
    on_connection: OnConnection,
    *,
    config: TransportConfig,
) -> Listener:
    cert = node_certificate(identity.agent_id, config.cert_file, config.key_file)
    ctx = server_context(cert, config)
    binding = cert.binding

    def make_handshake() -> ServerHandshake:
        return server_handshake(identity, config, order=HelloOrder.CLIENT_FIRST, binding=binding)

    listener = StreamListener(
        config=config,
        transport="tls",
        on_connection=on_connection,
        make_handshake=make_handshake,
        describe_peer=_peer_url,
        # without _ServerTLS the limit is checked after the TLS handshake, by address
        source=None if _SERVER_TLS_OK else (lambda t: str((t.get_extra_info("peername") or ("?",))[0])),
    )

    async def handle(proto: FrameProtocol) -> None:
        transport = proto.transport
        sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
        if transport is None or sslobj is None or sslobj.selected_alpn_protocol() != ALPN:
            await proto.close_transport(0.1)
            return
        set_keepalive(transport.get_extra_info("socket"), config.keepalive_interval)
        await listener.handle(proto)

    loop = asyncio.get_running_loop()
    app_factory = listener.protocol_factory(handle)
    try:
        if _SERVER_TLS_OK:
            server = await loop.create_server(
                lambda: _ServerTLS(loop, app_factory(), ctx, listener),
                address.host,
                address.port,
                backlog=accept_backlog(config),
            )
        else:  # pragma: no cover - an asyncio without what _ServerTLS extends
            server = await loop.create_server(
                app_factory,
                address.host,
                address.port,
                ssl=ctx,
                ssl_handshake_timeout=config.handshake_timeout,
                backlog=accept_backlog(config),
            )
    except OSError as exc:
        raise TransportError(f"{address.url}: cannot listen: {exc.strerror or exc}") from None
    addrs = []
    for sock in server.sockets:
        host, port = sock.getsockname()[:2]
        addrs.append(f"tls://{format_host(host)}:{port}")
    listener.attach(server, addrs)
    return listener


__all__ = [
    "MAX_CLIENT_CONTEXTS",
    "client_context",
    "dial_tls",
    "listen_tls",
    "prepare_dial",
    "server_context",
    "set_keepalive",
]
