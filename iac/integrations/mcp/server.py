"""An MCP server of the ``mcp`` SDK (``MCPServer`` or the low-level ``Server``) answering MCP over
IAC on an :class:`iac.Node`.

::

    mcp = MCPServer("tools")

    @mcp.tool()
    async def add(a: int, b: int, ctx: Context) -> int:
        caller = caller_of(ctx)          # McpCaller: the AgentId that signed the call
        return a + b

    async with Node(listen=[...], config=announce(NodeConfig())) as node:
        server = serve(node, mcp, allow={"*": {"add"}})

Each caller session is one ``server.run(read, write, ...)`` of the SDK over memory streams; every
message the caller sends reaches it only after the node's receive pipeline passed it (signature,
freshness, replay, policy) and the binding's checks. The tool sees the caller as
``ctx.request_context.request`` (an :class:`McpCaller`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Collection
from typing import Any

try:
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.shared._context_streams import create_context_streams
    from mcp.shared.message import ServerMessageMetadata, SessionMessage
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("iac.integrations.mcp needs the MCP SDK: pip install 'iac-mesh[mcp]'") from exc

from iac.integrations.mcp.binding import McpBindingError, cancelled_notification
from iac.integrations.mcp.endpoint import Allow, Limits, McpCaller, McpEndpoint, Session
from iac.node.node import Node

log = logging.getLogger("iac.integrations")

#: Messages a session's streams toward the SDK server hold.
_BUFFER = 32


def dump(message: Any) -> dict[str, Any]:
    """A JSON-RPC message of the SDK as the JSON object that travels."""
    out: dict[str, Any] = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return out


def load(message: dict[str, Any]) -> Any:
    """A JSON object as the SDK's JSON-RPC message; :class:`McpBindingError` when it is none."""
    try:
        return types.jsonrpc_message_adapter.validate_python(message, by_name=False)
    except ValidationError as exc:
        raise McpBindingError(
            "not_jsonrpc", f"not an MCP JSON-RPC message: {exc.error_count()} errors"
        ) from None


class _Streams:
    """One session's SDK server: the stream it reads and the tasks that run it."""

    def __init__(self) -> None:
        self.send, self.recv = create_context_streams[SessionMessage | Exception](_BUFFER)
        self.out_send, self.out_recv = create_context_streams[SessionMessage](_BUFFER)
        self.tasks: list[asyncio.Task[Any]] = []


