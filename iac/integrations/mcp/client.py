"""The client side of MCP over IAC: the read and write streams an ``mcp`` ``ClientSession`` runs
over, carried by an :class:`iac.Node` to one agent (QUIC, TLS/TCP or UNIX, with its fallback).

::

    async with connect(node, agent_id) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("add", {"a": 1, "b": 2})

Every message the session writes is an IAC message signed by the node. A request is a STREAM
request: what the server sends about it (progress, its own requests such as sampling, then the
response) comes back as its parts, in order, with the stream's credit as flow control. The
session's ``notifications/cancelled`` goes to the server and closes the request's stream (IAC
CANCEL). When the agent cannot be reached, every request in flight and every new one is answered
with a JSON-RPC error (``UNREACHABLE``, -32000) naming the failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import secrets
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from types import TracebackType
from typing import Any

try:
    import anyio
    from mcp.shared._context_streams import ContextReceiveStream, ContextSendStream, create_context_streams
    from mcp.shared.message import SessionMessage
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("iac.integrations.mcp needs the MCP SDK: pip install 'iac-mesh[mcp]'") from exc

from iac.errors import ConfigError, IacError, PeerError, RemoteError, RequestTimeout
from iac.integrations.mcp.binding import (
    CAPABILITY,
    INTERNAL_ERROR,
    MSG_TYPE,
    REQUEST_TIMEOUT,
    UNREACHABLE,
    McpBindingError,
    close_payload,
    error_message,
    has_tool_payload,
    listen_payload,
    message_kind,
    message_payload,
)
from iac.integrations.mcp.endpoint import request_key
from iac.integrations.mcp.server import dump, load
from iac.node.node import Node
from iac.node.types import Reply

log = logging.getLogger("iac.integrations")

_BUFFER = 32
#: How long a listen stream lasts before it is opened again (a stream's timeout is finite).
_LISTEN_SPAN = 3600.0


class ClientStats:
    """Counters of a client transport: ``calls`` per method, ``failed`` per reason."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {"calls": dict(self.calls), "failed": dict(self.failed)}


