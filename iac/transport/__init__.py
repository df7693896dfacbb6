"""Transports: ``dial`` and ``listen`` on ``quic://``, ``tls://`` and ``unix://`` URLs.

Every adapter module offers the same two coroutines, which this module
dispatches to by scheme::

    async def dial_<name>(address: Address, identity: Identity, *, expect: str | None,
                          config: TransportConfig, session_id: int = 0) -> Connection
    async def listen_<name>(address: Address, identity: Identity, on_connection: OnConnection,
                            *, config: TransportConfig) -> Listener

``dial`` returns once the HELLO exchange verified (docs/PROTOCOL.md, "Sessions
and the handshake"); a refusal by either side raises the typed
:class:`~iac.errors.HandshakeError`, a network failure a
:class:`~iac.errors.TransportError`. ``listen`` calls ``on_connection`` (in its
own task) for every connection whose HELLO verified. The QUIC adapter is
imported only when a ``quic://`` URL is used.

Layout: :mod:`.base` (the interface: config, addresses, Connection, Listener,
ConnectionTable), :mod:`.session` (the HELLO exchange and what each frame means,
shared by every adapter), :mod:`.queues` (the bounded send and receive queues),
the adapters :mod:`.quic` (a package), :mod:`.tls` and :mod:`.unix` (both over
:mod:`.stream`, frames back to back on a byte stream), :mod:`.certs` (node
certificates) and :mod:`.dialer` (fallback across a peer's addresses, backoff).
"""

from __future__ import annotations

import importlib
from typing import Any

from iac.transport.base import (
    TRANSPORTS,
    Address,
    Connection,
    ConnectionTable,
    Incoming,
    Listener,
    OnConnection,
    PeerInfo,
    TransportConfig,
    parse_address,
)
from iac.wire.identity import Identity

DEFAULT_CONFIG = TransportConfig()


def _quic() -> Any:
    """The QUIC adapter, imported on first use (it pulls in aioquic)."""
    return importlib.import_module(".quic", __package__)


async def dial(
    url: str | Address,
    identity: Identity,
    *,
    expect: str | None = None,
    config: TransportConfig = DEFAULT_CONFIG,
    session_id: int = 0,
) -> Connection:
    """Connect to ``url`` and run the HELLO exchange. ``expect``: the AgentId dialed."""
    addr = url if isinstance(url, Address) else parse_address(url)
    if addr.scheme == "quic":
        conn: Connection = await _quic().dial_quic(
            addr, identity, expect=expect, config=config, session_id=session_id
        )
        return conn
    if addr.scheme == "tls":
        from iac.transport.tls import dial_tls

        return await dial_tls(addr, identity, expect=expect, config=config, session_id=session_id)
    from iac.transport.unix import dial_unix

    return await dial_unix(addr, identity, expect=expect, config=config, session_id=session_id)


async def listen(
    url: str | Address,
    identity: Identity,
    on_connection: OnConnection,
    *,
    config: TransportConfig = DEFAULT_CONFIG,
) -> Listener:
    """Accept connections on ``url``; ``on_connection`` runs for each verified peer."""
    addr = url if isinstance(url, Address) else parse_address(url)
    if addr.scheme == "quic":
        listener: Listener = await _quic().listen_quic(addr, identity, on_connection, config=config)
        return listener
    if addr.scheme == "tls":
        from iac.transport.tls import listen_tls

        return await listen_tls(addr, identity, on_connection, config=config)
    from iac.transport.unix import listen_unix

    return await listen_unix(addr, identity, on_connection, config=config)


__all__ = [
    "DEFAULT_CONFIG",
    "TRANSPORTS",
    "Address",
    "Connection",
    "ConnectionTable",
    "Incoming",
    "Listener",
    "OnConnection",
    "PeerInfo",
    "TransportConfig",
    "dial",
    "listen",
    "parse_address",
]
