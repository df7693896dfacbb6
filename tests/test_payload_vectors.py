"""proto/testvectors/payloads-v1.json: the payloads the node writes (COMMAND, REPLY, ERROR, ACK,
CANCEL, REGISTER_KEY), their schemas (tools.vectors.payload_schemas.SCHEMAS), and two real nodes
writing them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import run

from iac.errors import ERROR_CODES, ErrorCode, RemoteError
from iac.mesh.service import MeshClient, serve_registry
from iac.node.node import Node
from iac.protocol.records import key_digest
from iac.testing import DOWN, UP, UnixTap, eventually
from iac.wire._pb.iac_pb2 import Message, MessageType
from iac.wire.identity import Identity
from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_STREAM
from tools.vectors.payload_schemas import (
    KIND_ACK,
    KIND_CANCEL,
    KIND_COMMAND,
    KIND_ERROR,
    KIND_REGISTRY_REPLY,
    KIND_REGISTRY_REQUEST,
    KIND_REPLY,
    KINDS,
    SCHEMAS,
    command_payload,
    dumps_payload,
    payload_problems,
    schema_name,
    schema_table,
)
from tools.vectors.payloads import render_payload_vectors

ROOT = Path(__file__).resolve().parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "payloads-v1.json"
DATA: dict[str, Any] = json.loads(VECTOR_FILE.read_text("utf-8"))
VECTORS: list[dict[str, Any]] = DATA["vectors"]
BY_NAME = {v["name"]: v for v in VECTORS}
ANSWER_TYPES = {"REPLY", "ERROR", "ACK"}


def test_vector_file_is_up_to_date() -> None:
    assert VECTOR_FILE.read_text("utf-8") == render_payload_vectors(), (
        "proto/testvectors/payloads-v1.json is stale; rewrite it with `python -m tools.make_payload_vectors`"
    )


def test_vector_file_layout() -> None:
    assert DATA["version"] == 1
    assert set(DATA) == {"version", "description", "time_us", "agents", "vectors"}
    for role, agent in DATA["agents"].items():
        assert Identity.from_seed(bytes.fromhex(agent["seed_hex"])).agent_id == agent["agent_id"], role
    assert len(BY_NAME) == len(VECTORS), "vector names are unique"
    header_keys = {
        "msg_type",
        "session_id",
        "msg_id",
        "flags",
        "expects_reply",
        "reply_session_id",
        "reply_to",
    }
    for v in VECTORS:
        assert {"name", "description", "kind", "writer", "header", "payload", "payload_json"} <= set(v)
        assert set(v) <= {"name", "description", "kind", "writer", "header", "payload", "payload_json",
                          "about", "problems"}  # fmt: skip
        assert v["kind"] in KINDS and v["writer"] in ("node", "peer")
        assert header_keys <= set(v["header"]) <= header_keys | {"stream_seq", "credit"}
        for key in ("session_id", "msg_id", "reply_session_id", "reply_to"):
            assert 0 <= v["header"][key] < 2**53, "ids stay exact for any JSON reader"
    # every kind the brief names is covered, and the node wrote each one itself
    node_kinds = {v["kind"] for v in VECTORS if v["writer"] == "node"}
    assert {KIND_COMMAND, KIND_REPLY, KIND_ERROR, KIND_ACK, KIND_CANCEL, KIND_REGISTRY_REPLY} <= node_kinds
    ops = {v["payload"]["op"] for v in VECTORS if v["kind"] == KIND_REGISTRY_REQUEST}
    assert ops == {"publish", "rotate", "revoke", "lookup", "status"}
    codes = {v["payload"]["code"] for v in VECTORS if v["kind"] == KIND_ERROR}
    assert codes >= {"no_handler", "bad_request", "unauthorized", "internal", "timeout", "cancelled"}


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_vector_matches_its_schema(v: dict[str, Any]) -> None:
    text = v["payload_json"]
    assert (json.loads(text) if text else None) == v["payload"]
    assert payload_problems(v["kind"], text) == v.get("problems", [])
    if v["writer"] == "node":
        assert "problems" not in v
        if text:  # the node's serialization: compact, UTF-8 unescaped
            assert text == dumps_payload(v["payload"])
    h = v["header"]
    if v["kind"] == KIND_COMMAND:
        assert h["msg_type"] == "COMMAND" and h["expects_reply"]
    if v["kind"] in (KIND_ACK, KIND_CANCEL):
        assert text == "" and v["payload"] is None
        assert h["msg_type"] == v["kind"].upper() and not h["expects_reply"]
    if v["kind"] == KIND_ERROR:
        assert h["msg_type"] == "ERROR" and v["payload"]["code"] in ERROR_CODES
    if v["kind"] in (KIND_REPLY, KIND_REGISTRY_REPLY) and v["writer"] == "node":
        assert h["msg_type"] == "REPLY"


@pytest.mark.parametrize("v", [v for v in VECTORS if "about" in v], ids=lambda v: v["name"])
def test_answers_and_cancels_name_their_request(v: dict[str, Any]) -> None:
    req = BY_NAME[v["about"]]
    h, rh = v["header"], req["header"]
    assert (h["reply_session_id"], h["reply_to"]) == (rh["session_id"], rh["msg_id"])
    assert h["msg_type"] in ANSWER_TYPES | {"CANCEL", "CREDIT"} and not h["expects_reply"]
    if rh["flags"] & FLAG_STREAM and h["msg_type"] in ("REPLY", "ERROR"):  # a part, the END or the ERROR
        assert h["flags"] & FLAG_STREAM and h["stream_seq"] >= 1
        granted = max([rh["credit"]] + [c["header"]["credit"] for c in VECTORS if c.get("about") == v["about"]
                                        and c["header"]["msg_type"] == "CREDIT"])  # fmt: skip
        assert h["stream_seq"] <= granted + 1  # never beyond the credit (+1: the END or ERROR)
    else:
        assert h["flags"] == 0
    if h["msg_type"] == "ACK":
        assert rh["flags"] & FLAG_ACK_REQUESTED and not rh["expects_reply"]
    elif h["msg_type"] in ("REPLY", "ERROR"):
        assert rh["expects_reply"]
    else:  # CANCEL or CREDIT: from the caller, on the caller's own session
        assert h["session_id"] == rh["session_id"] and rh["expects_reply"]
        assert h["msg_type"] == "CANCEL" or h["credit"] > rh["credit"]
    if req["kind"] == KIND_REGISTRY_REQUEST and h["msg_type"] == "REPLY":
        assert v["kind"] == KIND_REGISTRY_REPLY and v["payload"]["op"] == req["payload"]["op"]


def test_requests_without_about_are_requests() -> None:
    for v in VECTORS:
        if "about" not in v:
            assert v["header"]["msg_type"] not in ANSWER_TYPES | {"CANCEL"}, v["name"]
            assert (v["header"]["reply_session_id"], v["header"]["reply_to"]) == (0, 0)


def test_schema_checker_refuses() -> None:
    ok = dumps_payload(command_payload("f", [1], {"x": 2}))
    assert payload_problems(KIND_COMMAND, ok) == []
    assert payload_problems(KIND_COMMAND, '{"name":"f"}') == []
    assert payload_problems(KIND_COMMAND, '{"args":[]}') == ["missing key 'name'"]
    assert payload_problems(KIND_COMMAND, '{"name":"f","args":{}}') == ["args must be an array"]
    assert payload_problems(KIND_COMMAND, '{"name":"f","kwargs":[]}') == ["kwargs must be an object"]
    assert payload_problems(KIND_COMMAND, "[1]") == ["the payload must be a JSON object"]
    assert payload_problems(KIND_COMMAND, "") == ["payload_json is empty"]
    assert payload_problems(KIND_COMMAND, "{") != []
    assert payload_problems(KIND_ERROR, '{"code":"no_handler","message":"x"}') == []
    assert payload_problems(KIND_ERROR, '{"code":"nope","message":"x"}')[0].startswith("code must be one of")
    assert payload_problems(KIND_ERROR, dumps_payload({"code": "busy", "message": "x" * 501})) != []
    assert payload_problems(KIND_ERROR, '{"code":"busy"}') == ["missing key 'message'"]
    assert payload_problems(KIND_ACK, "") == [] and payload_problems(KIND_ACK, "{}") != []
    assert payload_problems(KIND_CANCEL, "null") != []
    assert payload_problems(KIND_REPLY, "null") == [] and payload_problems(KIND_REPLY, "") != []
    aid = Identity.from_seed(b"\xab" * 32).agent_id
    assert payload_problems(KIND_REGISTRY_REQUEST, '{"op":"dance"}') != []
    look = payload_problems(
        KIND_REGISTRY_REQUEST, dumps_payload({"op": "lookup", "agent_id": aid, "alias": "a"})
    )
    assert look == ["a lookup names exactly one of agent_id, alias, capability"]
    limit = payload_problems(KIND_REGISTRY_REQUEST, dumps_payload({"op": "lookup", "alias": "a", "limit": 2}))
    assert limit == ["limit goes with a capability lookup only"]
    bad_env = dumps_payload({"op": "publish", "record": {"record": "{}", "signature": "00"}})
    assert payload_problems(KIND_REGISTRY_REQUEST, bad_env)[0].startswith("record is not a record envelope")
    status = {"op": "status", "agent_id": aid, "status": "active", "seq": 1, "successor": ""}
    assert payload_problems(KIND_REGISTRY_REPLY, dumps_payload(status)) == []
    small_order = status | {"agent_id": "01" + "00" * 31}  # 64 hex characters, the identity point
    assert payload_problems(KIND_REGISTRY_REPLY, dumps_payload(small_order)) != []
    assert payload_problems(KIND_REGISTRY_REPLY, dumps_payload(status | {"status": "gone"})) != []
    assert payload_problems(KIND_REGISTRY_REPLY, dumps_payload(status | {"seq": 2**53})) != []
    assert payload_problems(KIND_REGISTRY_REPLY, dumps_payload(status | {"seq": True})) != []
    assert payload_problems("nothing", "") == ["unknown payload kind 'nothing'"]


def test_schemas_cover_every_error_code_and_op() -> None:
    for kind in (KIND_REGISTRY_REQUEST, KIND_REGISTRY_REPLY):
        for op in ("publish", "rotate", "revoke", "lookup", "status"):
            assert schema_name(kind, {"op": op}) in SCHEMAS
    for code in ErrorCode:
        assert payload_problems(KIND_ERROR, dumps_payload({"code": code.value, "message": ""})) == []
    for name in SCHEMAS:
        table = schema_table(name)
        assert all(f"`{f.name}`" in table for f in SCHEMAS[name])


def test_protocol_doc_has_the_schema_tables() -> None:
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text("utf-8")
    assert "Payload schemas and their vectors" in doc, "docs/PROTOCOL.md lost its payload schema section"
    for name in ("command", "error"):
        assert schema_table(name) in doc, f"the {name} table in docs/PROTOCOL.md differs from SCHEMAS"
    assert "payloads-v1.json" in doc


# --- two real nodes write exactly these shapes -------------------------------------------------


@contextlib.asynccontextmanager
async def _two_nodes() -> AsyncIterator[tuple[Node, Node, UnixTap]]:
    """A client and a server whose only path is a wiretap: ``tap.messages(UP)`` are the messages
    the client put in MESSAGE frames, ``tap.messages(DOWN)`` the server's, as they crossed."""
    d = tempfile.mkdtemp(prefix="iacpt-")
    try:
        async with (
            Node(listen=[f"unix://{d}/s.sock"]) as server,
            Node() as client,
            UnixTap(server.addresses[0]) as tap,
        ):
            client.add_peer(server.agent_id, tap.url)
            yield client, server, tap
            assert tap.errors == [] and tap.connections == 1
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _answer(sent: list[Message], req: Message) -> Message:
    found = [m for m in sent if (m.reply_session_id, m.reply_to) == (req.session_id, req.msg_id)]
    assert len(found) == 1, f"one answer to msg {req.msg_id}"
    return found[0]


