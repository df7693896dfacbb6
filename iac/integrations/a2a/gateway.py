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
passes is forwarded over IAC, signed with the gateway node's key, the authenticated principal
in Message field 19. ``stats()`` counts each of these outcomes.

What the HTTP leg does not protect is in docs/PROTOCOL.md, "A2A over IAC".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any
from urllib.parse import urlsplit

try:
    import uvicorn
    from a2a.client import ClientCallContext
    from a2a.server.context import ServerCallContext
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.routes.common import DefaultServerCallContextBuilder
    from a2a.types import a2a_pb2 as pb
    from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, TransportProtocol
    from starlette.applications import Starlette
    from starlette.authentication import AuthCredentials, SimpleUser
    from starlette.requests import ClientDisconnect, Request
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the A2A gateway needs a2a-sdk[http-server] and uvicorn: pip install 'iac[a2a]'"
    ) from exc

from iac.errors import ConfigError
from iac.integrations.a2a.auth import GatewayAuth
from iac.integrations.a2a.binding import VERSION, error_name, interface_url
from iac.integrations.a2a.client import BindingStats, IacTransport, fetch_card
from iac.integrations.a2a.proxy import ProxyHandler, forward_principal
from iac.integrations.a2a.tenants import (
    ConnectionGuard,
    FairShares,
    GatewayLimits,
    ReplayCache,
    Throttled,
    guarded_protocol,
)
from iac.integrations.slots import ByteBudget
from iac.node.node import Node

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("iac.integrations")

_SCOPE_KEY = "iac.gateway"
_INSPECT = 64 * 1024  # bytes of a JSON response read back to count its error code
_MAX_HEAD = 16 * 1024  # bytes of a request head


class GatewayStats:
    """``requests``: JSON-RPC POSTs; ``refused``: answered at the gateway, never forwarded (by
    reason: ``unauthenticated``, ``too_large``, ``throttled`` (HTTP 429: no call slot within
    ``queue_wait``), ``bodies_per_client``/``bodies_total``, ``client_left`` and the JSON-RPC
    errors); ``answered_errors``: A2A errors of forwarded calls (by JSON-RPC error name);
    ``replayed``: repeated ``messageId`` answered from the first answer; plus the forwarding
    handler's and the IAC client side's counters."""

    def __init__(self) -> None:
        self.requests = 0
        self.replayed = 0
        self.refused: Counter[str] = Counter()
        self.answered_errors: Counter[str] = Counter()


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
        scc.state[_SCOPE_KEY] = request.scope.get(_SCOPE_KEY)
        return scc


def _forwarding(scc: ServerCallContext) -> ClientCallContext:
    record = scc.state.get(_SCOPE_KEY)
    if isinstance(record, dict):
        record["forwarded"] = True
    return forward_principal(scc)


