"""MCP over IAC, the binding itself (docs/PROTOCOL.md, "Extension: MCP over IAC"): how a JSON-RPC
message of the Model Context Protocol is written into an IAC message, which checks it passes, and
how tools are published in registry records. Sans-IO: no node, no socket, no clock.

* Every payload is a JSON object ``{"mcp": "1", "session": SID, ...}`` in a RUN message
  (``payload_json``); ``session`` is the MCP session the caller chose (16 to 64 characters of
  ``[A-Za-z0-9_-]``), scoped by the caller's AgentId.
* ``"message": {...}``: one JSON-RPC message. A request travels as a RUN request flagged STREAM:
  what the server sends about it (progress, log messages, its own requests such as sampling) are
  REPLY parts of that stream, and the response is the last part before END. A notification, or
  the answer to a server's request, is a RUN request answered by ``{"ok": true}``.
* ``"listen": true``: a STREAM request whose parts are the session's messages that belong to no
  request (list-changed notifications, server requests outside a call).
* ``"close": true``: the caller ends the session.
* ``"has_tool": NAME``: does this agent serve tool NAME to the caller? ``{"has_tool": bool}``
  (the lookup behind :func:`tool_bucket`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from iac.errors import ConfigError, McpBindingError
from iac.node.config import NodeConfig
from iac.wire.enums import MessageType

#: The HELLO (and registry record) capability that announces MCP over IAC.
CAPABILITY = "mcp/1"
#: The binding's version (the ``mcp`` member of every payload).
VERSION = "1"
#: The IAC message type that carries the binding (beside A2A's; the payload tells them apart).
MSG_TYPE = MessageType.RUN
#: Largest JSON-RPC message (UTF-8 bytes of ``payload_json``) either side takes.
MAX_MESSAGE_BYTES = 1 << 20
#: Deepest nesting of arrays and objects in a JSON-RPC message.
MAX_DEPTH = 32
#: Registry record capabilities of tools: an exact digest per tool, or one of this many buckets.
TOOL_PREFIX = "mcp-tool:"
BUCKET_PREFIX = "mcp-tools:"
TOOL_BUCKETS = 48
#: Record capabilities left for tool digests (a record holds 64; some are the agent's own).
DEFAULT_TOOL_ROOM = 56

# JSON-RPC error codes. The standard ones, then the binding's (in the server-error range).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603
#: The remote agent is gone or could not be reached (the SDK's CONNECTION_CLOSED).
UNREACHABLE = -32000
#: The agent did not answer in time (the SDK's REQUEST_TIMEOUT).
REQUEST_TIMEOUT = -32001
#: Too many calls in flight (from this caller, or in total).
BUSY = -32050
#: The per-peer allow-list refuses the tool to this caller.
TOOL_REFUSED = -32051
#: The server holds as many sessions as it may (for this caller, or in total).
SESSIONS_FULL = -32052

_SESSION = re.compile(r"[A-Za-z0-9_-]{16,64}")


@dataclass(frozen=True, slots=True)
class Envelope:
    """A decoded payload: the session and what it carries (``kind``: ``request``,
    ``notification``, ``response``, ``listen``, ``close`` or ``has_tool``)."""

    session: str
    kind: str
    message: dict[str, Any] | None = None
    tool: str = ""

    @property
    def request_id(self) -> str | int | None:
        return self.message.get("id") if self.message is not None else None

    @property
    def method(self) -> str:
        return str(self.message.get("method", "")) if self.message is not None else ""


def is_mcp(payload: Any) -> bool:
    """True for a payload of this binding (a dict naming ``mcp``), whatever its validity."""
    return isinstance(payload, dict) and "mcp" in payload


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value (a scalar is 0), counted up to ``limit + 1`` at most."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, dict | list):
            d += 1
            deepest = max(deepest, d)
            if d > limit:
                return d
            stack.extend((v, d) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def message_kind(message: Any) -> str:
    """``request``, ``notification`` or ``response`` (a result or an error) of a JSON-RPC 2.0
    message; :class:`McpBindingError` (``not_jsonrpc``) for anything else."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        raise McpBindingError("not_jsonrpc", "not a JSON-RPC 2.0 message")
    rid = message.get("id")
    has_id = "id" in message and (
        isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool))
    )
    if "id" in message and not has_id:
        raise McpBindingError("not_jsonrpc", "a JSON-RPC id is a string or an integer")
    if "method" in message:
        if not isinstance(message["method"], str) or not message["method"]:
            raise McpBindingError("not_jsonrpc", "a JSON-RPC method is a non-empty string")
        params = message.get("params")
        if params is not None and not isinstance(params, dict | list):
            raise McpBindingError("not_jsonrpc", "JSON-RPC params are an object or an array")
        return "request" if has_id else "notification"
    if has_id and ("result" in message) != ("error" in message):
        if "error" in message:
            err = message["error"]
            if not isinstance(err, dict) or not isinstance(err.get("code"), int):
                raise McpBindingError("not_jsonrpc", "a JSON-RPC error is an object with a code")
        return "response"
    raise McpBindingError("not_jsonrpc", "neither a request, a notification nor a response")


def check_session(session: Any) -> str:
    if not isinstance(session, str) or not _SESSION.fullmatch(session):
        raise McpBindingError("bad_session", "a session id is 16 to 64 characters of [A-Za-z0-9_-]")
    return session


