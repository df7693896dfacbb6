"""The JSON payloads the node writes itself, and their schemas.

The node fills ``payload_json`` of COMMAND (a remote call), REPLY (the call's result), ERROR,
ACK and CANCEL, and the registry role answers REGISTER_KEY (docs/PROTOCOL.md, "Payload
schemas and their vectors" and section 10 "Registry messages"):

* COMMAND ``{"name": str, "args": [...], "kwargs": {...}}`` (``args``/``kwargs`` optional);
* REPLY: the handler's result as one JSON value (``null`` for None);
* ERROR ``{"code": <closed list>, "message": str}``;
* ACK and CANCEL: an empty ``payload_json``; both name the message they are about with
  ``reply_session_id`` / ``reply_to``.

:data:`SCHEMAS` holds these rules as data (the tables in docs/PROTOCOL.md are written from
it) and :func:`payload_problems` checks a ``payload_json`` against them. The vectors that
exercise them are recorded from a real node by :mod:`tools.vectors.payloads`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from iac.errors import ERROR_CODES
from iac.wire.identity import is_agent_id

#: The longest ERROR message the node writes (longer texts are cut).
MAX_ERROR_MESSAGE = 500
_MAX_SAFE_INT = 2**53 - 1

#: Payload kinds of :data:`SCHEMAS` and of the vectors.
KIND_COMMAND, KIND_REPLY, KIND_ERROR, KIND_ACK, KIND_CANCEL = "command", "reply", "error", "ack", "cancel"
#: A stream's flow control (CREDIT) and the last part of a stream (END): both with an empty payload.
KIND_CREDIT, KIND_END = "credit", "end"
KIND_REGISTRY_REQUEST, KIND_REGISTRY_REPLY = "registry_request", "registry_reply"
#: A request or one-way message of another type: its payload belongs to the application.
KIND_APP = "application"
KINDS = (
    KIND_COMMAND,
    KIND_REPLY,
    KIND_ERROR,
    KIND_ACK,
    KIND_CANCEL,
    KIND_CREDIT,
    KIND_END,
    KIND_REGISTRY_REQUEST,
    KIND_REGISTRY_REPLY,
    KIND_APP,
)
_REGISTRY_OPS = ("publish", "rotate", "revoke", "lookup", "status")
_KEY_STATUSES = ("unknown", "active", "expired", "rotating", "rotated", "revoked")


# --- builders -----------------------------------------------------------------------------------


def command_payload(
    name: str, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The COMMAND payload of a remote call, as :meth:`iac.Node.invoke` writes it."""
    return {"name": name, "args": list(args), "kwargs": dict(kwargs or {})}


def dumps_payload(value: Any) -> str:
    """``payload_json`` as the node writes it: compact separators, UTF-8 left unescaped."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- schemas ------------------------------------------------------------------------------------

Check = Callable[[Any], "str | None"]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One key of a payload object: its JSON type, whether it is required, the rule it obeys."""

    name: str
    type: str
    required: bool
    rule: str
    check: Check


def _string(v: Any) -> str | None:
    return None if isinstance(v, str) else "must be a string"


def _nonempty_string(v: Any) -> str | None:
    return None if isinstance(v, str) and v else "must be a non-empty string"


def _integer(v: Any) -> str | None:
    ok = type(v) is int and 0 <= v <= _MAX_SAFE_INT
    return None if ok else "must be an integer in [0, 2**53 - 1]"


def _positive(v: Any) -> str | None:
    return None if type(v) is int and 1 <= v <= _MAX_SAFE_INT else "must be a positive integer"


def _array(v: Any) -> str | None:
    return None if isinstance(v, list) else "must be an array"


def _object(v: Any) -> str | None:
    return None if isinstance(v, dict) else "must be an object"


def _agent_id(v: Any) -> str | None:
    return None if isinstance(v, str) and is_agent_id(v) else "must be an AgentId (64 lowercase hex)"


def _agent_id_or_empty(v: Any) -> str | None:
    return None if v == "" else _agent_id(v)


def _error_code(v: Any) -> str | None:
    return None if isinstance(v, str) and v in ERROR_CODES else f"must be one of {sorted(ERROR_CODES)}"


