"""A gateway for plain A2A clients: A2A's JSON-RPC (and its SSE streams) over HTTP in front of an
IAC agent that serves A2A over IAC.

::

    auth = GatewayAuth.bearer({"s3cret-token-for-alice": "alice"})
    async with A2AGateway(node, agent_id, auth=auth, listen="http://127.0.0.1:8080") as gw:
        ...  # GET gw.url + ".well-known/agent-card.json"; POST JSON-RPC to gw.url

The gateway publishes the agent's card with its own JSON-RPC interface first and the security
scheme it checks. Every POST is authenticated (401 otherwise), bounded (``max_body``: 413),
parsed and checked by a2a-sdk's JSON-RPC dispatcher (malformed JSON, invalid requests, unknown
methods, bad params and unsupported versions are answered there and never forwarded); what
passes is forwarded over IAC (as A2A 1.0), signed with the gateway node's key, the authenticated principal
in Message field 19. ``stats()`` counts each of these outcomes.

A2A 0.3 clients are served too, on the same URL (a2a-sdk's 0.3 compatibility): a request that
sends no ``A2A-Version`` header is A2A 0.3 (``message/send``, ``tasks/get``, ...), translated to
1.0 before it is forwarded; the card lists the URL once per version.

What the HTTP leg does not protect is in docs/PROTOCOL.md, "A2A over IAC".
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

try:
    import uvicorn
    from a2a.client import ClientCallContext
    from a2a.server.context import ServerCallContext
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.routes.common import DefaultServerCallContextBuilder
    from a2a.types import a2a_pb2 as pb
    from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, PROTOCOL_VERSION_0_3, TransportProtocol
    from starlette.applications import Starlette
    from starlette.requests import Request
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the A2A gateway needs a2a-sdk[http-server] and uvicorn: pip install 'iac-mesh[a2a]'"
    ) from exc

from iac.errors import ConfigError
from iac.integrations.a2a.auth import GatewayAuth
from iac.integrations.a2a.binding import VERSION, interface_url
from iac.integrations.a2a.client import BindingStats, IacTransport, fetch_card
from iac.integrations.a2a.connections import ConnectionGuard, GuardedListener, guarded_protocol
from iac.integrations.a2a.front import SCOPE_KEY, ASGIApp, Front, GatewayStats
from iac.integrations.a2a.proxy import ProxyHandler, forward_principal
from iac.integrations.a2a.tenants import FairShares, GatewayLimits, ReplayCache
from iac.integrations.slots import ByteBudget
from iac.node.node import Node

_MAX_HEAD = 16 * 1024  # bytes of a request head


def _parse_listen(listen: str) -> tuple[str, str, int]:
    parts = urlsplit(listen)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"--listen {listen!r}: expected http://HOST:PORT or https://HOST:PORT")
    try:
        port = parts.port or 0
    except ValueError as exc:
        raise ConfigError(f"--listen {listen!r}: {exc}") from None
    return parts.scheme, parts.hostname, port


class _Builder(DefaultServerCallContextBuilder):
    """a2a-sdk's context builder, plus the gateway's per-request record."""

    def build(self, request: Request) -> ServerCallContext:
        scc = super().build(request)
        scc.state[SCOPE_KEY] = request.scope.get(SCOPE_KEY)
        return scc


def _forwarding(scc: ServerCallContext) -> ClientCallContext:
    record = scc.state.get(SCOPE_KEY)
    if isinstance(record, dict):
        record["forwarded"] = True
    return forward_principal(scc)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers (the embedding program owns the signals)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


class A2AGateway:
    """A2A JSON-RPC over HTTP in front of the IAC agent ``agent_id`` (reached through ``node``).

    ``auth``: how callers authenticate (:class:`GatewayAuth`). ``listen``: ``http://HOST:PORT``
    (port 0 picks one) or ``https://…`` with ``tls_cert`` and ``tls_key``. ``card``: the agent's
    card, fetched over IAC (``GetAgentCard``) when not given. ``max_body``: largest request body.
    ``timeout``/``stream_timeout``: of a forwarded unary call / stream. ``advertise_iac``: list the
    agent's own IAC interfaces in the published card too (IAC clients then go direct).
    ``limits``: the bounds per tenant and in total (:class:`GatewayLimits`); ``clock``: seconds,
    for the repeated-``messageId`` window.
    """

    def __init__(
        self,
        node: Node,
        agent_id: str,
        *,
        auth: GatewayAuth,
        addresses: Sequence[str] = (),
        listen: str = "http://127.0.0.1:0",
        card: pb.AgentCard | None = None,
        max_body: int = 1 << 20,
        timeout: float = 30.0,
        stream_timeout: float = 600.0,
        advertise_iac: bool = True,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        limits: GatewayLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scheme, self.host, self.port = _parse_listen(listen)
        if self.scheme == "https" and not (tls_cert and tls_key):
            raise ConfigError("an https:// gateway needs a TLS certificate and key")
        if max_body < 1024:
            raise ConfigError("max_body is at least 1024 bytes")
        self.node, self.agent_id, self.auth = node, agent_id, auth
        self.addresses = tuple(addresses)
        self.agent_card = card
        self.max_body = max_body
        self.timeout, self.stream_timeout = timeout, stream_timeout
        self.advertise_iac = advertise_iac
        self.tls = (tls_cert, tls_key)
        self.stats_ = GatewayStats()
        self.binding_stats = BindingStats()
        lim = self.limits = limits or GatewayLimits()
        self.clock = clock
        self.bodies = ByteBudget(lim.max_bodies, lim.max_bodies_per_client)
        self.shares = FairShares(lim.max_calls, lim.max_calls_per_principal, lim.max_queued)
        self.replays = ReplayCache(lim.replay_window, lim.replay_entries, lim.replay_bytes)
        self.guard: ConnectionGuard | None = None
        self.closing = False
        self.card = pb.AgentCard()
        self.url = ""
        self.app: ASGIApp | None = None
        self.handler: ProxyHandler | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> A2AGateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stats(self) -> dict[str, Any]:
        s = self.stats_
        h = self.handler
        g = self.guard
        return {
            "requests": s.requests,
            "refused": dict(s.refused),
            "answered_errors": dict(s.answered_errors),
            "forwarded": dict(h.forwarded) if h else {},
            "failed": dict(h.failed) if h else {},
            "iac": self.binding_stats.snapshot(),
            "replayed": s.replayed,
            "throttled": dict(self.shares.throttled),
            "calls_in_flight": dict(self.shares.in_flight),
            "connections": g.live if g else 0,
            "connections_refused": dict(g.refused) if g else {},
            "connections_closed": dict(g.closed) if g else {},
        }

    def build(self, url: str) -> ASGIApp:
        """The ASGI app of the gateway published at ``url`` (needs :attr:`agent_card`)."""
        agent = self.agent_card
        if agent is None:
            raise ConfigError("the gateway has no agent card yet: start() fetches it")
        card = pb.AgentCard()
        card.CopyFrom(agent)
        own = pb.AgentInterface(protocol_binding=TransportProtocol.JSONRPC, protocol_version=VERSION, url=url)
        legacy = pb.AgentInterface(
            protocol_binding=TransportProtocol.JSONRPC, protocol_version=PROTOCOL_VERSION_0_3, url=url
        )
        kept = [i for i in agent.supported_interfaces if self.advertise_iac and i.protocol_binding == "IAC"]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend([own, *kept, legacy])  # 1.0 first: 1.0 clients pick it
        self.auth.declare(card)
        self.card = card
        target = interface_url(self.agent_id, self.addresses)
        transport = IacTransport(
            self.node, agent, target, timeout=self.timeout, stream_timeout=self.stream_timeout,
            stats=self.binding_stats,
        )  # fmt: skip
        self.handler = ProxyHandler(transport, _forwarding)
        routes = [
            *create_agent_card_routes(card, card_url=AGENT_CARD_WELL_KNOWN_PATH),
            *create_jsonrpc_routes(
                self.handler, rpc_url="/", context_builder=_Builder(), enable_v0_3_compat=True
            ),
        ]
        self.app = Front(Starlette(routes=routes), self)
        return self.app

    async def start(self) -> str:
        """Fetch the card (unless given), listen, serve; return the JSON-RPC URL."""
        if self.agent_card is None:
            self.agent_card = await fetch_card(
                self.node, self.agent_id, *self.addresses, timeout=self.timeout
            )
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        guard = ConnectionGuard(self.limits, f"A2A gateway {self.host}:{self.port}", time.monotonic)
        sock = GuardedListener(family, socket.SOCK_STREAM)
        sock.guard = guard
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            guard.close()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        sock.listen(128)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{self.scheme}://{host}:{port}/"
        app = self.build(self.url)
        self.guard = guard
        config = uvicorn.Config(
            app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=2,
            timeout_keep_alive=max(1, int(self.limits.keep_alive)), http=guarded_protocol(self.guard),
            h11_max_incomplete_event_size=_MAX_HEAD, backlog=1024,
            ssl_certfile=self.tls[0], ssl_keyfile=self.tls[1],
        )  # fmt: skip
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise ConfigError("the gateway's HTTP server did not start")
            await asyncio.sleep(0.01)
        return self.url

    async def close(self) -> None:
        if self._server is None or self._task is None:
            return
        self.closing = True  # the calls uvicorn cancels at the end of its grace end quietly
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        except TimeoutError:
            self._server.force_exit = True
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 2)
        if self.guard is not None:
            self.guard.close()
        self._server = self._task = None


__all__ = ["A2AGateway", "GatewayStats"]
