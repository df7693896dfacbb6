"""proto/testvectors/mcp.json: MCP over IAC (docs/PROTOCOL.md, "Extension: MCP over IAC").

    .venv/bin/python -m tools.make_mcp_vectors

Deterministic: fixed seeds, session ids and a fixed timestamp. Every payload is built with the
binding's own builders (:mod:`iac.integrations.mcp.binding`) and decoded back with its parser;
``signed_hex`` is the whole signed RUN message (Ed25519 is deterministic), so another
implementation can check its bytes, its signature and its payload. ``refusals`` are payloads a
receiver answers with a JSON-RPC error (``code``) and counts (``reason``); ``tools`` are the
registry capabilities that publish tool names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from iac.integrations.mcp import binding as b
from iac.wire.enums import MessageType
from iac.wire.identity import Identity
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import FLAG_STREAM, Session, build_message, sign_message
from tools.vectors import render, write

MCP_VECTORS_VERSION = 1
TIME_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
CALLER = Identity.from_seed(bytes([0x77]) * 32)
AGENT = Identity.from_seed(bytes([0x88]) * 32)
SESSION = "0123456789abcdef0123456789abcdef"


def _message(
    name: str,
    about: str,
    payload: dict[str, Any],
    *,
    stream: bool,
    sender: Identity = CALLER,
    to: Identity = AGENT,
    msg_id: int,
    msg_type: int = MessageType.RUN,
    reply_to: int = 0,
    flags: int = 0,
) -> dict[str, Any]:
    text = dumps_compact(payload)
    msg = build_message(
        sender=sender.agent_id,
        to=to.agent_id,
        msg_type=msg_type,
        session=Session(0x1C0FFEE if sender is CALLER else 0x2C0FFEE),
        timestamp_us=TIME_US,
        payload_json=text,
        msg_id=msg_id,
        reply_to=reply_to,
        reply_session_id=0x1C0FFEE if reply_to else 0,
        flags=flags | (FLAG_STREAM if stream else 0),
        deadline_us=TIME_US + 30_000_000 if msg_type == MessageType.RUN else 0,
    )
    if stream and msg_type == MessageType.RUN:
        msg.credit = 16  # the window the caller grants
    elif stream:
        msg.stream_seq = msg_id  # the agent's parts: 1, 2, 3 ...
    signed = sign_message(sender, msg)
    out: dict[str, Any] = {
        "name": name,
        "description": about,
        "writer": "caller" if sender is CALLER else "agent",
    }
    out["msg_type"] = MessageType(msg_type).name
    out["stream"] = stream
    out["payload"] = payload
    out["payload_json"] = text
    if msg_type == MessageType.RUN:
        env = b.parse_payload(payload, len(text.encode()))
        out["kind"] = env.kind
    out["signed_hex"] = signed.hex()
    return out


def mcp_vectors() -> dict[str, Any]:
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "add", "arguments": {"a": 2, "b": 40}, "_meta": {"progressToken": 7}},
    }
    progress = {
        "jsonrpc": "2.0",
        "method": "notifications/progress",
        "params": {"progressToken": 7, "progress": 1, "total": 2},
    }
    sampling = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "sampling/createMessage",
        "params": {
            "messages": [{"role": "user", "content": {"type": "text", "text": "hi"}}],
            "maxTokens": 20,
        },
    }
    sampled = {
        "jsonrpc": "2.0",
        "id": 1,
        "result": {"role": "assistant", "content": {"type": "text", "text": "hello"}, "model": "m"},
    }
    result = {
        "jsonrpc": "2.0",
        "id": 7,
        "result": {"content": [{"type": "text", "text": "42"}], "isError": False},
    }
    cancelled = b.cancelled_notification(8, "the user pressed stop")
    vectors = [
        _message(
            "initialize",
            "the session's first request (a STREAM RUN request)",
            b.message_payload(
                SESSION,
                {
                    "jsonrpc": "2.0",
                    "id": 0,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-11-25",
                        "capabilities": {"sampling": {}},
                        "clientInfo": {"name": "host", "version": "1"},
                    },
                },
            ),
            stream=True,
            msg_id=1,
        ),
        _message(
            "initialized",
            'a notification: a RUN request answered {"ok": true}',
            b.message_payload(SESSION, {"jsonrpc": "2.0", "method": "notifications/initialized"}),
            stream=False,
            msg_id=2,
        ),
        _message("listen", "the session's listen stream", b.listen_payload(SESSION), stream=True, msg_id=3),
        _message(
            "tools-call",
            "a tool call with a progress token",
            b.message_payload(SESSION, call),
            stream=True,
            msg_id=4,
        ),
        _message(
            "part-progress",
            "a part of tools-call's stream: progress",
            {"message": progress},
            stream=True,
            sender=AGENT,
            to=CALLER,
            msg_id=1,
            msg_type=MessageType.REPLY,
            reply_to=4,
        ),
        _message(
            "part-sampling",
            "a part of tools-call's stream: the server's own request",
            {"message": sampling},
            stream=True,
            sender=AGENT,
            to=CALLER,
            msg_id=2,
            msg_type=MessageType.REPLY,
            reply_to=4,
        ),
        _message(
            "sampling-answer",
            'the answer to part-sampling: a RUN request answered {"ok": true}',
            b.message_payload(SESSION, sampled),
            stream=False,
            msg_id=5,
        ),
        _message(
            "part-result",
            "the last part of tools-call's stream: the response (END follows)",
            {"message": result},
            stream=True,
            sender=AGENT,
            to=CALLER,
            msg_id=3,
            msg_type=MessageType.REPLY,
            reply_to=4,
        ),
        _message(
            "ok",
            "what answers a notification or an answer",
            {"ok": True},
            stream=False,
            sender=AGENT,
            to=CALLER,
            msg_id=4,
            msg_type=MessageType.REPLY,
            reply_to=2,
        ),
        _message(
            "cancelled",
            "MCP's cancellation of request 8 (its stream is also closed: CANCEL)",
            b.message_payload(SESSION, cancelled),
            stream=False,
            msg_id=6,
        ),
        _message(
            "has-tool",
            'the discovery lookup; answered {"has_tool": true|false}',
            b.has_tool_payload(SESSION, "add"),
            stream=False,
            msg_id=7,
        ),
        _message("close", "the caller ends the session", b.close_payload(SESSION), stream=False, msg_id=8),
    ]
    refusal_cases = [
        ("not-an-object", ["mcp", "1"], "not_mcp"),
        ("other-version", {"mcp": "2", "session": SESSION, "message": call}, "bad_version"),
        ("short-session", {"mcp": "1", "session": "abc", "message": call}, "bad_session"),
        (
            "not-jsonrpc",
            {"mcp": "1", "session": SESSION, "message": {"id": 1, "method": "ping"}},
            "not_jsonrpc",
        ),
        (
            "bool-id",
            {"mcp": "1", "session": SESSION, "message": {"jsonrpc": "2.0", "id": True, "method": "ping"}},
            "not_jsonrpc",
        ),
        (
            "too-deep",
            {
                "mcp": "1",
                "session": SESSION,
                "message": {"jsonrpc": "2.0", "id": 1, "method": "x", "params": _nest(40)},
            },
            "too_deep",
        ),
    ]
    refusals = []
    for name, payload, reason in refusal_cases:
        try:
            b.parse_payload(payload)
        except b.McpBindingError as exc:
            assert exc.reason == reason, (name, exc.reason)
            refusals.append({"name": name, "payload": payload, "reason": reason, "code": exc.code})
        else:  # pragma: no cover - the generator checks itself
            raise AssertionError(f"{name} was not refused")
    refusals.append(
        {
            "name": "too-large",
            "payload_bytes": b.MAX_MESSAGE_BYTES + 1,
            "reason": "too_large",
            "code": b.INVALID_REQUEST,
        }
    )
    names = [
        "add",
        "Search_Documents",
        "a-tool-name-that-is-much-longer-than-sixty-four-characters-in-all-of-it",
    ]
    many = [f"tool_{i}" for i in range(100)]
    tools = {
        "digests": {n: b.tool_capability(n) for n in names},
        "buckets": {n: b.tool_bucket(n) for n in names},
        "few": {"names": names, "capabilities": b.tool_capabilities(names)},
        "many": {
            "names_count": len(many),
            "names": "tool_0 .. tool_99",
            "capabilities": b.tool_capabilities(many),
        },
    }
    return {
        "version": MCP_VECTORS_VERSION,
        "description": (
            "MCP over IAC: payload_json of the RUN messages a caller sends and of the REPLY parts an "
            "agent answers, each as a whole signed Message (signed_hex); payloads a receiver refuses "
            "with the JSON-RPC error code and counter reason; the registry capabilities that publish "
            "tools. See docs/PROTOCOL.md, 'Extension: MCP over IAC'."
        ),
        "capability": b.CAPABILITY,
        "time_us": TIME_US,
        "agents": {
            "caller": {"seed_hex": (bytes([0x77]) * 32).hex(), "agent_id": CALLER.agent_id},
            "agent": {"seed_hex": (bytes([0x88]) * 32).hex(), "agent_id": AGENT.agent_id},
        },
        "limits": {
            "max_message_bytes": b.MAX_MESSAGE_BYTES,
            "max_depth": b.MAX_DEPTH,
            "tool_buckets": b.TOOL_BUCKETS,
        },
        "error_codes": {
            "busy": b.BUSY,
            "tool_refused": b.TOOL_REFUSED,
            "sessions_full": b.SESSIONS_FULL,
            "unreachable": b.UNREACHABLE,
            "invalid_request": b.INVALID_REQUEST,
        },
        "vectors": vectors,
        "refusals": refusals,
        "tools": tools,
    }


def _nest(levels: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _ in range(levels):
        out = {"x": out}
    return out


def render_mcp_vectors() -> str:
    return render(mcp_vectors())


def write_mcp_vectors(path: Path) -> None:
    write(path, render_mcp_vectors())