def _error_message(v: Any) -> str | None:
    ok = isinstance(v, str) and len(v) <= MAX_ERROR_MESSAGE
    return None if ok else f"must be a string of at most {MAX_ERROR_MESSAGE} characters"


def _op(value: str) -> Check:
    return lambda v: None if v == value else f"must be {value!r}"


def _status(v: Any) -> str | None:
    return None if v in _KEY_STATUSES else f"must be one of {list(_KEY_STATUSES)}"


def _envelope(kind: str) -> Check:
    def check(v: Any) -> str | None:
        from iac.errors import IacError
        from iac.protocol.records import SignedRecord, SignedRevocation, SignedRotation

        try:
            if kind == "record":
                SignedRecord.from_json_obj(v)
            elif kind == "rotation":
                SignedRotation.from_json_obj(v)
            else:
                SignedRevocation.from_json_obj(v)
        except IacError as exc:
            return f"is not a {kind} envelope: {exc}"
        return None

    return check


def _entries(v: Any) -> str | None:
    from iac.errors import IacError
    from iac.mesh.service import entry_from_json

    if not isinstance(v, list):
        return "must be an array of entries"
    for i, e in enumerate(v):
        try:
            entry_from_json(e)
        except IacError as exc:
            return f"entry {i} is not {{aliases, record, rotations}}: {exc}"
    return None


def _f(name: str, type_: str, required: bool, rule: str, check: Check) -> FieldSpec:
    return FieldSpec(name, type_, required, rule, check)


_OP = "op"
_ID = "AgentId (64 lowercase hex)"
#: Object payloads by schema name. ``reply`` (any JSON value) and ``ack``/``cancel`` (empty
#: ``payload_json``) have no fields and are checked by :func:`payload_problems` directly.
SCHEMAS: dict[str, tuple[FieldSpec, ...]] = {
    "command": (
        _f(
            "name",
            "string",
            True,
            "looked up only on the callee's allow-list (`expose`), else ERROR `no_handler`",
            _string,
        ),
        _f("args", "array", False, "positional arguments (default `[]`)", _array),
        _f("kwargs", "object", False, "keyword arguments (default `{}`)", _object),
    ),
    "error": (
        _f("code", "string", True, "one of the closed list (section 8)", _error_code),
        _f(
            "message",
            "string",
            True,
            f"human-readable, at most {MAX_ERROR_MESSAGE} characters; a "
            "registry refusal starts with the error's stable name (`stale_seq: …`)",
            _error_message,
        ),
    ),
    "registry_request.publish": (
        _f(_OP, "string", True, '`"publish"`', _op("publish")),
        _f(
            "record",
            "object",
            True,
            "record envelope (section 10); `from` = the record's agent_id",
            _envelope("record"),
        ),
    ),
    "registry_request.rotate": (
        _f(_OP, "string", True, '`"rotate"`', _op("rotate")),
        _f("rotation", "object", True, "rotation envelope (section 10)", _envelope("rotation")),
    ),
    "registry_request.revoke": (
        _f(_OP, "string", True, '`"revoke"`', _op("revoke")),
        _f("revocation", "object", True, "revocation envelope (section 10)", _envelope("revocation")),
    ),
    "registry_request.lookup": (
        _f(_OP, "string", True, '`"lookup"`', _op("lookup")),
        _f("agent_id", "string", False, f"{_ID}; exactly one of agent_id, alias, capability", _agent_id),
        _f("alias", "string", False, "an alias", _nonempty_string),
        _f("capability", "string", False, "a capability", _nonempty_string),
        _f("limit", "integer", False, "≥ 1, with `capability` only", _positive),
    ),
    "registry_request.status": (
        _f(_OP, "string", True, '`"status"`', _op("status")),
        _f("agent_id", "string", True, _ID, _agent_id),
    ),
    "registry_reply.publish": (
        _f(_OP, "string", True, '`"publish"`', _op("publish")),
        _f("agent_id", "string", True, _ID, _agent_id),
        _f("seq", "integer", True, "the stored record's seq", _integer),
        _f("expires_us", "integer", True, "the stored record's expiry", _integer),
    ),
    "registry_reply.rotate": (
        _f(_OP, "string", True, '`"rotate"`', _op("rotate")),
        _f("old_agent_id", "string", True, _ID, _agent_id),
        _f("new_agent_id", "string", True, _ID, _agent_id),
        _f("seq", "integer", True, "the statement's seq", _integer),
    ),
    "registry_reply.revoke": (
        _f(_OP, "string", True, '`"revoke"`', _op("revoke")),
        _f("agent_id", "string", True, _ID, _agent_id),
        _f("seq", "integer", True, "the statement's seq", _integer),
    ),
    "registry_reply.lookup": (
        _f(_OP, "string", True, '`"lookup"`', _op("lookup")),
        _f("entries", "array", True, "ENTRY objects `{aliases, record, rotations}` (section 10)", _entries),
    ),
    "registry_reply.status": (
        _f(_OP, "string", True, '`"status"`', _op("status")),
        _f("agent_id", "string", True, _ID, _agent_id),
        _f("status", "string", True, " \\| ".join(_KEY_STATUSES), _status),
        _f("seq", "integer", True, "highest seq seen for the key (0 when unknown)", _integer),
        _f("successor", "string", True, f'{_ID}, or `""` when not rotated', _agent_id_or_empty),
    ),
}


