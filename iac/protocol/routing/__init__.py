"""Broadcast flooding and relayed routing of FORWARD frames, sans-IO: time and peers are arguments.

* :mod:`iac.protocol.routing.forward`: the FORWARD frame (the origin's signed
  message inside a hop limit and a path) and its checks;
* :mod:`iac.protocol.routing.decisions`: the relay policy, and what the router
  decides about one Forward (deliver, send on, refuse and why);
* :mod:`iac.protocol.routing.router`: :class:`Router`, which floods broadcasts,
  relays unicast and routes replies back the way the request came.
"""

from iac.errors import RoutingError
from iac.protocol.routing.decisions import (
    MAX_HOP_LIMIT,
    RelayPolicy,
    RouteDecision,
    RouteRefusal,
    RouterStats,
    Send,
)
from iac.protocol.routing.forward import (
    MAX_PATH,
    ForwardEnvelope,
    open_forward,
    parse_forward,
    wrap_forward,
)
from iac.protocol.routing.router import (
    DEFAULT_BROADCAST_HOP_LIMIT,
    DEFAULT_HOP_LIMIT,
    DEFAULT_MAX_ROUTES,
    DEFAULT_MAX_SEEN,
    Router,
)
from iac.wire.scan import FORWARD_SCHEMA

__all__ = [
    "DEFAULT_BROADCAST_HOP_LIMIT",
    "DEFAULT_HOP_LIMIT",
    "DEFAULT_MAX_ROUTES",
    "DEFAULT_MAX_SEEN",
    "FORWARD_SCHEMA",
    "MAX_HOP_LIMIT",
    "MAX_PATH",
    "ForwardEnvelope",
    "RelayPolicy",
    "RouteDecision",
    "RouteRefusal",
    "Router",
    "RouterStats",
    "RoutingError",
    "Send",
    "open_forward",
    "parse_forward",
    "wrap_forward",
]
