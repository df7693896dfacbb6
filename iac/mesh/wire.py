"""Registry messages on the wire (sans-IO): the ops, the request builders, lookup entries as
JSON, and refusals carried as ERRORs.

Every registry message is a REGISTER_KEY whose ``payload_json`` is one JSON object with an
``op`` (docs/PROTOCOL.md, "Registry messages")::

    {"op": "publish", "record": {"record": "<canonical>", "signature": "<hex>"}}
    {"op": "rotate", "rotation": {"rotation": "...", "old_signature": "...", "new_signature": "..."}}
    {"op": "revoke", "revocation": {"revocation": "...", "signature": "..."}}
    {"op": "lookup", "agent_id": "<hex>"} | {"op": "lookup", "alias": "a.b"}
                   | {"op": "lookup", "capability": "c", "limit": 10}
    {"op": "status", "agent_id": "<hex>"}

A refusal travels as an ERROR whose code is from the node's closed list and whose message
starts with the error's stable name (``"stale_seq: ..."``): :func:`handler_error` writes it,
:func:`raise_remote` raises the same error class again on the client.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, NoReturn

from iac.errors import (
    REASONS,
    ConfigError,
    ErrorCode,
    HandlerError,
    IacError,
    MessageRejected,
    RemoteError,
    RoutingError,
    StoreUnavailable,
)
from iac.protocol.records import (
    SignedRecord,
    SignedRevocation,
    SignedRotation,
    decode_record,
    decode_rotation,
    is_alias,
    is_capability,
)
from iac.protocol.registry import RegistryEntry
from iac.wire.identity import check_agent_id

OP_PUBLISH = "publish"
OP_ROTATE = "rotate"
OP_REVOKE = "revoke"
OP_LOOKUP = "lookup"
OP_STATUS = "status"
#: The registry's operations (the ``op`` of a request).
OPS = frozenset({OP_PUBLISH, OP_ROTATE, OP_REVOKE, OP_LOOKUP, OP_STATUS})


# --- errors over the wire ----------------------------------------------------------------------


#: The classes a registry refusal is rebuilt as on the asking side (built from one message).
_REMOTE_CLASSES: tuple[type[IacError], ...] = (MessageRejected, RoutingError, StoreUnavailable)


def handler_error(exc: IacError) -> HandlerError:
    """A registry refusal as the ERROR the node answers: closed-list code, ``"name: text"``."""
    if isinstance(exc, StoreUnavailable) or exc.reason == "registry_quota":
        code = ErrorCode.BUSY
    elif isinstance(exc, MessageRejected | ConfigError):
        code = ErrorCode.BAD_REQUEST
    else:
        code = ErrorCode.INTERNAL
    return HandlerError(code, f"{exc.reason}: {exc}")


def raise_remote(exc: RemoteError) -> NoReturn:
    """Raise the typed error a registry named in an ERROR (``"stale_seq: ..."``), else ``exc``."""
    name, sep, text = exc.message.partition(": ")
    row = REASONS.get(name) if sep else None
    if row is None or row.cls not in _REMOTE_CLASSES:
        raise exc
    raise row.cls(text, reason=name) from exc


# --- payloads ----------------------------------------------------------------------------------


def publish_request(signed: SignedRecord) -> dict[str, Any]:
    """The registry request that publishes a signed record."""
    return {"op": OP_PUBLISH, "record": signed.to_json_obj()}


def rotate_request(signed: SignedRotation) -> dict[str, Any]:
    """The registry request that announces a key rotation."""
    return {"op": OP_ROTATE, "rotation": signed.to_json_obj()}


def revoke_request(signed: SignedRevocation) -> dict[str, Any]:
    """The registry request that revokes a key."""
    return {"op": OP_REVOKE, "revocation": signed.to_json_obj()}


def lookup_request(
    *, agent_id: str | None = None, alias: str | None = None, capability: str | None = None,
    limit: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """A lookup by exactly one of ``agent_id``, ``alias``, ``capability`` (with an optional ``limit``)."""
    given = [(k, v) for k, v in (("agent_id", agent_id), ("alias", alias), ("capability", capability)) if v]
    if len(given) != 1:
        raise ConfigError("a lookup names exactly one of agent_id, alias, capability")
    key, value = given[0]
    if key == "agent_id":
        check_agent_id(value)
    elif key == "alias" and not is_alias(value):
        raise ConfigError(f"not an alias (lowercase DNS-like name): {value!r:.80}")
    elif key == "capability" and not is_capability(value):
        raise ConfigError(f"not a capability ([a-z0-9._:/-], 1-64 chars): {value!r:.80}")
    obj: dict[str, Any] = {"op": OP_LOOKUP, key: value}
    if limit is not None:
        if key != "capability" or type(limit) is not int or limit < 1:
            raise ConfigError("limit is a positive integer, for capability lookups only")
        obj["limit"] = limit
    return obj


def payload_field(payload: dict[str, Any], key: str) -> Any:
    """``payload[key]``, or ``bad_record`` naming the op that lacks it."""
    if key not in payload:
        raise MessageRejected(f"{payload.get('op')} needs {key!r}", reason="bad_record")
    return payload[key]


def entry_to_json(entry: RegistryEntry) -> dict[str, Any]:
    """A lookup result on the wire: the signed record, the rotations from it, the aliases held."""
    return {
        "aliases": list(entry.record.aliases),
        "record": entry.signed.to_json_obj(),
        "rotations": [r.to_json_obj() for r in entry.rotations],
    }


def entry_from_json(obj: object) -> RegistryEntry:
    """Rebuild a :class:`RegistryEntry` (not yet verified: call :func:`~iac.verify_entry`)."""
    if not isinstance(obj, dict) or set(obj) != {"aliases", "record", "rotations"}:
        raise MessageRejected("an entry is {aliases, record, rotations}", reason="bad_record")
    aliases, rotations_obj = obj["aliases"], obj["rotations"]
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise MessageRejected("entry aliases must be an array of strings", reason="bad_record")
    if not isinstance(rotations_obj, list) or len(rotations_obj) > 64:
        raise MessageRejected("entry rotations must be an array (at most 64)", reason="bad_record")
    signed = SignedRecord.from_json_obj(obj["record"])
    rotations = tuple(SignedRotation.from_json_obj(r) for r in rotations_obj)
    base = decode_record(signed.data)
    try:
        if rotations:
            last = decode_rotation(rotations[-1].data)
            record = replace(
                base, agent_id=last.new_agent_id, seq=last.seq, next_key_digest=None, aliases=tuple(aliases)
            )
        else:
            record = replace(base, aliases=tuple(aliases))
    except ConfigError as exc:
        raise MessageRejected(str(exc), reason="bad_record") from None
    return RegistryEntry(record, signed, rotations)


__all__ = [
    "OPS",
    "OP_LOOKUP",
    "OP_PUBLISH",
    "OP_REVOKE",
    "OP_ROTATE",
    "OP_STATUS",
    "entry_from_json",
    "entry_to_json",
    "handler_error",
    "lookup_request",
    "payload_field",
    "publish_request",
    "raise_remote",
    "revoke_request",
    "rotate_request",
]