class _Front:
    """The ASGI layer before a2a-sdk's routes: authentication, the body read within its bounds,
    a repeated ``messageId`` answered from the first answer, the principal's fair share of the
    calls toward the agent, counting."""

    def __init__(self, app: ASGIApp, gateway: A2AGateway) -> None:
        self.app = app
        self.gw = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        gw, stats = self.gw, self.gw.stats_
        stats.requests += 1
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        principal = gw.auth.authenticate(headers)
        if principal is None:
            stats.refused["unauthenticated"] += 1
            await _reply(send, 401, "authentication required", {"www-authenticate": gw.auth.challenge()})
            return
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > gw.max_body:
            stats.refused["too_large"] += 1
            await _reply(send, 413, f"the body is over {gw.max_body} bytes")
            return
        client = str((scope.get("client") or ("",))[0])
        held = [0]
        try:
            await self._read_and_serve(scope, receive, send, principal, client, declared, held)
        finally:
            gw.bodies.give(client, held[0])

    async def _read_and_serve(
        self, scope: Scope, receive: Receive, send: Send, principal: str, client: str, declared: str,
        held: list[int],
    ) -> None:  # fmt: skip
        gw, stats = self.gw, self.gw.stats_

        async def hold(size: int) -> bool:
            refused = gw.bodies.take(client, size)
            if refused is None:
                held[0] += size
                return True
            stats.refused[f"bodies_{refused}"] += 1
            bound = gw.limits.max_bodies if refused == "total" else gw.limits.max_bodies_per_client
            text = f"request bodies in flight are over {bound} bytes ({refused}); retry later"
            await _reply(send, 429 if refused == "per_client" else 503, text)
            return False

        if declared.isdigit() and not await hold(int(declared)):
            return
        chunks: list[bytes] = []
        received = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stats.refused["client_left"] += 1
                log.debug("gateway: %s (%s) left in the middle of its request body", principal, client)
                return
            chunk = message.get("body", b"")
            received += len(chunk)
            if received > gw.max_body:
                stats.refused["too_large"] += 1
                await _reply(send, 413, f"the body is over {gw.max_body} bytes")
                return
            if received > held[0] and not await hold(received - held[0]):
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        request_id, message_id = _ids(body)
        if message_id is not None:
            entry = gw.replays.begin(principal, message_id, gw.clock())
            if entry is not None:
                await self._replay(send, entry, request_id)
                return
        answer: list[Any] = []
        try:
            try:
                await gw.shares.acquire(principal, gw.limits.queue_wait)
            except Throttled as exc:
                stats.refused["throttled"] += 1
                await _reply(send, 429, str(exc), code=-32000, request_id=request_id,
                             data={"principal": exc.principal, "in_flight": exc.in_flight})  # fmt: skip
                return
            try:
                await self._serve(scope, receive, send, principal, body, answer)
            finally:
                gw.shares.release(principal)
        finally:
            if message_id is not None:
                gw.replays.finish(principal, message_id, answer[0] if answer else None)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, principal: str, body: bytes, answer: list[Any]
    ) -> None:
        stats = self.gw.stats_
        record: dict[str, Any] = {"forwarded": False}
        scope = dict(scope)
        scope["user"] = SimpleUser(principal)
        scope["auth"] = AuthCredentials(["authenticated"])
        scope[_SCOPE_KEY] = record
        given = False

        async def replayed() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # what comes next: the client leaving

        json_body: list[bytes] = []
        is_json = False
        status = 200
        head: list[tuple[bytes, bytes]] = []
        kept: list[bytes] | None = []
        kept_size = 0
        limit = self.gw.limits.replay_bytes

        async def counted(message: Message) -> None:
            nonlocal is_json, status, head, kept, kept_size
            if message["type"] == "http.response.start":
                status, head = int(message["status"]), list(message.get("headers", ()))
                ctype = dict(head).get(b"content-type", b"")
                is_json = ctype.startswith(b"application/json")
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                kept_size += len(chunk)
                if kept is not None:
                    if kept_size <= limit:
                        kept.append(chunk)
                    else:
                        kept = None  # too large to give again: a repeat is refused, not run
                if is_json:
                    if sum(map(len, json_body)) < _INSPECT:
                        json_body.append(chunk)
                    if not message.get("more_body"):
                        self._count(b"".join(json_body), record)
                if not message.get("more_body") and record["forwarded"]:
                    answer.append((status, head, b"".join(kept) if kept is not None else None))
            await send(message)

        try:
            await self.app(scope, replayed, counted)
        except ClientDisconnect:
            stats.refused["client_left"] += 1
            log.debug("gateway: %s left before its answer was sent", principal)

    async def _replay(self, send: Send, entry: Any, request_id: Any) -> None:
        """Answer a repeated ``messageId`` with the first call's answer (waiting for it)."""
        stats = self.gw.stats_
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.gw.stream_timeout):
                await entry.done.wait()
        got = entry.answer
        if got is None or got[2] is None:
            stats.refused["repeat_unanswerable"] += 1
            await _reply(send, 409, "this messageId was sent before and its answer cannot be given again",
                         request_id=request_id)  # fmt: skip
            return
        status, head, body = got
        stats.replayed += 1
        if dict(head).get(b"content-type", b"").startswith(b"application/json"):
            with contextlib.suppress(ValueError, TypeError):
                doc = json.loads(body)
                doc["id"] = request_id
                body = json.dumps(doc).encode()
        head = [(k, v) for k, v in head if k.lower() != b"content-length"]
        head.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    def _count(self, body: bytes, record: dict[str, Any]) -> None:
        if b'"error"' not in body:
            return
        try:
            code = json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            return
        stats = self.gw.stats_
        if not record["forwarded"]:
            stats.refused[error_name(code)] += 1
        else:
            stats.answered_errors[error_name(code)] += 1


def _ids(body: bytes) -> tuple[Any, str | None]:
    """The JSON-RPC id of a request, and the ``messageId`` of a SendMessage or
    SendStreamingMessage (None for other calls, and for a body that is not such a request)."""
    if b"messageId" not in body and b"message_id" not in body and b'"id"' not in body:
        return None, None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    request_id = doc.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
        request_id = None
    if doc.get("method") not in ("SendMessage", "SendStreamingMessage"):
        return request_id, None
    params = doc.get("params")
    message = params.get("message") if isinstance(params, dict) else None
    mid = None
    if isinstance(message, dict):
        mid = message.get("messageId", message.get("message_id"))
    if not isinstance(mid, str) or not 0 < len(mid) <= 256:
        return request_id, None
    return request_id, f"{doc['method']} {mid}"


async def _reply(
    send: Send, status: int, text: str, extra: dict[str, str] | None = None, *, code: int = -32600,
    request_id: Any = None, data: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    error: dict[str, Any] = {"code": code, "message": text, **({"data": data} if data else {})}
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
            "connections": g.slots.in_use if g else 0,
            "connections_refused": dict(g.slots.refused) if g else {},
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
        kept = [i for i in agent.supported_interfaces if self.advertise_iac and i.protocol_binding == "IAC"]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend([own, *kept])
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
            *create_jsonrpc_routes(self.handler, rpc_url="/", context_builder=_Builder()),
        ]
        self.app = _Front(Starlette(routes=routes), self)
        return self.app

    async def start(self) -> str:
        """Fetch the card (unless given), listen, serve; return the JSON-RPC URL."""
        if self.agent_card is None:
            self.agent_card = await fetch_card(
                self.node, self.agent_id, *self.addresses, timeout=self.timeout
            )
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from None
        sock.listen(128)
        sock.setblocking(False)
        port = sock.getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{self.scheme}://{host}:{port}/"
        app = self.build(self.url)
        self.guard = ConnectionGuard(self.limits, f"A2A gateway {self.url}", asyncio.get_running_loop().time)
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
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5)
        except TimeoutError:
            self._server.force_exit = True
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 2)
        self._server = self._task = None


__all__ = ["A2AGateway", "GatewayStats"]
