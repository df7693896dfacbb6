"""The server side of MCP over IAC, apart from what answers: sessions, per-request streams, the
per-peer tool allow-list, bounds and counters. A :class:`Backend` answers the JSON-RPC messages
(the SDK's server in :mod:`iac.integrations.mcp.server`, a stdio child in
:mod:`iac.integrations.mcp.bridge`); this module turns RUN messages into calls of it and what it
sends back into stream parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from iac.errors import ConfigError, ErrorCode, HandlerError
from iac.integrations.mcp.binding import (
    BUSY,
    CAPABILITY,
    INVALID_REQUEST,
    MSG_TYPE,
    SESSIONS_FULL,
    TOOL_REFUSED,
    Envelope,
    McpBindingError,
    error_message,
    is_mcp,
    parse_payload,
    tool_name,
)
from iac.integrations.mcp.policy import MAX_COUNTER_KEYS, METRIC_LABELS, Allow, Limits, allowed, bump
from iac.node.node import Context, Node

log = logging.getLogger("iac.integrations")

#: Parts a request's stream holds before the backend waits (its flow control toward the caller).
PART_QUEUE = 64
RequestKey = tuple[str, str | int]


def request_key(rid: Any) -> tuple[str, str | int]:
    """A JSON-RPC id as a dict key (``1`` and ``"1"`` stay apart)."""
    return ("s", rid) if isinstance(rid, str) else ("i", int(rid))


@dataclass(frozen=True, slots=True)
class McpCaller:
    """Who sent an MCP message over IAC: the AgentId that signed it, the principal a gateway named
    for it (field 19; "" when none) and the caller's session. The SDK's server hands it to tools
    as ``ctx.request_context.request``."""

    agent_id: str
    principal: str
    session: str


@dataclass(eq=False)
class Session:
    """One caller's MCP session: its requests in flight, its listen stream, the backend's state."""

    caller: McpCaller
    last_used: float
    requests: dict[RequestKey, asyncio.Queue[tuple[dict[str, Any] | None, bool]]] = field(
        default_factory=dict
    )
    methods: dict[RequestKey, str] = field(default_factory=dict)
    listen: asyncio.Queue[dict[str, Any]] | None = None
    state: Any = None
    closed: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.caller.agent_id, self.caller.session)


class Backend(Protocol):
    """What answers the JSON-RPC messages of the sessions (see the module)."""

    async def open(self, session: Session) -> None: ...

    async def deliver(self, session: Session, message: dict[str, Any]) -> None: ...

    def cancel(self, session: Session, rid: str | int) -> None: ...

    async def close(self, session: Session) -> None: ...

    def has_tool(self, name: str) -> bool: ...


class McpEndpoint:
    """Answers MCP over IAC on ``node`` with ``backend`` (see the module). ``stats()`` counts."""

    def __init__(
        self,
        node: Node,
        backend: Backend,
        *,
        allow: Allow = None,
        limits: Limits | None = None,
        trusted_gateways: Collection[str] = (),
    ) -> None:
        self.node = node
        self.backend = backend
        self.allow = allow
        #: AgentIds whose principal (field 19) is believed; a message naming one from any other
        #: signer is refused with ERROR ``unauthorized``.
        self.trusted_gateways = frozenset(trusted_gateways)
        self.limits = limits or Limits()
        self.sessions: dict[tuple[str, str], Session] = {}
        self._in_flight: Counter[str] = Counter()
        self._settled = asyncio.Event()
        self._settled.set()
        self._listening = 0
        self.calls: Counter[str] = Counter()
        self.tools: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self._fallback: Callable[[Context], Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self) -> McpEndpoint:
        """Register the RUN handler. A RUN handler already there (A2A over IAC, say) keeps getting
        the RUN messages that are not MCP."""
        if CAPABILITY not in self.node.config.transport.capabilities:
            raise ConfigError(
                f"the node does not announce {CAPABILITY} in its HELLO; make it with "
                "NodeConfig from iac.integrations.mcp.announce(config)"
            )
        handlers = self.node.config.max_handlers
        if self.limits.calls_total + self.limits.listens_total > handlers:
            raise ConfigError(
                f"calls_total + listens_total ({self.limits.calls_total} + {self.limits.listens_total}) "
                f"must fit in the node's max_handlers ({handlers}): each holds a handler while it runs"
            )
        previous = self.node.handler(MSG_TYPE)
        self._fallback = previous if previous != self.handle else self._fallback
        self.node.on(MSG_TYPE, replace=True)(self.handle)  # the previous one is kept as the fallback
        return self

    async def settle(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until no call is in flight (each has handed its last
        answer to the node); whether none is."""
        try:
            async with asyncio.timeout(timeout):
                await self._settled.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        """Close every session (the backend stops what it runs for them)."""
        for session in list(self.sessions.values()):
            await self._close(session, "closed")

    def stats(self) -> dict[str, Any]:
        """``calls`` per JSON-RPC method, ``tools`` per tool called, ``refused`` per reason (never
        reached the backend: malformed, over a bound, a tool the allow-list refuses), ``errors``
        per JSON-RPC error code answered, ``events`` (sessions opened/closed, cancels, dropped
        messages), ``sessions``, ``in_flight`` and ``listening`` (listen streams) now."""
        return {
            "calls": dict(self.calls),
            "tools": dict(self.tools),
            "refused": dict(self.refused),
            "errors": dict(self.errors),
            "events": dict(self.events),
            "sessions": len(self.sessions),
            "in_flight": sum(self._in_flight.values()),
            "listening": self._listening,
        }

    def export(self, metrics: Any) -> Callable[[], None]:
        """Export :meth:`stats` in a :class:`~iac.integrations.metrics.NodeMetrics` (``iac_mcp_calls``
        by method, ``iac_mcp_tools`` by tool, ``iac_mcp_refused`` by reason, ``iac_mcp_errors`` by
        code, ``iac_mcp_events``, and the ``sessions`` and ``in_flight`` gauges). Returns what
        removes them."""
        remove: Callable[[], None] = metrics.add_source("mcp", self.stats, METRIC_LABELS)
        return remove

    # --- the handler ------------------------------------------------------------------------------

    async def handle(self, ctx: Context) -> AsyncIterator[Any]:
        """The node's RUN handler: an async generator, one part per message toward the caller."""
        if not is_mcp(ctx.payload):
            async for part in self._other(ctx):
                yield part
            return
        if ctx.principal and ctx.sender not in self.trusted_gateways:
            self.refused["untrusted_principal"] += 1
            raise HandlerError(
                ErrorCode.UNAUTHORIZED, "a principal (field 19) is believed only from a trusted gateway"
            )
        size = len(ctx.message.payload_json.encode())
        try:
            env = parse_payload(ctx.payload, size, max_bytes=self.limits.max_message_bytes)
        except McpBindingError as exc:
            self.refused[exc.reason] += 1
            rid = _loose_id(ctx.payload)
            yield {"message": error_message(rid, exc.code, str(exc), {"reason": exc.reason})}
            return
        _annotate(env)
        if env.kind == "request":
            async for part in self._request(ctx, env):
                yield part
        elif env.kind in ("notification", "response"):
            session = self.sessions.get((ctx.sender, env.session))
            if session is None:
                self.refused["unknown_session"] += 1
                yield {"ok": False, "error": "unknown session"}
                return
            session.last_used = self._now()
            if env.kind == "notification":
                bump(self.calls, env.method)
            try:
                await self.backend.deliver(session, env.message or {})
            except McpBindingError as exc:
                self.refused[exc.reason] += 1
                yield {"ok": False, "error": str(exc)}
                return
            yield {"ok": True}
        elif env.kind == "listen":
            async for part in self._listen(ctx, env):
                yield part
        elif env.kind == "close":
            session = self.sessions.get((ctx.sender, env.session))
            if session is not None:
                await self._close(session, "closed_by_caller")
            yield {"ok": True}
        else:  # has_tool
            yield {"has_tool": self.backend.has_tool(env.tool) and allowed(self.allow, ctx.sender, env.tool)}

    async def _other(self, ctx: Context) -> AsyncIterator[Any]:
        fallback = self._fallback
        if fallback is None:
            self.refused["not_mcp"] += 1
            raise HandlerError("no_handler", "this RUN handler serves MCP over IAC only")
        out = fallback(ctx)
        if hasattr(out, "__aiter__"):
            async for part in out:
                yield part
            return
        if asyncio.iscoroutine(out):
            out = await out
        yield out

    def _now(self) -> float:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop.time()

    async def _session(self, ctx: Context, env: Envelope) -> Session:
        key = (ctx.sender, env.session)
        session = self.sessions.get(key)
        now = self._now()
        if session is not None:
            session.last_used = now
            return session
        lim = self.limits
        for idle in [s for s in self.sessions.values() if now - s.last_used > lim.session_idle]:
            if not idle.requests and idle.listen is None:
                await self._close(idle, "idle")
        mine = sum(1 for s in self.sessions if s[0] == ctx.sender)
        if mine >= lim.sessions_per_peer or len(self.sessions) >= lim.sessions_total:
            self.refused["sessions_full"] += 1
            which = "this caller's" if mine >= lim.sessions_per_peer else "all"
            raise _Refuse(SESSIONS_FULL, f"{which} MCP sessions are in use; close one first")
        session = Session(McpCaller(ctx.sender, ctx.principal, env.session), now)
        self.sessions[key] = session
        await self.backend.open(session)
        self.events["session_opened"] += 1
        return session

    async def _close(self, session: Session, why: str) -> None:
        if session.closed:
            return
        session.closed = True
        self.sessions.pop(session.key, None)
        self.events[f"session_{why}"] += 1
        for q in session.requests.values():
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait((None, True))
        if session.listen is not None:
            with contextlib.suppress(asyncio.QueueFull):
                session.listen.put_nowait({})
        try:
            await self.backend.close(session)
        except Exception:
            log.exception("closing an MCP session failed")

    async def _request(self, ctx: Context, env: Envelope) -> AsyncIterator[Any]:
        rid = env.request_id
        assert rid is not None and env.message is not None
        method, tool = env.method, tool_name(env.message)
        try:
            session = await self._session(ctx, env)
            key = request_key(rid)
            if key in session.requests:
                self.refused["duplicate_id"] += 1
                raise _Refuse(INVALID_REQUEST, f"request id {rid!r} is already in flight in this session")
            if tool is not None and not allowed(self.allow, ctx.sender, tool):
                self.refused["tool_refused"] += 1
                raise _Refuse(
                    TOOL_REFUSED,
                    f"tool {tool!r} is not allowed for caller {ctx.sender}",
                    {"tool": tool, "agent_id": ctx.sender},
                )
            lim, sender = self.limits, ctx.sender
            if self._in_flight[sender] >= lim.calls_per_peer or self._in_flight.total() >= lim.calls_total:
                self.refused["busy"] += 1
                mine = self._in_flight[sender] >= lim.calls_per_peer
                bound = f"{lim.calls_per_peer} from this caller" if mine else f"{lim.calls_total} in all"
                raise _Refuse(BUSY, f"busy: {bound} calls are in flight; try again later")
        except _Refuse as refusal:
            self.errors[str(refusal.code)] += 1
            yield {"message": error_message(rid, refusal.code, refusal.text, refusal.data)}
            return
        queue: asyncio.Queue[tuple[dict[str, Any] | None, bool]] = asyncio.Queue(PART_QUEUE)
        session.requests[key] = queue
        session.methods[key] = method
        self._in_flight[sender] += 1
        self._settled.clear()
        bump(self.calls, method)
        if tool:
            bump(self.tools, tool)
        answered = False
        try:
            try:
                await self.backend.deliver(session, env.message)
            except McpBindingError as exc:  # the backend's own parser is stricter than the binding
                self.refused[exc.reason] += 1
                answered = True
                yield {"message": error_message(rid, exc.code, str(exc), {"reason": exc.reason})}
                return
            while True:
                message, final = await queue.get()
                if message is None:  # the backend settled it without a response (cancelled)
                    answered = True
                    return
                if final:
                    answered = True
                    message = self._final(session, method, message)
                yield {"message": message}
                if final:
                    return
        finally:
            self._in_flight[sender] -= 1
            if self._in_flight[sender] <= 0:
                del self._in_flight[sender]
            if not self._in_flight:
                self._settled.set()
            session.requests.pop(key, None)
            session.methods.pop(key, None)
            while not queue.empty():
                queue.get_nowait()
            if not answered and not session.closed:  # the caller closed the stream: CANCEL
                self.events["cancelled"] += 1
                self.backend.cancel(session, rid)

    def _final(self, session: Session, method: str, message: dict[str, Any]) -> dict[str, Any]:
        error = message.get("error")
        if isinstance(error, dict):
            bump(self.errors, str(error.get("code")))
        if method == "tools/list" and self.allow is not None and isinstance(message.get("result"), dict):
            result = dict(message["result"])
            tools = result.get("tools")
            if isinstance(tools, list):  # list only what this caller may call
                who = session.caller.agent_id
                result["tools"] = [
                    t for t in tools if isinstance(t, dict) and allowed(self.allow, who, str(t.get("name")))
                ]
                message = {**message, "result": result}
        return message

    async def _listen(self, ctx: Context, env: Envelope) -> AsyncIterator[Any]:
        session = self.sessions.get((ctx.sender, env.session))
        if session is None or session.listen is not None:
            self.refused["unknown_session" if session is None else "second_listen"] += 1
            yield {"ok": False}
            return
        lim = self.limits
        mine = sum(1 for s in self.sessions.values() if s.listen is not None and s.key[0] == ctx.sender)
        if mine >= lim.listens_per_peer or self._listening >= lim.listens_total:
            self.refused["listens_full"] += 1
            yield {"ok": False, "error": "listen streams full"}
            return
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(PART_QUEUE)
        session.listen = queue
        self._listening += 1
        ends = self._now() + lim.session_idle  # the caller opens it again: an abandoned one ends
        try:
            while not session.closed:
                try:
                    message = await asyncio.wait_for(queue.get(), max(0.0, ends - self._now()))
                except TimeoutError:
                    return
                if not message:
                    return
                yield {"message": message}
        finally:
            self._listening -= 1
            if session.listen is queue:
                session.listen = None

    # --- from the backend -------------------------------------------------------------------------

    async def route(self, session: Session, message: dict[str, Any], related: str | int | None) -> None:
        """Send a message of the backend toward the session's caller: a response ends its request's
        stream; a message about a request (``related``) is a part of that stream; anything else
        goes on the session's listen stream (dropped, and counted, when there is none)."""
        is_response = "method" not in message and "id" in message
        if is_response or related is not None:
            rid = message.get("id") if is_response else related
            try:
                queue = session.requests.get(request_key(rid))
            except (TypeError, ValueError):
                queue = None
            if queue is not None:
                await queue.put((message, is_response))
                return
            if is_response:
                self.events["late_response"] += 1
                return
        if session.listen is not None:
            await session.listen.put(message)
            return
        self.events["dropped_no_listener"] += 1

    async def unanswered(self, session: Session, rid: str | int) -> None:
        """The backend settled request ``rid`` without a response (it was cancelled): end its stream."""
        queue = session.requests.get(request_key(rid))
        if queue is not None:
            await queue.put((None, True))


class _Refuse(Exception):
    def __init__(self, code: int, text: str, data: Any = None) -> None:
        super().__init__(text)
        self.code, self.text, self.data = code, text, data


def _loose_id(payload: Any) -> str | int | None:
    message = payload.get("message") if isinstance(payload, dict) else None
    rid = message.get("id") if isinstance(message, dict) else None
    return rid if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)) else None


def _annotate(env: Envelope) -> None:
    """Name the MCP method (and tool) on the span the node's tracing runs the handler in."""
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - depends on the installed extras
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("mcp.kind", env.kind)
        if env.method:
            span.set_attribute("mcp.method", env.method)
        tool = tool_name(env.message)
        if tool:
            span.set_attribute("mcp.tool", tool)


__all__ = [
    "MAX_COUNTER_KEYS",
    "METRIC_LABELS",
    "PART_QUEUE",
    "Allow",
    "Backend",
    "Limits",
    "McpCaller",
    "McpEndpoint",
    "Session",
    "request_key",
]