def _last(sent: list[Message], msg_type: int) -> Message:
    return [m for m in sent if m.msg_type == msg_type][-1]


def _same_shape(msg: Message, vector: dict[str, Any]) -> None:
    """Same msg_type, same kind of payload (the schema), same keys; answers reply like the vector."""
    assert MessageType.Name(msg.msg_type) == vector["header"]["msg_type"], vector["name"]
    assert payload_problems(vector["kind"], msg.payload_json) == [], vector["name"]
    payload = json.loads(msg.payload_json) if msg.payload_json else None
    if isinstance(vector["payload"], dict):
        assert isinstance(payload, dict) and set(payload) == set(vector["payload"]), vector["name"]
    assert bool(msg.deadline) == vector["header"]["expects_reply"]
    assert msg.flags == vector["header"]["flags"]


def test_two_real_nodes_write_the_vectors() -> None:
    async def main() -> None:
        async with _two_nodes() as (client, server, tap):
            started = asyncio.Event()

            def c_sent() -> list[Message]:
                return tap.messages(UP)

            def s_sent() -> list[Message]:
                return tap.messages(DOWN)

            def add(a: int, b: int) -> int:
                return a + b

            def summarize(text: str, max_words: int = 3) -> dict[str, Any]:
                words = text.split()
                return {"summary": " ".join(words[:max_words]), "words": len(words)}

            async def slow() -> None:
                started.set()
                await asyncio.sleep(30)

            for f in (add, summarize, slow):
                server.expose(f)
            server.on(MessageType.RUN)(lambda ctx: None)

            # COMMAND → REPLY: byte-identical payloads (the same call as the vector)
            assert await client.call(server.agent_id, "add", 2, 3) == 5
            cmd = _last(c_sent(), MessageType.COMMAND)
            for name, msg in (("call-add", cmd), ("call-add/reply", _answer(s_sent(), cmd))):
                _same_shape(msg, BY_NAME[name])
                assert msg.payload_json == BY_NAME[name]["payload_json"]
            text = "Grüße aus Zürich, schöne Grüße"
            await client.invoke(server.agent_id, "summarize", [text], {"max_words": 2})
            cmd = _last(c_sent(), MessageType.COMMAND)
            for name, msg in (("call-kwargs", cmd), ("call-kwargs/reply", _answer(s_sent(), cmd))):
                assert msg.payload_json == BY_NAME[name]["payload_json"]

            # ERROR no_handler: exactly the vector's payload
            with pytest.raises(RemoteError):
                await client.call(server.agent_id, "nope")
            cmd = _last(c_sent(), MessageType.COMMAND)
            err = _answer(s_sent(), cmd)
            assert cmd.payload_json == BY_NAME["call-not-exposed"]["payload_json"]
            assert err.payload_json == BY_NAME["call-not-exposed/error"]["payload_json"]

            # ACK of a one-way ACK_REQUESTED message: empty, names the message
            sent = await client.send(server.agent_id, MessageType.RUN, {"job": 7}, ack=True)
            await asyncio.wait_for(sent.wait(), 5)
            one_way = _last(c_sent(), MessageType.RUN)
            _same_shape(one_way, BY_NAME["send-acked"])
            _same_shape(_answer(s_sent(), one_way), BY_NAME["send-acked/ack"])

            # CANCEL from the caller (its task is cancelled), ERROR cancelled from the callee
            started.clear()
            task = asyncio.ensure_future(client.call(server.agent_id, "slow"))
            await asyncio.wait_for(started.wait(), 5)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            cmd = _last(c_sent(), MessageType.COMMAND)
            await eventually(
                lambda: any(m.msg_type == MessageType.ERROR and m.reply_to == cmd.msg_id for m in s_sent())
            )
            cancel = _last(c_sent(), MessageType.CANCEL)
            _same_shape(cancel, BY_NAME["node-invoke/cancel"])
            assert (cancel.reply_session_id, cancel.reply_to) == (cmd.session_id, cmd.msg_id)
            assert cancel.session_id == cmd.session_id
            err = _answer(s_sent(), cmd)
            assert err.payload_json == BY_NAME["call-cancelled/error"]["payload_json"]

            # REGISTER_KEY: the client's requests and the registry's replies, op by op
            serve_registry(server, "memory")
            successor = Identity.generate()
            digest = key_digest(successor.agent_id)
            mesh = MeshClient(client, server.agent_id, server.addresses, aliases=["summarizer"],
                              capabilities=["summarize"], next_key_digest=digest)  # fmt: skip
            async with mesh:
                await mesh.lookup(alias="summarizer")
                await mesh.lookup(capability="summarize", limit=5)
                await mesh.status(client.agent_id)
                await mesh.rotate(successor, notify_peers=False)
                await mesh.lookup(agent_id=successor.agent_id)
                await mesh.revoke("retired")
                await mesh.status(client.agent_id)
            requests = [m for m in c_sent() if m.msg_type == MessageType.REGISTER_KEY]
            by_op = {
                "publish": "registry-publish",
                "lookup": "registry-lookup-alias",
                "status": "registry-status-active",
                "rotate": "registry-rotate",
                "revoke": "registry-revoke",
            }
            seen = set()
            for req in requests:
                op = json.loads(req.payload_json)["op"]
                seen.add(op)
                vec = BY_NAME[by_op[op]]
                if op == "lookup":  # the vector with the same lookup key
                    key = (set(json.loads(req.payload_json)) - {"op", "limit"}).pop()
                    vec = next(
                        v
                        for v in VECTORS
                        if v["kind"] == KIND_REGISTRY_REQUEST
                        and v["payload"]["op"] == "lookup"
                        and key in v["payload"]
                    )
                _same_shape(req, vec)
                reply = _answer(s_sent(), req)
                _same_shape(reply, BY_NAME[vec["name"] + "/reply"])
                assert json.loads(reply.payload_json)["op"] == op
            assert seen == set(by_op)

    run(main())