class McpClientTransport:
    """The streams of an MCP client session toward ``peer`` (see the module). An async context
    manager yielding ``(read_stream, write_stream)``.

    ``timeout``: seconds a notification or an answer to the server may take to be taken;
    ``call_timeout``: seconds a request may take in all (its stream's timeout); ``window``: parts
    a request's stream may run ahead; ``listen``: open the session's listen stream (the server's
    messages that belong to no request) once the session is initialized; ``principal``: for a
    gateway, whom it calls for (field 19). ``on_unreachable(exc)`` runs once when the agent is
    gone (the CLI prints a line)."""

    def __init__(
        self,
        node: Node,
        peer: str,
        *,
        timeout: float = 30.0,
        call_timeout: float = 300.0,
        window: int = 16,
        listen: bool = True,
        principal: str = "",
        check_capability: bool = True,
        on_unreachable: Callable[[BaseException], None] | None = None,
        stats: ClientStats | None = None,
    ) -> None:
        if timeout <= 0 or call_timeout <= 0:
            raise ConfigError("timeout and call_timeout must be positive")
        self.node = node
        self.peer = peer
        self.session = secrets.token_hex(16)
        self.timeout = timeout
        self.call_timeout = call_timeout
        self.window = window
        self.listen = listen
        self.principal = principal
        self.check_capability = check_capability
        self.on_unreachable = on_unreachable
        self.stats = stats or ClientStats()
        self._calls: dict[tuple[str, str | int], asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pump_task: asyncio.Task[None] | None = None
        self._gone: BaseException | None = None
        self._read_send: ContextSendStream[SessionMessage | Exception]
        self._read_recv: ContextReceiveStream[SessionMessage | Exception]
        self._write_send: ContextSendStream[SessionMessage]
        self._write_recv: ContextReceiveStream[SessionMessage]

    async def __aenter__(
        self,
    ) -> tuple[ContextReceiveStream[SessionMessage | Exception], ContextSendStream[SessionMessage]]:
        if self.check_capability:
            await self.check()
        self._read_send, self._read_recv = create_context_streams[SessionMessage | Exception](_BUFFER)
        self._write_send, self._write_recv = create_context_streams[SessionMessage](_BUFFER)
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        return self._read_recv, self._write_send

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End the session: close the streams, stop the calls in flight (CANCEL), tell the server."""
        with contextlib.suppress(Exception):
            await self._write_send.aclose()
        tasks = [*self._calls.values(), *self._tasks]
        if self._pump_task is not None:
            tasks.append(self._pump_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._gone is None:
            with contextlib.suppress(IacError, OSError, TimeoutError):
                await self.node.request(
                    self.peer, MSG_TYPE, close_payload(self.session), timeout=min(self.timeout, 2.0)
                )
        with contextlib.suppress(Exception):
            await self._read_send.aclose()

    async def check(self) -> None:
        """Dial the agent; ``mcp_unsupported`` when its HELLO does not announce ``mcp/1``. (An
        agent reached through a relay has no HELLO here: its registry record is the announcement.)"""
        with contextlib.suppress(ConfigError):  # not in the peer book: a route or a relay reaches it
            await self.node.connect(self.peer)
        conn = self.node.connection(self.peer)
        if conn is not None and CAPABILITY not in conn.peer.hello.capabilities:
            raise PeerError(
                f"agent {self.peer[:16]}… does not announce {CAPABILITY} in its HELLO",
                reason="mcp_unsupported",
            )

    async def has_tool(self, tool: str) -> bool:
        """Ask the agent whether it serves ``tool`` to this caller (the discovery lookup)."""
        reply = await self.node.request(
            self.peer, MSG_TYPE, has_tool_payload(self.session, tool), timeout=self.timeout
        )
        return isinstance(reply.payload, dict) and reply.payload.get("has_tool") is True

    # --- the session's writes ---------------------------------------------------------------------

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            async for item in self._write_recv:
                sender: contextvars.Context | None = self._write_recv.last_context
                message = dump(item.message)
                try:
                    kind = message_kind(message)
                except McpBindingError:
                    self.stats.failed["bad_write"] += 1
                    log.warning("MCP over IAC: the session wrote what is not JSON-RPC; dropped")
                    continue
                if kind == "request":
                    self.stats.calls[str(message["method"])] += 1
                    ctx = sender.copy() if sender is not None else None
                    task = loop.create_task(self._call(message), context=ctx)
                    key = request_key(message["id"])
                    self._calls[key] = task
                    task.add_done_callback(self._forget_call(key))
                    continue
                await self._one_way(message)
                if kind == "notification" and message.get("method") == "notifications/cancelled":
                    rid = (message.get("params") or {}).get("requestId")
                    with contextlib.suppress(TypeError, ValueError):
                        call = self._calls.get(request_key(rid))
                        if call is not None:
                            call.cancel()  # closes its stream: CANCEL
                if (
                    kind == "notification"
                    and message.get("method") == "notifications/initialized"
                    and self.listen
                ):
                    task = loop.create_task(self._listen())
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)

    def _forget_call(self, key: tuple[str, str | int]) -> Callable[[asyncio.Task[None]], None]:
        def forget(task: asyncio.Task[None]) -> None:
            if self._calls.get(key) is task:
                del self._calls[key]

        return forget

    async def _one_way(self, message: dict[str, Any]) -> None:
        if self._gone is not None:
            return
        try:
            await self.node.request(
                self.peer, MSG_TYPE, message_payload(self.session, message),
                timeout=self.timeout, principal=self.principal,
            )  # fmt: skip
        except RemoteError as exc:
            self.stats.failed[exc.code] += 1
            log.warning("MCP over IAC: %s… refused a message: %s", self.peer[:16], exc)
        except IacError as exc:
            self._unreachable(exc)

    async def _call(self, message: dict[str, Any]) -> None:
        rid = message["id"]
        answered = False
        stream = self._stream(
            self.peer, MSG_TYPE, message_payload(self.session, message),
            timeout=self.call_timeout, window=self.window, principal=self.principal,
        )  # fmt: skip
        try:
            async with contextlib.aclosing(stream) as parts:
                async for part in parts:
                    self._gone = None  # the agent answers (again)
                    got = self._part(part.payload)
                    if got is None:
                        continue
                    if "method" not in got and "id" in got:  # the response: the last part
                        if got.get("id") is None:  # a binding refusal that could not name the id
                            got = {**got, "id": rid}
                        answered = True
                        if "error" in got:
                            self.stats.failed[str(got["error"].get("code"))] += 1
                    await self._answer(got)
            if not answered:
                self.stats.failed["no_response"] += 1
                await self._answer(
                    error_message(rid, INTERNAL_ERROR, "the agent ended the call without a response")
                )
        except RemoteError as exc:
            self.stats.failed[exc.code] += 1
            await self._answer(
                error_message(rid, UNREACHABLE, f"agent {self.peer[:16]}… refused the call: {exc}")
            )
        except RequestTimeout as exc:
            self.stats.failed["timeout"] += 1
            await self._answer(
                error_message(rid, REQUEST_TIMEOUT, f"no answer from {self.peer[:16]}…: {exc}")
            )
        except IacError as exc:
            self._unreachable(exc)
            await self._answer(
                error_message(rid, UNREACHABLE, f"the remote agent {self.peer[:16]}… is gone: {exc}")
            )

    def _stream(self, *args: Any, **kwargs: Any) -> AsyncGenerator[Reply]:
        return self.node.stream(*args, **kwargs)

    def _part(self, payload: Any) -> dict[str, Any] | None:
        message = payload.get("message") if isinstance(payload, dict) else None
        try:
            message_kind(message)
        except McpBindingError:
            self.stats.failed["bad_part"] += 1
            return None
        assert isinstance(message, dict)
        return message

    async def _answer(self, message: dict[str, Any]) -> None:
        try:
            parsed = load(message)
        except McpBindingError:
            self.stats.failed["bad_part"] += 1
            rid = message.get("id")
            if "method" in message or not isinstance(rid, str | int):
                return
            parsed = load(error_message(rid, INTERNAL_ERROR, "the agent answered a malformed message"))
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._read_send.send(SessionMessage(parsed))

    async def _listen(self) -> None:
        while self._gone is None:
            stream = self._stream(
                self.peer, MSG_TYPE, listen_payload(self.session),
                timeout=_LISTEN_SPAN, window=self.window, principal=self.principal,
            )  # fmt: skip
            try:
                async with contextlib.aclosing(stream) as parts:
                    async for part in parts:
                        if isinstance(part.payload, dict) and part.payload.get("ok") is False:
                            self.stats.failed["listen_refused"] += 1
                            return  # the agent holds as many listen streams as it may
                        got = self._part(part.payload)
                        if got is not None:
                            await self._answer(got)
            except RemoteError as exc:
                self.stats.failed[f"listen_{exc.code}"] += 1
                return
            except RequestTimeout:
                continue  # the listen stream's span ended: open it again
            except IacError as exc:
                self._unreachable(exc)
                return

    def _unreachable(self, exc: BaseException) -> None:
        """The agent could not be reached (this call fails; the next one dials again)."""
        self.stats.failed["unreachable"] += 1
        if self._gone is None:
            self._gone = exc
            if self.on_unreachable is not None:
                self.on_unreachable(exc)


def connect(node: Node, peer: str, **options: Any) -> McpClientTransport:
    """The streams of an MCP ``ClientSession`` toward agent ``peer`` over ``node``:
    ``async with connect(node, peer) as (read, write)`` (see :class:`McpClientTransport`)."""
    return McpClientTransport(node, peer, **options)


__all__ = ["ClientStats", "McpClientTransport", "connect"]
