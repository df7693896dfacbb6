"""The demo's messages as HTTP+JSON, to compare byte counts with IAC.

Each IAC message is written as a compact JSON object carried by an HTTP/1.1 POST, answered by
``200 OK`` with the REPLY as JSON (or ``204 No Content`` for a one-way message); a SHA-256 of the
payload and a password stands in for the signature (the idea of ``iac/bench/scenarios/codec.py``:
``envelope_http``). TLS, TCP/IP and the headers real clients add are not counted, so these are
lower bounds for HTTP.
"""

from __future__ import annotations

import base64
import hashlib
import random
import time
from typing import Any

from iac.wire._pb.iac_pb2 import Message, TaskState
from iac.wire.enums import Intent
from iac.wire.jsonutil import dumps_compact
from iac.wire.message import sender_of

HTTP_HOST = "agent.example.net:8443"
HTTP_PATH = "/iac/v1/messages"
HTTP_PASSWORD = "correct horse battery staple"  # noqa: S105 (the hash stand-in of iac/bench/scenarios/codec.py)


def task_json(task: TaskState) -> dict[str, Any]:
    """A task envelope as a JSON object (what an HTTP+JSON message would carry)."""
    return {"task_id": task.task_id, "intent": Intent(task.intent).name, "step": task.step,
            "steps": task.steps, "state_ref": task.state_ref}  # fmt: skip


def http_body(
    sender: str, to: str, type_name: str, payload_json: str, *, timestamp_us: int, msg_id: int,
    session_id: int, task: dict[str, Any] | None = None, reply_to: int = 0,
) -> bytes:  # fmt: skip
    """An IAC message as a compact JSON object: ``from``, ``to`` (64-hex AgentIds), ``type``, the
    ``payload`` embedded as a JSON value, the ``task`` envelope, ``timestamp``, ``msg_id``,
    ``session_id``, ``reply_to`` and ``hash`` = hex SHA-256 of payload+password (a stand-in for
    the signature, 64 characters where IAC has a 64-byte Ed25519 signature)."""
    payload = payload_json or "null"
    digest = hashlib.sha256((payload + HTTP_PASSWORD).encode()).hexdigest()
    head = f'{{"from":"{sender}","to":"{to}","type":"{type_name}","payload":'
    extra = f',"task":{dumps_compact(task, ensure_ascii=True)}' if task is not None else ""
    tail = f',"timestamp":{timestamp_us},"msg_id":{msg_id},"session_id":{session_id}'
    tail += f',"reply_to":{reply_to}' if reply_to else ""
    return (head + payload + extra + tail + f',"hash":"{digest}"}}').encode()


def http_post(body: bytes) -> bytes:
    """An HTTP/1.1 POST of a JSON body: request line, ``Host``, ``Content-Type``, ``Content-Length``.
    Not counted: TLS, TCP/IP and the headers real clients add, so this is a lower bound for HTTP."""
    head = (
        f"POST {HTTP_PATH} HTTP/1.1\r\nHost: {HTTP_HOST}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def http_response(body: bytes | None) -> bytes:
    """``200 OK`` with a JSON body, or ``204 No Content``."""
    if body is None:
        return b"HTTP/1.1 204 No Content\r\n\r\n"
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def http_exchange_bytes(
    sender: str,
    to: str,
    type_name: str,
    payload_json: str,
    reply: Message,
    *,
    task: dict[str, Any] | None = None,
) -> int:
    """A request and its REPLY as an HTTP POST and its ``200 OK`` (ids and times from the IAC reply)."""
    request = http_body(sender, to, type_name, payload_json, timestamp_us=reply.timestamp,
                        msg_id=reply.reply_to, session_id=reply.reply_session_id, task=task)  # fmt: skip
    answer = http_body(sender_of(reply), sender, "REPLY", reply.payload_json, timestamp_us=reply.timestamp,
                       msg_id=reply.msg_id, session_id=reply.session_id, reply_to=reply.reply_to)  # fmt: skip
    return len(http_post(request)) + len(http_response(answer))


def _example_ids() -> tuple[int, int, int]:
    r = random.SystemRandom()
    return time.time_ns() // 1000, r.randint(1, 1 << 20), r.getrandbits(64)


def http_oneway_bytes(sender: str, to: str, type_name: str, payload_json: str) -> int:
    """A one-way message as a POST and its ``204 No Content``."""
    ts, msg_id, session_id = _example_ids()
    body = http_body(
        sender, to, type_name, payload_json, timestamp_us=ts, msg_id=msg_id, session_id=session_id
    )
    return len(http_post(body)) + len(http_response(None))


def http_file_bytes(sender: str, to: str, name: str, data: bytes) -> int:
    """A file as one POST (JSON cannot hold bytes: base64 in ``data``) and a ``200 OK`` naming it."""
    ts, msg_id, session_id = _example_ids()
    digest = hashlib.sha256(data).hexdigest()
    meta = {"name": name, "size": len(data), "sha256": digest}
    payload = dumps_compact({**meta, "data": base64.b64encode(data).decode()}, ensure_ascii=True)
    body = http_body(
        sender, to, "FILE_TRANSFER", payload, timestamp_us=ts, msg_id=msg_id, session_id=session_id
    )
    answer = http_body(to, sender, "REPLY", dumps_compact({**meta, "status": "stored"}, ensure_ascii=True),
                       timestamp_us=ts, msg_id=1, session_id=session_id, reply_to=msg_id)  # fmt: skip
    return len(http_post(body)) + len(http_response(answer))


__all__ = [
    "HTTP_HOST",
    "HTTP_PASSWORD",
    "HTTP_PATH",
    "http_body",
    "http_exchange_bytes",
    "http_file_bytes",
    "http_oneway_bytes",
    "http_post",
    "http_response",
    "task_json",
]
