"""Two started nodes on loopback, for tests: :func:`node_pair`."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from typing import NamedTuple

from iac.errors import ConfigError
from iac.node.config import NodeConfig
from iac.node.node import Node
from iac.transport.base import TRANSPORTS
from iac.wire.identity import Identity


class NodePair(NamedTuple):
    """The nodes of :func:`node_pair`: ``client`` dials, ``server`` listens."""

    client: Node
    server: Node


@contextlib.asynccontextmanager
async def node_pair(
    transport: str = "unix",
    *,
    server_config: NodeConfig | None = None,
    client_config: NodeConfig | None = None,
    server_identity: Identity | None = None,
    client_identity: Identity | None = None,
    connect: bool = True,
) -> AsyncIterator[NodePair]:
    """Two started nodes on loopback; both are closed (and the socket directory
    removed) when the block ends.

    Example::

        async with node_pair() as (alice, bob):
            bob.on(MessageType.RUN)(lambda ctx: ctx.payload)
            reply = await alice.request(bob.agent_id, MessageType.RUN, "hi", timeout=5)

    The server listens on ``transport``: ``"unix"`` (a socket in a fresh private
    temporary directory), ``"tls"`` or ``"quic"`` (``127.0.0.1``, a free port). The
    client has the server in its peer book and, with ``connect=True`` (the
    default), is connected to it; with ``connect=False`` the first message dials.
    """
    if transport not in TRANSPORTS:
        raise ConfigError(f"unknown transport {transport!r} (known: {', '.join(TRANSPORTS)})")
    d = tempfile.mkdtemp(prefix="iac-")  # short: a UNIX socket path has at most 107 bytes
    url = f"unix://{d}/server.sock" if transport == "unix" else f"{transport}://127.0.0.1:0"
    try:
        async with (
            Node(server_identity, listen=[url], config=server_config) as server,
            Node(client_identity, config=client_config) as client,
        ):
            client.add_peer(server.agent_id, *server.addresses)
            if connect:
                await client.connect(server.agent_id)
            yield NodePair(client, server)
    finally:
        shutil.rmtree(d, ignore_errors=True)


__all__ = ["NodePair", "node_pair"]
