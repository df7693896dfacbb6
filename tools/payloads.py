"""The JSON payloads the node writes itself, their schemas, and their test vectors.

The node fills ``payload_json`` of COMMAND (a remote call), REPLY (the call's result), ERROR,
ACK and CANCEL, and the registry role answers REGISTER_KEY (docs/PROTOCOL.md, "Payload
schemas and their vectors" and section 10 "Registry messages"):

* COMMAND ``{"name": str, "args": [...], "kwargs": {...}}`` (``args``/``kwargs`` optional);
* REPLY: the handler's result as one JSON value (``null`` for None);
* ERROR ``{"code": <closed list>, "message": str}``;
* ACK and CANCEL: an empty ``payload_json``; both name the message they are about with
  ``reply_session_id`` / ``reply_to``.

:data:`SCHEMAS` holds these rules as data (the tables in docs/PROTOCOL.md are written from
it) and :func:`payload_problems` checks a ``payload_json`` against them. The vectors in
``proto/testvectors/payloads-v1.json`` are not built by hand: :func:`payload_test_vectors`
starts a real :class:`~iac.Node` on a UNIX socket with a frozen wall clock, drives it from a
hand-written peer, and records what the node wrote on the wire (``writer: "node"``) next to
the requests that made it write them (``writer: "peer"``, built with the library's own
builders: :func:`command_payload`, :func:`iac.mesh.service.publish_request` …).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iac.node.config import ERROR_CODES
from iac.wire.identity import is_agent_id

if TYPE_CHECKING:
    from iac.transport.base import Connection
    from iac.wire._pb.iac_pb2 import Message

PAYLOAD_VECTORS_VERSION = 1
#: The longest ERROR message the node writes (longer texts are cut).
MAX_ERROR_MESSAGE = 500
_MAX_SAFE_INT = 2**53 - 1

#: Payload kinds of :data:`SCHEMAS` and of the vectors.
KIND_COMMAND, KIND_REPLY, KIND_ERROR, KIND_ACK, KIND_CANCEL = "command", "reply", "error", "ack", "cancel"
KIND_REGISTRY_REQUEST, KIND_REGISTRY_REPLY = "registry_request", "registry_reply"
#: A request or one-way message of another type: its payload belongs to the application.
KIND_APP = "application"
KINDS = (
    KIND_COMMAND,
    KIND_REPLY,
    KIND_ERROR,
    KIND_ACK,
    KIND_CANCEL,
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
    if kind in (KIND_ACK, KIND_CANCEL):
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


# --- vectors: a real node, driven over a UNIX socket ------------------------------------------

#: Fixed inputs: the wall clock every message and record uses, seeds, session ids.
VECTOR_TIME_US = 1_735_689_600_000_000
_SEEDS = {"node": 0x44, "peer": 0x55, "successor": 0x66}
_NODE_SESSION = 0x0A0A0A0A0A0A0A  # below 2**53: JSON readers keep it exact
_PEER_SESSION = 0x0B0B0B0B0B0B0B
_DEADLINE_US = VECTOR_TIME_US + 30_000_000
_HOUR_US = 3_600_000_000


class _FrozenClock:
    """Wall-clock time stands still at ``now_us`` (so timestamps and records are fixed); the
    monotonic clock runs (timeouts)."""

    def __init__(self, now_us: int) -> None:
        self._now = now_us

    def now_us(self) -> int:
        return self._now

    def monotonic(self) -> float:
        return time.monotonic()


def _header(msg: Message) -> dict[str, Any]:
    from iac.wire._pb.iac_pb2 import MessageType

    return {
        "msg_type": MessageType.Name(msg.msg_type),
        "session_id": msg.session_id,
        "msg_id": msg.msg_id,
        "flags": msg.flags,
        "expects_reply": bool(msg.deadline),
        "reply_session_id": msg.reply_session_id,
        "reply_to": msg.reply_to,
    }


class _Recorder:
    def __init__(self) -> None:
        self.vectors: list[dict[str, Any]] = []
        self._names: dict[tuple[int, int], str] = {}

    def add(self, name: str, description: str, kind: str, writer: str, msg: Message) -> None:
        problems = payload_problems(kind, msg.payload_json)
        if problems and writer == "node":  # pragma: no cover - never write a wrong node vector
            raise AssertionError(f"vector {name}: {problems}")
        v: dict[str, Any] = {
            "name": name,
            "description": description,
            "kind": kind,
            "writer": writer,
            "header": _header(msg),
            "payload": json.loads(msg.payload_json) if msg.payload_json else None,
            "payload_json": msg.payload_json,
        }
        if problems:  # a deliberately wrong request: what a receiver must refuse it for
            v["problems"] = problems
        if msg.reply_to or msg.reply_session_id:
            v["about"] = self._names[(msg.reply_session_id, msg.reply_to)]
        self._names[(msg.session_id, msg.msg_id)] = name
        self.vectors.append(v)


class _RawPeer:
    """A hand-driven peer on one connection to the node: fixed session, every frame recorded."""

    def __init__(self, conn: Connection, identity: Any, node_id: str) -> None:
        from iac.wire.message import Session

        self.conn = conn
        self.identity = identity
        self.node_id = node_id
        self.session = Session(_PEER_SESSION, 1)
        self._held: list[Message] = []

    async def send(self, msg_type: int, payload_json: str = "", **kw: Any) -> Message:
        from iac.wire.message import build_message, encode_message_frame

        msg = build_message(
            sender=self.identity.agent_id,
            to=self.node_id,
            msg_type=msg_type,
            session=self.session,
            timestamp_us=VECTOR_TIME_US,
            payload_json=payload_json,
            **kw,
        )
        await self.conn.send(encode_message_frame(self.identity, msg))
        return msg

    async def request(self, msg_type: int, payload: Any = None, **kw: Any) -> tuple[Message, Message]:
        text = "" if payload is None else dumps_payload(payload)
        kw.setdefault("deadline_us", _DEADLINE_US)
        req = await self.send(msg_type, text, **kw)
        ans = await self.receive(lambda m: (m.reply_session_id, m.reply_to) == (req.session_id, req.msg_id))
        return req, ans

    async def receive(self, match: Callable[[Message], bool]) -> Message:
        for m in self._held:
            if match(m):
                self._held.remove(m)
                return m
        while True:
            inc = await asyncio.wait_for(self.conn.recv(), 10)
            if inc.message is None:  # pragma: no cover - the node sends nothing else here
                continue
            if match(inc.message):
                return inc.message
            self._held.append(inc.message)


@contextlib.contextmanager
def _quiet(*names: str) -> Any:
    """The handler that fails on purpose logs its traceback; keep the generator's output clean."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextlib.asynccontextmanager
