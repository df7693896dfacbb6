"""The other way round: an HTTP A2A agent answering IAC peers as if it were one of them.

::

    bridge = await serve_remote(node, "http://agent.example:9999")
    # any IAC node: fetch_card(node, bridge_node_id) / client(node, card) / the binding's payloads

The bridge node answers A2A over IAC (its AgentId, its signature) by making each call again
with A2A's JSON-RPC transport (a2a-sdk) to the remote agent, authenticated there with whatever
the ``httpx`` client carries (a bearer token, say). The remote agent sees the bridge, not the
IAC caller; the bridge sees the caller's AgentId (``trusted_gateways``, ``IacUser``) and may
decide which callers it serves before it forwards anything.
"""

from __future__ import annotations

from collections.abc import Collection

import httpx
from a2a.client import A2ACardResolver
from a2a.client.transports.jsonrpc import JsonRpcTransport
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, VERSION_HEADER, TransportProtocol

from iac.errors import ConfigError
from iac.integrations.a2a.binding import supported_version
from iac.integrations.a2a.proxy import ProxyHandler, forward_extensions
from iac.integrations.a2a.server import A2AServer
from iac.node.node import Node


def jsonrpc_url(card: pb.AgentCard) -> str:
    """The URL of the card's first JSON-RPC interface of a version the binding carries."""
    for i in card.supported_interfaces:
        if i.protocol_binding == TransportProtocol.JSONRPC and (
            not i.protocol_version or supported_version(i.protocol_version)
        ):
            return i.url
    raise ConfigError("the remote agent's card lists no JSON-RPC interface of A2A 1.0")


class A2ABridge:
    """``node`` answering A2A over IAC for the HTTP agent of ``card``; ``server.stats()`` and
    ``handler`` count the calls."""

    def __init__(
        self,
        node: Node,
        card: pb.AgentCard,
        http: httpx.AsyncClient,
        *,
        owns_http: bool = False,
        trusted_gateways: Collection[str] = (),
    ) -> None:
        http.headers.setdefault(VERSION_HEADER, PROTOCOL_VERSION_CURRENT)
        self.http = http
        self._owns_http = owns_http
        self.transport = JsonRpcTransport(http, card, jsonrpc_url(card), is_shared_httpx=True)
        self.handler = ProxyHandler(self.transport, forward_extensions)
        self.server = A2AServer(node, self.handler, card, trusted_gateways=trusted_gateways).attach()

    async def close(self) -> None:
        if self._owns_http:
            await self.http.aclose()


async def serve_remote(
    node: Node,
    url: str,
    *,
    http: httpx.AsyncClient | None = None,
    card: pb.AgentCard | None = None,
    trusted_gateways: Collection[str] = (),
) -> A2ABridge:
    """Make ``node`` answer A2A over IAC for the HTTP A2A agent at ``url`` (its card is fetched
    from the well-known path unless given). ``http``: the client for the HTTP leg (its headers
    carry the bridge's credentials; one is made, and closed by :meth:`A2ABridge.close`, if not)."""
    owns = http is None
    client = http or httpx.AsyncClient(timeout=30.0)
    if card is None:
        client.headers.setdefault(VERSION_HEADER, PROTOCOL_VERSION_CURRENT)
        card = await A2ACardResolver(client, url).get_agent_card()
    return A2ABridge(node, card, client, owns_http=owns, trusted_gateways=trusted_gateways)


__all__ = ["A2ABridge", "jsonrpc_url", "serve_remote"]
