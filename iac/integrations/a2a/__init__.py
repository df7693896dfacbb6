"""A2A over IAC (``pip install 'iac-mesh[a2a]'``): A2A agents and clients (the a2a-sdk) talking over
signed IAC messages, and a gateway between A2A's JSON-RPC over HTTP and IAC agents.

* :func:`register` / :func:`client`: an a2a-sdk client whose calls to a card's ``iac://``
  interface go through an :class:`iac.Node` (:class:`IacTransport`).
* :func:`agent_card`: a spec-compliant card for an agent a node serves (its IAC interface).
* :func:`serve`: an a2a-sdk request handler (the agent's ``AgentExecutor``, unchanged) answering
  on a node; the caller's AgentId is the executor's authenticated user (:class:`IacUser`).
* :class:`A2AGateway`: A2A JSON-RPC and SSE over HTTP for plain A2A clients, forwarded to an IAC
  agent, the authenticated caller in Message field 19; :func:`serve_remote`: the other way, an
  HTTP A2A agent answering IAC peers through a node.

The wire format is docs/PROTOCOL.md, "A2A over IAC".
"""

from iac.integrations.a2a.auth import GatewayAuth
from iac.integrations.a2a.binding import (
    BINDING,
    MAX_PRINCIPAL,
    MSG_TYPE,
    VERSION,
    VERSIONS,
    Endpoint,
    IacBindingError,
    iac_interface,
    interface_url,
    parse_interface_url,
    with_iac_interface,
)
from iac.integrations.a2a.bridge import A2ABridge, serve_remote
from iac.integrations.a2a.client import IacBinding, IacTransport, client, fetch_card, register
from iac.integrations.a2a.gateway import A2AGateway
from iac.integrations.a2a.principal import principal_of
from iac.integrations.a2a.proxy import ProxyHandler
from iac.integrations.a2a.server import A2AServer, IacUser, agent_card, serve
from iac.integrations.a2a.tenants import GatewayCollector, GatewayLimits

__all__ = [
    "BINDING",
    "MAX_PRINCIPAL",
    "MSG_TYPE",
    "VERSION",
    "VERSIONS",
    "A2ABridge",
    "A2AGateway",
    "A2AServer",
    "Endpoint",
    "GatewayAuth",
    "GatewayCollector",
    "GatewayLimits",
    "IacBinding",
    "IacBindingError",
    "IacTransport",
    "IacUser",
    "ProxyHandler",
    "agent_card",
    "client",
    "fetch_card",
    "iac_interface",
    "interface_url",
    "parse_interface_url",
    "principal_of",
    "register",
    "serve",
    "serve_remote",
    "with_iac_interface",
]
