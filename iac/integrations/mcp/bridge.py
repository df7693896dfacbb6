"""An existing stdio MCP server (any language) on the mesh: ``iac mcp serve --stdio -- CMD ARGS``.

:class:`StdioBridge` starts the child, makes the MCP handshake with it (``initialize`` answered
within ``init_timeout``, then ``notifications/initialized``) and lists its tools; then every IAC
caller gets an MCP session of its own whose requests reach the one child with ids of the bridge
(so callers cannot collide or answer for each other), and whose answers go back to that caller
only. The caller's ``initialize`` is answered by the bridge with the child's own answer.

Bounds (:class:`~iac.integrations.mcp.endpoint.Limits`): calls in flight per calling agent and in
total, answered at once with ``BUSY`` (-32050) beyond them, so one caller cannot hold the child
while another waits; messages over the size or depth bound, and methods that are not MCP's, get
a JSON-RPC error and a counter without reaching the child.

What a stdio child sends outside an answer: progress goes to the caller whose request named the
token; other notifications go to every session's listen stream; the child's own requests
(sampling, elicitation, roots) cannot be routed to one caller through a shared pipe and are
answered with METHOD_NOT_FOUND (``ping`` is answered). A child that exits, writes something that
is not JSON, or does not answer ``initialize`` in time fails the bridge (:attr:`failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

try:
    from mcp_types.methods import SPEC_CLIENT_METHODS, SPEC_CLIENT_NOTIFICATION_METHODS
    from mcp_types.version import LATEST_HANDSHAKE_VERSION
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("iac.integrations.mcp needs the MCP SDK: pip install 'iac-mesh[mcp]'") from exc

from iac.errors import ConfigError, LocalError
from iac.integrations.mcp.binding import (
    INTERNAL_ERROR,
    METHOD_NOT_FOUND,
    UNREACHABLE,
    McpBindingError,
    cancelled_notification,
    error_message,
    message_kind,
)
from iac.integrations.mcp.endpoint import Allow, Limits, McpEndpoint, Session, request_key
from iac.node.node import Node

log = logging.getLogger("iac.integrations")

#: Longest line the child may write (one JSON-RPC message).
MAX_CHILD_LINE = 8 << 20


class _Pending:
    __slots__ = ("rid", "session", "token")

    def __init__(self, session: Session, rid: str | int, token: Any) -> None:
        self.session, self.rid, self.token = session, rid, token


class StdioBackend:
    """The child and the id maps (see the module)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        init_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        if not argv:
            raise ConfigError("give the stdio MCP server's command: iac mcp serve --stdio -- CMD ARGS")
        self.argv = list(argv)
        self.init_timeout = init_timeout
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.endpoint: McpEndpoint | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.initialize_result: dict[str, Any] = {}
        self.tools: list[str] = []
        self.failed: asyncio.Future[LocalError] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._by_caller: dict[tuple[tuple[str, str], Any], int] = {}
        self._tokens: dict[str, int] = {}
        self._startup: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._write_lock = asyncio.Lock()
        self._reader: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- the child --------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.failed = loop.create_future()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env=self.env, cwd=self.cwd, limit=MAX_CHILD_LINE,
            )  # fmt: skip
        except OSError as exc:
            raise LocalError(
                f"cannot start {self.argv[0]!r}: {exc.strerror or exc}", reason="mcp_child_failed"
            ) from None
        self._reader = loop.create_task(self._read())
        try:
            async with asyncio.timeout(self.init_timeout):
                init = await self._startup_request(
                    "initialize",
                    {
                        "protocolVersion": LATEST_HANDSHAKE_VERSION,
                        "capabilities": {},
                        "clientInfo": {"name": "iac-mcp-bridge", "version": "1"},
                    },
                )
        except TimeoutError:
            await self.stop()
            raise LocalError(
                f"the stdio MCP server did not answer initialize within {self.init_timeout:g} s",
                reason="mcp_child_failed",
            ) from None
        except LocalError:
            await self.stop()
            raise
        if "error" in init or not isinstance(init.get("result"), dict):
            await self.stop()
            raise LocalError(
                f"the stdio MCP server refused initialize: {json.dumps(init.get('error'))[:200]}",
                reason="mcp_child_failed",
            )
        self.initialize_result = init["result"]
        await self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if "tools" in (self.initialize_result.get("capabilities") or {}):
            try:
                async with asyncio.timeout(self.init_timeout):
                    listed = await self._startup_request("tools/list", {})
                tools = (listed.get("result") or {}).get("tools") or []
                self.tools = sorted(
                    str(t.get("name")) for t in tools if isinstance(t, dict) and t.get("name")
                )
            except (TimeoutError, LocalError) as exc:
                await self.stop()
                raise LocalError(
                    f"the stdio MCP server did not list its tools: {exc}", reason="mcp_child_failed"
                ) from None

    async def _startup_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        bid = next(self._ids)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._startup[bid] = waiter
        await self._write({"jsonrpc": "2.0", "id": bid, "method": method, "params": params})
        assert self.failed is not None
        either: set[asyncio.Future[Any]] = {waiter, self.failed}
        done, _ = await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            return waiter.result()
        raise self.failed.result()

    async def stop(self) -> None:
        """Stop the child (EOF on its stdin, then SIGTERM, then SIGKILL) and the reader."""
        proc = self.proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            for step in (proc.terminate, proc.kill):
                try:
                    async with asyncio.timeout(2.0):
                        await proc.wait()
                    break
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        step()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2.0):
                    await proc.wait()
        tasks = [*self._tasks, *([self._reader] if self._reader is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _fail(self, why: str) -> None:
        if self.failed is not None and not self.failed.done():
            self.failed.set_result(LocalError(why, reason="mcp_child_failed"))
        for pending in list(self._pending.values()):
            task = asyncio.get_running_loop().create_task(self._answer_error(pending, why))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._pending.clear()

    async def _answer_error(self, pending: _Pending, why: str) -> None:
        if self.endpoint is not None:
            await self.endpoint.route(pending.session, error_message(pending.rid, UNREACHABLE, why), None)

    async def _write(self, message: dict[str, Any]) -> None:
        proc = self.proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise LocalError("the stdio MCP server is not running", reason="mcp_child_failed")
        line = json.dumps(message, separators=(",", ":"), ensure_ascii=False) + "\n"
        async with self._write_lock:
            try:
                proc.stdin.write(line.encode())
                await proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                self._fail(f"the stdio MCP server closed its stdin: {exc}")
                raise LocalError("the stdio MCP server closed its stdin", reason="mcp_child_failed") from None

    async def _read(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                self._fail(f"the stdio MCP server wrote a line over {MAX_CHILD_LINE} bytes")
                return
            if not line:
                code = await proc.wait()
                self._fail(f"the stdio MCP server exited with code {code}")
                return
            if not line.strip():
                continue
            try:
                message = json.loads(line)
                message_kind(message)
            except (ValueError, McpBindingError):
                self._fail(f"the stdio MCP server wrote what is not JSON-RPC: {line[:80]!r}")
                return
            try:
                await self._from_child(message)
            except Exception as exc:
                if isinstance(exc, LocalError) and exc.reason == "mcp_child_failed":
                    return
                log.exception("routing a message of the stdio MCP server failed")

    async def _from_child(self, message: dict[str, Any]) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        kind = message_kind(message)
        if kind == "response":
            bid = message.get("id")
            if isinstance(bid, int) and bid in self._startup:
                self._startup.pop(bid).set_result(message)
                return
            pending = self._pending.pop(bid, None) if isinstance(bid, int) else None
            if pending is None:
                endpoint.events["child_late_response"] += 1
                return
            self._by_caller.pop((pending.session.key, request_key(pending.rid)), None)
            if pending.token is not None:
                self._tokens.pop(f"iac-{bid}", None)
            await endpoint.route(pending.session, {**message, "id": pending.rid}, None)
        elif kind == "request":
            if message.get("method") == "ping":
                await self._write({"jsonrpc": "2.0", "id": message["id"], "result": {}})
                return
            endpoint.events["child_request_refused"] += 1
            await self._write(error_message(
                message["id"], METHOD_NOT_FOUND,
                f"{str(message.get('method'))[:64]} is not carried through iac mcp serve",
            ))  # fmt: skip
        else:
            raw = message.get("params")
            params: dict[str, Any] = raw if isinstance(raw, dict) else {}
            if message.get("method") == "notifications/progress":
                bid = self._tokens.get(str(params.get("progressToken")))
                pending = self._pending.get(bid) if bid is not None else None
                if pending is None:
                    endpoint.events["child_progress_dropped"] += 1
                    return
                restored = {**message, "params": {**params, "progressToken": pending.token}}
                await endpoint.route(pending.session, restored, pending.rid)
                return
            for session in list(endpoint.sessions.values()):  # list_changed, log messages
                await endpoint.route(session, message, None)

    # --- the sessions -----------------------------------------------------------------------------

    async def open(self, session: Session) -> None:
        return None

    async def deliver(self, session: Session, message: dict[str, Any]) -> None:
        endpoint = self.endpoint
        assert endpoint is not None
        kind = message_kind(message)
        method = str(message.get("method", ""))
        if kind == "request":
            rid = message["id"]
            if method not in SPEC_CLIENT_METHODS:
                endpoint.refused["unknown_method"] += 1
                await endpoint.route(
                    session, error_message(rid, METHOD_NOT_FOUND, f"no MCP method {method[:64]!r}"), None
                )
                return
            if method == "initialize":
                await endpoint.route(
                    session, {"jsonrpc": "2.0", "id": rid, "result": self.initialize_result}, None
                )
                return
            if method == "ping":
                await endpoint.route(session, {"jsonrpc": "2.0", "id": rid, "result": {}}, None)
                return
            bid = next(self._ids)
            params = message.get("params")
            token = None
            if (
                isinstance(params, dict)
                and isinstance(params.get("_meta"), dict)
                and "progressToken" in params["_meta"]
            ):
                token = params["_meta"]["progressToken"]
                params = {**params, "_meta": {**params["_meta"], "progressToken": f"iac-{bid}"}}
                self._tokens[f"iac-{bid}"] = bid
            self._pending[bid] = _Pending(session, rid, token)
            self._by_caller[(session.key, request_key(rid))] = bid
            forward = {**message, "id": bid}
            if params is not None:
                forward["params"] = params
            try:
                await self._write(forward)
            except LocalError as exc:
                self._pending.pop(bid, None)
                await endpoint.route(session, error_message(rid, INTERNAL_ERROR, str(exc)), None)
            return
        if kind == "notification":
            if method not in SPEC_CLIENT_NOTIFICATION_METHODS:
                endpoint.refused["unknown_method"] += 1
                return
            if method == "notifications/cancelled":
                raw = message.get("params")
                with contextlib.suppress(TypeError, ValueError):
                    self.cancel(session, raw.get("requestId") if isinstance(raw, dict) else None)
                return
            if method in ("notifications/initialized", "notifications/progress"):
                return  # the bridge made the handshake; client progress is not forwarded
            await self._write(message)
        # a response: the bridge forwards no request of the child, so nothing awaits it

    def cancel(self, session: Session, rid: Any) -> None:
        bid = self._by_caller.pop((session.key, request_key(rid)), None)
        if bid is None:
            return
        pending = self._pending.pop(bid, None)
        self._tokens.pop(f"iac-{bid}", None)
        loop = asyncio.get_running_loop()
        work = [self._quiet_write(cancelled_notification(bid, "the caller cancelled"))]
        if pending is not None and self.endpoint is not None:
            work.append(self.endpoint.unanswered(session, rid))
        for coro in work:
            task = loop.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _quiet_write(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(LocalError):
            await self._write(message)

    async def close(self, session: Session) -> None:
        for (key, rkey), _bid in list(self._by_caller.items()):
            if key == session.key:
                self.cancel(session, rkey[1])

    def has_tool(self, name: str) -> bool:
        return name in self.tools


class StdioBridge(McpEndpoint):
    """A stdio MCP server (``argv``) answering MCP over IAC on ``node``: ``await bridge.start()``
    (raises ``mcp_child_failed``), then ``await bridge.failed`` says when the child broke;
    ``await bridge.stop()`` stops it."""

    def __init__(
        self,
        node: Node,
        argv: Sequence[str],
        *,
        allow: Allow = None,
        limits: Limits | None = None,
        init_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        trusted_gateways: Collection[str] = (),
    ) -> None:
        backend = StdioBackend(argv, init_timeout=init_timeout, env=env, cwd=cwd)
        super().__init__(node, backend, allow=allow, limits=limits, trusted_gateways=trusted_gateways)
        backend.endpoint = self
        self.child = backend

    async def start(self) -> StdioBridge:
        await self.child.start()
        self.attach()
        return self

    @property
    def failed(self) -> asyncio.Future[LocalError]:
        assert self.child.failed is not None, "start() first"
        return self.child.failed

    async def tool_names(self) -> list[str]:
        """The tools the child listed at start (to publish them: :mod:`.discovery`)."""
        return list(self.child.tools)

    async def stop(self) -> None:
        await self.close()
        await self.child.stop()


__all__ = ["MAX_CHILD_LINE", "StdioBackend", "StdioBridge"]
