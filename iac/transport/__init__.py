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
ConnectionTable), :mod:`.core` (the sans-IO connection core every adapter's
Connection runs on: state, close error, backlog judge, timers), :mod:`.session`
(the HELLO exchange and what each frame means, shared by every adapter),
:mod:`.queues` (the bounded send and receive queues),
the adapters :mod:`.quic` (a package), :mod:`.tls` and :mod:`.unix` (both over
:mod:`.stream`, frames back to back on a byte stream), :mod:`.certs` (node
certificates) and :mod:`.dialer` (fallback across a peer's addresses, backoff).
"""

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
from iac.transport.dialer import Attempt, Dialer, DialError, DialPolicy
from iac.transport.endpoints import DEFAULT_CONFIG, dial, listen

__all__ = [
    "DEFAULT_CONFIG",
    "TRANSPORTS",
    "Address",
    "Attempt",
    "Connection",
    "ConnectionTable",
    "DialError",
    "DialPolicy",
    "Dialer",
    "Incoming",
    "Listener",
    "OnConnection",
    "PeerInfo",
    "TransportConfig",
    "dial",
    "listen",
    "parse_address",
]