def parse_payload(payload: Any, size: int = 0, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Envelope:
    """Decode and check a payload (``size``: the bytes of its ``payload_json``)."""
    if size > max_bytes:
        raise McpBindingError("too_large", f"an MCP message is at most {max_bytes} bytes, not {size}")
    if not isinstance(payload, dict):
        raise McpBindingError("not_mcp", "an MCP over IAC payload is a JSON object")
    if payload.get("mcp") != VERSION:
        raise McpBindingError("bad_version", f"MCP over IAC version {str(payload.get('mcp'))[:16]!r}; "
                              f"this side speaks {VERSION}")  # fmt: skip
    session = check_session(payload.get("session"))
    if payload.get("listen") is True:
        return Envelope(session, "listen")
    if payload.get("close") is True:
        return Envelope(session, "close")
    if "has_tool" in payload:
        tool = payload["has_tool"]
        if not isinstance(tool, str) or not tool or len(tool) > 1024:
            raise McpBindingError("not_mcp", "has_tool names a tool (1 to 1024 characters)")
        return Envelope(session, "has_tool", tool=tool)
    message = payload.get("message")
    if depth(message) > MAX_DEPTH:
        raise McpBindingError("too_deep", f"an MCP message nests at most {MAX_DEPTH} levels")
    return Envelope(session, message_kind(message), message)


# --- building payloads ----------------------------------------------------------------------------


def message_payload(session: str, message: dict[str, Any]) -> dict[str, Any]:
    return {"mcp": VERSION, "session": session, "message": message}


def listen_payload(session: str) -> dict[str, Any]:
    return {"mcp": VERSION, "session": session, "listen": True}


def close_payload(session: str) -> dict[str, Any]:
    return {"mcp": VERSION, "session": session, "close": True}


def has_tool_payload(session: str, tool: str) -> dict[str, Any]:
    return {"mcp": VERSION, "session": session, "has_tool": tool}


def error_message(rid: str | int | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response."""
    error: dict[str, Any] = {"code": code, "message": message[:1000]}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def cancelled_notification(rid: str | int, reason: str) -> dict[str, Any]:
    """MCP's ``notifications/cancelled`` for request ``rid``."""
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": rid, "reason": reason[:200]},
    }


def tool_name(message: dict[str, Any] | None) -> str | None:
    """The tool a ``tools/call`` request names (None for other messages)."""
    if message is None or message.get("method") != "tools/call":
        return None
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else ""


# --- announcing and publishing --------------------------------------------------------------------


def announce(config: NodeConfig) -> NodeConfig:
    """``config`` with :data:`CAPABILITY` among the capabilities its HELLOs announce (a node that
    serves MCP over IAC is made with it; callers check it before they send)."""
    caps = config.transport.capabilities
    if CAPABILITY in caps:
        return config
    return replace(config, transport=replace(config.transport, capabilities=(*caps, CAPABILITY)))


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()


def tool_capability(name: str) -> str:
    """The exact capability of tool ``name``: ``mcp-tool:`` and 32 hex digits of its SHA-256
    (41 characters, whatever the name's length or alphabet)."""
    return TOOL_PREFIX + _digest(name)[:32]


def tool_bucket(name: str) -> str:
    """The bucket capability of tool ``name`` (``mcp-tools:NN``, one of :data:`TOOL_BUCKETS`):
    published instead of exact digests by a server with more tools than a record has room for;
    a finder confirms a bucket's agents with the ``has_tool`` lookup."""
    return f"{BUCKET_PREFIX}{int(_digest(name)[:8], 16) % TOOL_BUCKETS:02d}"


def tool_capabilities(names: Iterable[str], room: int = DEFAULT_TOOL_ROOM) -> list[str]:
    """The record capabilities that publish ``names``: :data:`CAPABILITY`, then an exact digest
    per tool when they fit in ``room``, else their buckets (at most :data:`TOOL_BUCKETS`)."""
    unique = sorted(set(names))
    if room < 1:
        raise ConfigError("room for tool capabilities must be at least 1")
    if len(unique) <= room - 1:
        caps = {tool_capability(n) for n in unique}
    else:
        caps = {tool_bucket(n) for n in unique}
        if len(caps) > room - 1:
            raise ConfigError(f"{len(caps)} tool buckets do not fit in {room} capabilities")
    return [CAPABILITY, *sorted(caps)]


def merge_capabilities(own: Sequence[str], tools: Sequence[str]) -> tuple[str, ...]:
    """An agent's own capabilities with the tool ones (old tool capabilities replaced)."""
    kept = [c for c in own if not c.startswith((TOOL_PREFIX, BUCKET_PREFIX)) and c != CAPABILITY]
    return tuple(sorted({*kept, *tools}))


__all__ = [
    "BUCKET_PREFIX",
    "BUSY",
    "CAPABILITY",
    "DEFAULT_TOOL_ROOM",
    "INTERNAL_ERROR",
    "INVALID_REQUEST",
    "MAX_DEPTH",
    "MAX_MESSAGE_BYTES",
    "METHOD_NOT_FOUND",
    "MSG_TYPE",
    "PARSE_ERROR",
    "REQUEST_TIMEOUT",
    "SESSIONS_FULL",
    "TOOL_BUCKETS",
    "TOOL_PREFIX",
    "TOOL_REFUSED",
    "UNREACHABLE",
    "VERSION",
    "Envelope",
    "McpBindingError",
    "announce",
    "cancelled_notification",
    "check_session",
    "close_payload",
    "depth",
    "error_message",
    "has_tool_payload",
    "is_mcp",
    "listen_payload",
    "merge_capabilities",
    "message_kind",
    "message_payload",
    "parse_payload",
    "tool_bucket",
    "tool_capabilities",
    "tool_capability",
    "tool_name",
]