def schema_name(kind: str, payload: Any = None) -> str | None:
    """The :data:`SCHEMAS` key for a payload of ``kind`` (registry kinds pick it by ``op``)."""
    if kind in (KIND_COMMAND, KIND_ERROR):
        return kind
    if kind in (KIND_REGISTRY_REQUEST, KIND_REGISTRY_REPLY) and isinstance(payload, dict):
        op = payload.get("op")
        return f"{kind}.{op}" if op in _REGISTRY_OPS else None
    return None


def _object_problems(schema: tuple[FieldSpec, ...], payload: Any) -> list[str]:
    if not isinstance(payload, dict):
        return ["the payload must be a JSON object"]
    fields = {f.name: f for f in schema}
    out = [f"unknown key {k!r}" for k in payload if k not in fields]
    for f in schema:
        if f.name not in payload:
            if f.required:
                out.append(f"missing key {f.name!r}")
            continue
        reason = f.check(payload[f.name])
        if reason:
            out.append(f"{f.name} {reason}")
    return out


def payload_problems(kind: str, payload_json: str) -> list[str]:
    """What is wrong with ``payload_json`` as a payload of ``kind`` (empty when it conforms)."""
    if kind not in KINDS:
        return [f"unknown payload kind {kind!r}"]
    if kind in (KIND_ACK, KIND_CANCEL, KIND_CREDIT, KIND_END):
        return [] if payload_json == "" else [f"{kind.upper()} carries an empty payload_json"]
    if kind == KIND_APP and not payload_json:
        return []
    if not payload_json:
        return ["payload_json is empty"]
    try:
        payload = json.loads(payload_json)
    except ValueError as exc:
        return [f"payload_json is not JSON: {exc}"]
    if kind in (KIND_REPLY, KIND_APP):
        return []
    name = schema_name(kind, payload)
    if name is None:
        return [f"op must be one of {list(_REGISTRY_OPS)}"]
    out = _object_problems(SCHEMAS[name], payload)
    if name == "registry_request.lookup":
        given = [k for k in ("agent_id", "alias", "capability") if k in payload]
        if len(given) != 1:
            out.append("a lookup names exactly one of agent_id, alias, capability")
        if "limit" in payload and given != ["capability"]:
            out.append("limit goes with a capability lookup only")
    return out


def schema_table(name: str) -> str:
    """The Markdown table of one schema (field, type, required, rule), as docs/PROTOCOL.md has it."""
    rows = ["| field | type | required | rule |", "|---|---|---|---|"]
    for f in SCHEMAS[name]:
        rows.append(f"| `{f.name}` | {f.type} | {'yes' if f.required else 'no'} | {f.rule} |")
    return "\n".join(rows)


__all__ = [
    "KINDS",
    "KIND_ACK",
    "KIND_APP",
    "KIND_CANCEL",
    "KIND_COMMAND",
    "KIND_CREDIT",
    "KIND_END",
    "KIND_ERROR",
    "KIND_REGISTRY_REPLY",
    "KIND_REGISTRY_REQUEST",
    "KIND_REPLY",
    "SCHEMAS",
    "FieldSpec",
    "command_payload",
    "dumps_payload",
    "payload_problems",
    "schema_name",
    "schema_table",
]