async def _vector_node() -> AsyncIterator[tuple[Any, _RawPeer, dict[str, Any]]]:
    from iac.node.node import Node
    from iac.transport import dial
    from iac.transport.base import TransportConfig
    from iac.wire.identity import Identity
    from iac.wire.message import Session

    ids = {role: Identity.from_seed(bytes([b]) * 32) for role, b in _SEEDS.items()}
    clock = _FrozenClock(VECTOR_TIME_US)
    d = tempfile.mkdtemp(prefix="iacpv-")
    try:
        async with Node(ids["node"], listen=[f"unix://{d}/n.sock"], clock=clock) as node:
            conn = await dial(
                node.addresses[0], ids["peer"], expect=node.agent_id, config=TransportConfig(clock=clock)
            )
            try:
                # The node's session toward the peer, fixed so that the node's ids are too.
                node._sessions[(ids["peer"].agent_id, "main")] = Session(_NODE_SESSION, 1)
                yield node, _RawPeer(conn, ids["peer"], node.agent_id), ids
            finally:
                await conn.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


async def _generate() -> dict[str, Any]:
    from iac.mesh.service import (
        lookup_request,
        publish_request,
        revoke_request,
        rotate_request,
        serve_registry,
    )
    from iac.node.config import HandlerError
    from iac.protocol.records import AgentRecord, key_digest, sign_record, sign_revocation, sign_rotation
    from iac.wire._pb.iac_pb2 import MessageType
    from iac.wire.message import FLAG_ACK_REQUESTED

    rec = _Recorder()
    async with _vector_node() as (node, peer, ids):
        started = asyncio.Event()

        def add(a: int, b: int) -> int:
            return a + b

        def summarize(text: str, max_words: int = 3) -> dict[str, Any]:
            words = text.split()
            return {"summary": " ".join(words[:max_words]), "words": len(words)}

        def version() -> str:
            return "iac/1"

        def deny() -> None:
            raise HandlerError("unauthorized", "only the owner may call deny")

        def fail() -> None:
            raise RuntimeError("secret detail that is never sent")

        async def slow() -> None:
            started.set()
            await asyncio.sleep(30)

        for func in (add, summarize, version, deny, fail, slow):
            node.expose(func)
        node.on(MessageType.RUN)(lambda ctx: None)
        C, R = MessageType.COMMAND, MessageType.REGISTER_KEY

        async def call(
            name: str,
            desc: str,
            payload: Any,
            answer_kind: str,
            answer_desc: str,
            msg_type: int = C,
            **kw: Any,
        ) -> None:
            req, ans = await peer.request(msg_type, payload, **kw)
            req_kind = KIND_COMMAND if msg_type == C else KIND_REGISTRY_REQUEST if msg_type == R else KIND_APP
            rec.add(name, desc, req_kind, "peer", req)
            ans_kind = answer_kind
            rec.add(
                f"{name}/{'reply' if ans.msg_type == MessageType.REPLY else ans_kind}",
                answer_desc,
                ans_kind,
                "node",
                ans,
            )

        with _quiet("iac.node"):
            # --- remote calls: COMMAND → REPLY / ERROR
            await call(
                "call-add",
                "remote call add(2, 3)",
                command_payload("add", [2, 3]),
                KIND_REPLY,
                "the result, a bare JSON number",
            )
            await call(
                "call-kwargs",
                "keyword arguments and non-ASCII text",
                command_payload("summarize", ["Grüße aus Zürich, schöne Grüße"], {"max_words": 2}),
                KIND_REPLY,
                "an object result; UTF-8 is written unescaped",
            )
            await call(
                "call-name-only",
                "args and kwargs left out (both optional)",
                {"name": "version"},
                KIND_REPLY,
                "a string result",
            )
            await call(
                "call-not-exposed",
                "a name the node did not expose",
                command_payload("nope"),
                KIND_ERROR,
                "no_handler: nothing is looked up beyond the allow-list",
            )
            await call(
                "call-bad-arguments",
                "add(1): a missing argument",
                command_payload("add", [1]),
                KIND_ERROR,
                "bad_request, checked against the function's signature",
            )
            await call(
                "call-unknown-key",
                "a COMMAND with a key beside name, args, kwargs",
                {"name": "add", "args": [1, 2], "env": {}},
                KIND_ERROR,
                "bad_request from the schema check (pipeline refusal)",
            )
            await call(
                "call-handler-error",
                "the function raises HandlerError('unauthorized', ...)",
                command_payload("deny"),
                KIND_ERROR,
                "the code and text the handler chose",
            )
            await call(
                "call-internal",
                "the function raises RuntimeError",
                command_payload("fail"),
                KIND_ERROR,
                "internal; the exception's text is not sent",
            )
            await call(
                "call-timeout",
                "a call whose deadline is 50 ms away; the function sleeps",
                command_payload("slow"),
                KIND_ERROR,
                "timeout: the handler was cut off",
                deadline_us=VECTOR_TIME_US + 50_000,
            )
            await call(
                "request-no-handler",
                "a CREATE request, no handler registered",
                None,
                KIND_ERROR,
                "no_handler for a msg_type",
                msg_type=MessageType.CREATE,
            )

            # --- CANCEL from the caller: the running handler ends, answered with ERROR cancelled
            started.clear()
            req = await peer.send(C, dumps_payload(command_payload("slow")), deadline_us=_DEADLINE_US)
            await asyncio.wait_for(started.wait(), 10)
            cancel = await peer.send(MessageType.CANCEL, reply_to=req.msg_id, reply_session_id=req.session_id)
            ans = await peer.receive(
                lambda m: m.reply_to == req.msg_id and m.reply_session_id == _PEER_SESSION
            )
            rec.add("call-cancelled", "a call of a slow function", KIND_COMMAND, "peer", req)
            rec.add("call-cancelled/cancel", "the caller cancels it", KIND_CANCEL, "peer", cancel)
            rec.add(
                "call-cancelled/error",
                "cancelled, answering the COMMAND (not the CANCEL)",
                KIND_ERROR,
                "node",
                ans,
            )

            # --- ACK of a one-way ACK_REQUESTED message
            one_way = await peer.send(MessageType.RUN, dumps_payload({"job": 7}), flags=FLAG_ACK_REQUESTED)
            ack = await peer.receive(
                lambda m: m.reply_to == one_way.msg_id and m.reply_session_id == _PEER_SESSION
            )
            rec.add(
                "send-acked",
                "a one-way RUN with ACK_REQUESTED (its payload is the application's)",
                KIND_APP,
                "peer",
                one_way,
            )
            rec.add("send-acked/ack", "ACK once the handler finished: empty payload", KIND_ACK, "node", ack)

            # --- the node's own COMMAND and CANCEL (Node.invoke, then the caller gives up)
            task = asyncio.ensure_future(
                node.invoke(peer.identity.agent_id, "translate", ["Grüße"], {"to": "en"}, timeout=30)
            )
            cmd = await peer.receive(lambda m: m.msg_type == C)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            node_cancel = await peer.receive(lambda m: m.msg_type == MessageType.CANCEL)
            rec.add(
                "node-invoke",
                "Node.invoke(peer, 'translate', ['Grüße'], {'to': 'en'})",
                KIND_COMMAND,
                "node",
                cmd,
            )
            rec.add(
                "node-invoke/cancel",
                "the caller's task was cancelled: the node sends CANCEL",
                KIND_CANCEL,
                "node",
                node_cancel,
            )

            # --- REGISTER_KEY: not a registry, then the registry role
            peer_id, succ = ids["peer"], ids["successor"]
            await call(
                "registry-not-serving",
                "a status request to a node without the registry role",
                {"op": "status", "agent_id": peer_id.agent_id},
                KIND_ERROR,
                "no_handler: nothing handles REGISTER_KEY",
                msg_type=R,
            )
            serve_registry(node, "memory")
            record = AgentRecord(
                peer_id.agent_id,
                1,
                VECTOR_TIME_US + _HOUR_US,
                ("summarizer",),
                ("tls://192.0.2.10:4434",),
                ("summarize",),
                key_digest(succ.agent_id),
            )
            signed = sign_record(peer_id, record)
            rq = KIND_REGISTRY_REPLY
            await call(
                "registry-publish",
                "publish the peer's record (committed to its successor)",
                publish_request(signed),
                rq,
                "the stored seq and expiry",
                msg_type=R,
            )
            await call(
                "registry-lookup-alias",
                "lookup by alias",
                lookup_request(alias="summarizer"),
                rq,
                "one entry: the signed record as stored, no rotations",
                msg_type=R,
            )
            await call(
                "registry-lookup-capability",
                "lookup by capability with a limit",
                lookup_request(capability="summarize", limit=5),
                rq,
                "entries sorted by AgentId",
                msg_type=R,
            )
            await call(
                "registry-lookup-unknown",
                "lookup of an unregistered AgentId",
                lookup_request(agent_id=succ.agent_id),
                rq,
                "no entries",
                msg_type=R,
            )
            await call(
                "registry-status-active",
                "status of the peer",
                {"op": "status", "agent_id": peer_id.agent_id},
                rq,
                "active",
                msg_type=R,
            )
            await call(
                "registry-publish-stale",
                "the same seq published again",
                publish_request(signed),
                KIND_ERROR,
                "bad_request naming stale_seq",
                msg_type=R,
            )
            rot = sign_rotation(peer_id, succ, seq=2, issued_us=VECTOR_TIME_US)
            await call(
                "registry-rotate",
                "the peer rotates to its committed successor",
                rotate_request(rot),
                rq,
                "old and new AgentId",
                msg_type=R,
            )
            await call(
                "registry-lookup-rotated",
                "lookup of the successor",
                lookup_request(agent_id=succ.agent_id),
                rq,
                "the predecessor's record plus the rotation as proof",
                msg_type=R,
            )
            await call(
                "registry-status-rotating",
                "status of the old key",
                {"op": "status", "agent_id": peer_id.agent_id},
                rq,
                "rotating (in its grace period), with the successor",
                msg_type=R,
            )
            rev = sign_revocation(succ, seq=3, issued_us=VECTOR_TIME_US, reason="retired")
            await call(
                "registry-revoke",
                "the successor revokes itself (sent by the peer: any sender)",
                revoke_request(rev),
                rq,
                "the revoked AgentId and seq",
                msg_type=R,
            )
            await call(
                "registry-status-revoked",
                "status of the revoked key",
                {"op": "status", "agent_id": succ.agent_id},
                rq,
                "revoked",
                msg_type=R,
            )

    agents = {role: {"seed_hex": i.seed().hex(), "agent_id": i.agent_id} for role, i in ids.items()}
    return {
        "version": PAYLOAD_VECTORS_VERSION,
        "description": (
            "payload_json of COMMAND, REPLY, ERROR, ACK, CANCEL and REGISTER_KEY as an IAC node writes "
            "them (writer 'node', recorded from a real node) and the requests that made it write them "
            "(writer 'peer'). 'about' names the vector whose (session_id, msg_id) an answer or CANCEL "
            "carries in (reply_session_id, reply_to). See docs/PROTOCOL.md, 'Payload schemas and their "
            "vectors'."
        ),
        "time_us": VECTOR_TIME_US,
        "agents": agents,
        "vectors": rec.vectors,
    }


def payload_test_vectors() -> dict[str, Any]:
    """The content of ``proto/testvectors/payloads-v1.json`` (runs a node on a UNIX socket)."""
    return asyncio.run(asyncio.wait_for(_generate(), 60))


def render_payload_vectors() -> str:
    """:func:`payload_test_vectors` as the exact text of the committed file."""
    return json.dumps(payload_test_vectors(), indent=1, ensure_ascii=False) + "\n"


def write_payload_vectors(path: str | Path) -> None:
    """Rewrite the vector file (``python tools/make_payload_vectors.py``)."""
    Path(path).write_text(render_payload_vectors(), encoding="utf-8")


__all__ = [
    "KINDS",
    "SCHEMAS",
    "FieldSpec",
    "command_payload",
    "dumps_payload",
    "payload_problems",
    "payload_test_vectors",
    "render_payload_vectors",
    "schema_name",
    "schema_table",
    "write_payload_vectors",
]