class SdkBackend:
    """Runs an SDK server per session (see the module)."""

    def __init__(self, server: MCPServer | Server[Any], *, raise_exceptions: bool = False) -> None:
        self.mcp = server
        lowlevel: Server[Any] = server._lowlevel_server if isinstance(server, MCPServer) else server
        self.lowlevel = lowlevel
        self.raise_exceptions = raise_exceptions
        self.endpoint: McpEndpoint | None = None
        self._tool_names: set[str] = set()

    async def open(self, session: Session) -> None:
        assert self.endpoint is not None
        streams = _Streams()
        session.state = streams
        loop = asyncio.get_running_loop()
        clean = contextvars.Context()  # the session outlives the request that opened it
        options = self.lowlevel.create_initialization_options()

        async def run() -> None:
            try:
                await self.lowlevel.run(
                    streams.recv, streams.out_send, options, raise_exceptions=self.raise_exceptions
                )
            except Exception:
                log.exception("an MCP session's server failed")

        async def pump() -> None:
            endpoint = self.endpoint
            assert endpoint is not None
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
                async for item in streams.out_recv:
                    meta = item.metadata
                    related = meta.related_request_id if isinstance(meta, ServerMessageMetadata) else None
                    await endpoint.route(session, dump(item.message), related)

        streams.tasks = [
            loop.create_task(run(), context=clean),
            loop.create_task(pump(), context=clean.copy()),
        ]

    async def deliver(self, session: Session, message: dict[str, Any]) -> None:
        streams: _Streams = session.state
        endpoint = self.endpoint
        assert endpoint is not None
        parsed = load(message)
        metadata: ServerMessageMetadata | None = None
        if "id" in message and "method" in message:
            rid = message["id"]

            async def unanswered() -> None:
                await endpoint.unanswered(session, rid)

            metadata = ServerMessageMetadata(request_context=session.caller, on_request_unanswered=unanswered)
        else:
            metadata = ServerMessageMetadata(request_context=session.caller)
        await streams.send.send(SessionMessage(parsed, metadata=metadata))

    def cancel(self, session: Session, rid: str | int) -> None:
        streams: _Streams = session.state
        note = SessionMessage(load(cancelled_notification(rid, "the caller closed the stream")))
        task = asyncio.get_running_loop().create_task(self._send_quietly(streams, note))
        streams.tasks.append(task)

        def forget(done: asyncio.Task[Any]) -> None:
            if done in streams.tasks:
                streams.tasks.remove(done)

        task.add_done_callback(forget)

    @staticmethod
    async def _send_quietly(streams: _Streams, note: SessionMessage) -> None:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await streams.send.send(note)

    async def close(self, session: Session) -> None:
        streams: _Streams | None = session.state
        if streams is None:
            return
        await streams.send.aclose()  # EOF: the SDK server ends its session
        run = streams.tasks[0]
        try:
            async with asyncio.timeout(2.0):
                await asyncio.shield(run)
        except TimeoutError:
            pass
        for task in streams.tasks:
            task.cancel()
        await asyncio.gather(*streams.tasks, return_exceptions=True)
        await streams.out_recv.aclose()

    def has_tool(self, name: str) -> bool:
        if isinstance(self.mcp, MCPServer):
            return self.mcp._tool_manager.get_tool(name) is not None
        return name in self._tool_names

    @property
    def low_level_tool_names(self) -> frozenset[str]:
        """The tools set with :meth:`set_tool_names` (a low-level server's)."""
        return frozenset(self._tool_names)

    def set_tool_names(self, names: set[str]) -> None:
        """The tools a low-level server serves (what ``has_tool`` answers; MCPServer knows its own)."""
        self._tool_names = set(names)


class McpServer(McpEndpoint):
    """An SDK MCP server on ``node`` (see the module); ``stats()`` counts its calls."""

    def __init__(
        self,
        node: Node,
        server: MCPServer | Server[Any],
        *,
        allow: Allow = None,
        limits: Limits | None = None,
        trusted_gateways: Collection[str] = (),
        raise_exceptions: bool = False,
    ) -> None:
        backend = SdkBackend(server, raise_exceptions=raise_exceptions)
        super().__init__(node, backend, allow=allow, limits=limits, trusted_gateways=trusted_gateways)
        backend.endpoint = self
        self.sdk = backend

    async def tool_names(self) -> list[str]:
        """The names of the tools the server serves (to publish them: :mod:`.discovery`)."""
        if isinstance(self.sdk.mcp, MCPServer):
            return sorted(t.name for t in await self.sdk.mcp.list_tools())
        return sorted(self.sdk.low_level_tool_names)


def serve(
    node: Node,
    server: MCPServer | Server[Any],
    *,
    allow: Allow = None,
    limits: Limits | None = None,
    trusted_gateways: Collection[str] = (),
    raise_exceptions: bool = False,
) -> McpServer:
    """Answer MCP over IAC on ``node`` with the SDK ``server`` (see :class:`McpServer`).
    ``trusted_gateways``: AgentIds whose principal (field 19) tools may believe."""
    endpoint = McpServer(
        node, server, allow=allow, limits=limits, trusted_gateways=trusted_gateways,
        raise_exceptions=raise_exceptions,
    )  # fmt: skip
    endpoint.attach()
    return endpoint


def caller_of(ctx: Any) -> McpCaller | None:
    """The caller of a tool (its ``Context``, or the low-level request context), or None when the
    call did not come over IAC."""
    request_context = getattr(ctx, "request_context", ctx)
    request = getattr(request_context, "request", None)
    return request if isinstance(request, McpCaller) else None


__all__ = ["McpServer", "SdkBackend", "caller_of", "dump", "load", "serve"]
