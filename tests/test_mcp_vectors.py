"""proto/testvectors/mcp.json (MCP over IAC payloads, signed messages, refusals, tool capabilities)
and tool discovery through a real registry: a server with few tools publishes exact digests, one
with more tools than a record holds publishes buckets that a finder confirms with ``has_tool``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from conftest import run
from mcp.server.mcpserver import MCPServer

from iac import Node, NodeConfig
from iac.integrations import mcp as im
from iac.integrations.mcp import binding as b
from iac.mesh.service import MeshClient, serve_registry
from iac.protocol.records import is_capability
from iac.wire.message import FLAG_STREAM, open_message
from tools.vectors.mcp import render_mcp_vectors

ROOT = Path(__file__).resolve().parent.parent
VECTOR_FILE = ROOT / "proto" / "testvectors" / "mcp.json"
DATA = json.loads(VECTOR_FILE.read_text("utf-8"))


def test_vector_file_is_up_to_date():
    assert VECTOR_FILE.read_text("utf-8") == render_mcp_vectors(), (
        "proto/testvectors/mcp.json is stale; rewrite it with `python -m tools.make_mcp_vectors`"
    )


def test_every_vector_is_a_signed_message_with_the_payload_it_names():
    agents = {k: v["agent_id"] for k, v in DATA["agents"].items()}
    assert DATA["capability"] == im.CAPABILITY == "mcp/1"
    for v in DATA["vectors"]:
        msg = open_message(bytes.fromhex(v["signed_hex"]))  # checks the signature
        assert getattr(msg, "from") == agents[v["writer"]]
        assert msg.payload_json == v["payload_json"] and json.loads(msg.payload_json) == v["payload"]
        assert bool(msg.flags & FLAG_STREAM) == v["stream"], v["name"]
        if v["msg_type"] == "RUN":
            assert msg.deadline > 0  # a request: it expects an answer
            assert b.parse_payload(v["payload"]).kind == v["kind"]
        elif "message" in v["payload"]:  # a part of a call's stream: one JSON-RPC message
            assert msg.reply_to == 4 and msg.stream_seq >= 1
            assert b.message_kind(v["payload"]["message"]) in ("request", "notification", "response")
        else:
            assert v["payload"] == {"ok": True}


def test_refusals_are_reproduced_with_their_code_and_reason():
    for case in DATA["refusals"]:
        with pytest.raises(b.McpBindingError) as refused:
            if "payload_bytes" in case:
                b.parse_payload({}, case["payload_bytes"])
            else:
                b.parse_payload(case["payload"])
        assert (refused.value.reason, refused.value.code) == (case["reason"], case["code"]), case["name"]


def test_tool_capabilities_fit_a_record():
    tools = DATA["tools"]
    for name, cap in tools["digests"].items():
        assert b.tool_capability(name) == cap and is_capability(cap) and len(cap) <= 64
    for name, cap in tools["buckets"].items():
        assert b.tool_bucket(name) == cap and is_capability(cap)
    assert b.tool_capabilities(tools["few"]["names"]) == tools["few"]["capabilities"]
    many = b.tool_capabilities(f"tool_{i}" for i in range(100))
    assert many == tools["many"]["capabilities"] and len(many) <= 64
    assert all(is_capability(c) for c in many)


def _server(names: list[str]) -> MCPServer:
    mcp = MCPServer("many")
    for name in names:
        mcp.add_tool(lambda: "ok", name=name, description=name)
    return mcp


def test_an_agent_is_found_by_tool_name_through_the_registry():
    few = ["Search_Documents", "x" * 100]
    many = [f"tool_{i}" for i in range(100)]

    async def main():
        config = im.announce(NodeConfig())
        async with (
            Node(listen=["tls://127.0.0.1:0"]) as registry,
            Node(listen=["tls://127.0.0.1:0"], config=config) as small,
            Node(listen=["tls://127.0.0.1:0"], config=config) as big,
            Node() as finder,
        ):
            serve_registry(registry)
            reg = (registry.agent_id, registry.addresses)
            servers = {
                small.agent_id: im.serve(small, _server(few)),
                big.agent_id: im.serve(big, _server(many)),
            }
            for node in (small, big):
                async with MeshClient(node, *reg, capabilities=["own"]) as mesh:
                    record = await im.publish_tools(mesh, await servers[node.agent_id].tool_names())
                    assert "own" in record.capabilities and "mcp/1" in record.capabilities
                    assert len(record.capabilities) <= 64
            async with MeshClient(finder, *reg, publish=False) as mesh:
                assert await im.find_tool(mesh, "x" * 100) == [small.agent_id]  # an exact digest
                assert await im.find_tool(mesh, "tool_42") == [big.agent_id]  # a bucket, confirmed
                assert await im.find_tool(mesh, "no_such_tool") == []
                assert await mesh.find("mcp/1") == sorted([small.agent_id, big.agent_id])

    run(main())
