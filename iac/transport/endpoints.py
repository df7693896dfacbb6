"""``dial`` and ``listen`` by URL scheme (re-exported by :mod:`iac.transport`)."""

from __future__ import annotations

import importlib
from typing import Any

from iac.transport.base import (
    Address,
    Connection,
    Listener,
    OnConnection,
    TransportConfig,
    parse_address,
)
from iac.wire.identity import Identity

#: The transport settings used when none are given.
DEFAULT_CONFIG = TransportConfig()


def _quic() -> Any:
    """The QUIC adapter, imported on first use (it pulls in aioquic)."""
    return importlib.import_module("iac.transport.quic")


async def dial(
    url: str | Address,
    identity: Identity,
    *,
    expect: str | None = None,
    config: TransportConfig = DEFAULT_CONFIG,
    session_id: int = 0,
    tickets: Any = None,
) -> Connection:
    """Connect to ``url`` and run the HELLO exchange. ``expect``: the AgentId dialed.

    ``tickets``: a :class:`~iac.transport.quic.ClientTicketStore`; a ``quic://`` dial with a
    ticket stored for that address resumes the session and sends its HELLO and first frames as
    0-RTT early data (other schemes ignore it)."""
    addr = url if isinstance(url, Address) else parse_address(url)
    if addr.scheme == "quic":
        conn: Connection = await _quic().dial_quic(
            addr, identity, expect=expect, config=config, session_id=session_id, tickets=tickets
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


__all__ = ["DEFAULT_CONFIG", "dial", "listen"]
