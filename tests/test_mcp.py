"""MCP over IAC with the stock SDK on both ends: an ``mcp`` ClientSession whose streams are an IAC
node's toward an agent, and an ``MCPServer`` answering on that agent's node (QUIC, TLS, UNIX):
tools, a resource, progress, cancel, an error result, sampling, the per-peer allow-list, a
replayed call, the server going away mid-call."""

from __future__ import annotations

import asyncio
import contextlib

import mcp_types as types
import pytest

pytest.importorskip("mcp")

from conftest import run
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_stdio_server import STATE, build

from iac import Node, NodeConfig
from iac.errors import PeerError
from iac.integrations import mcp as im
from iac.testing import UP, UnixTap, eventually, node_pair
from iac.wire.frames import FrameType, encode_frame


@contextlib.asynccontextmanager
async def session_over_iac(transport: str = "unix", *, allow=None, limits=None, session_kw=None, **client_kw):
    async with node_pair(transport, server_config=im.announce(NodeConfig())) as pair:
        server = im.serve(pair.server, build(), allow=allow, limits=limits)
        async with (
            im.connect(pair.client, pair.server.agent_id, **client_kw) as (read, write),
            ClientSession(read, write, **(session_kw or {})) as session,
        ):
            await session.initialize()
            yield pair, server, session


def text(result: types.CallToolResult) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.parametrize("transport", ["quic", "tls", "unix"])
def test_tools_and_a_resource_over_every_transport(transport):
    async def main():
        async with session_over_iac(transport) as (pair, server, session):
            listed = await session.list_tools()
            assert {"add", "whoami", "count", "fail", "ask"} <= {t.name for t in listed.tools}
            assert text(await session.call_tool("add", {"a": 2, "b": 40})) == "42"
            # the tool sees the AgentId that signed the call
            assert text(await session.call_tool("whoami", {})) == pair.client.agent_id
            read = await session.read_resource("res://greeting")
            assert read.contents[0].text == "hello from the resource"
            stats = server.stats()
            assert stats["tools"] == {"add": 1, "whoami": 1}
            assert stats["calls"]["tools/list"] == 1 and stats["calls"]["resources/read"] == 1
            assert stats["sessions"] == 1

    run(main())


@pytest.mark.filterwarnings("ignore:The sampling capability is deprecated")
def test_progress_an_error_result_and_a_sampling_request():
    async def main():
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(p, total, message):
            progress.append((p, total, message))

        async def sampling(context, params):
            asked = params.messages[0].content.text
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=f"42 ({asked})"), model="test"
            )

        async with session_over_iac(session_kw={"sampling_callback": sampling}) as (_, _, session):
            result = await session.call_tool("count", {"n": 5}, progress_callback=on_progress)
            assert text(result) == "counted 5"
            await eventually(lambda: len(progress) == 5, timeout=5)
            assert progress == [(float(i), 5.0, f"step {i}") for i in range(1, 6)]
            failed = await session.call_tool("fail", {"why": "on purpose"})
            assert failed.is_error and "failed: on purpose" in text(failed)
            # a server-initiated request reaches the client inside the call and its answer returns
            answer = await session.call_tool("ask", {"question": "meaning?"})
            assert text(answer) == "the model said: 42 (meaning?)"

    run(main())


def test_a_cancelled_call_stops_the_tool():
    async def main():
        async with session_over_iac() as (_, server, session):
            before = dict(STATE)
            call = asyncio.ensure_future(session.call_tool("block", {}))
            await eventually(lambda: STATE["blocked"] == before["blocked"] + 1, timeout=5)
            call.cancel()  # the SDK sends notifications/cancelled; the stream is closed too
            with contextlib.suppress(asyncio.CancelledError):
                await call
            await eventually(lambda: STATE["cancelled"] == before["cancelled"] + 1, timeout=5)
            await eventually(lambda: server.stats()["in_flight"] == 0, timeout=5)
            # the session goes on
            assert text(await session.call_tool("add", {"a": 1, "b": 1})) == "2"

    run(main())


def test_the_allow_list_refuses_a_tool_naming_it_and_the_caller():
    async def main():
        async with node_pair("unix", server_config=im.announce(NodeConfig())) as pair, Node() as other:
            other.add_peer(pair.server.agent_id, *pair.server.addresses)
            allow = {pair.client.agent_id: {"add", "whoami"}, "*": {"whoami"}}
            server = im.serve(pair.server, build(), allow=allow)
            for node, may_add in ((pair.client, True), (other, False)):
                async with (
                    im.connect(node, pair.server.agent_id) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    names = {t.name for t in (await session.list_tools()).tools}
                    assert names == ({"add", "whoami"} if may_add else {"whoami"})
                    if may_add:
                        assert text(await session.call_tool("add", {"a": 1, "b": 2})) == "3"
                        continue
                    with pytest.raises(MCPError) as refused:
                        await session.call_tool("add", {"a": 1, "b": 2})
                    assert refused.value.error.code == im.TOOL_REFUSED
                    assert "'add'" in str(refused.value) and node.agent_id in str(refused.value)
                    assert refused.value.error.data == {"tool": "add", "agent_id": node.agent_id}
            assert server.stats()["refused"] == {"tool_refused": 1}
            assert server.stats()["tools"] == {"add": 1}

    run(main())


def test_a_replayed_signed_call_is_refused():
    async def main():
        async with node_pair("unix", server_config=im.announce(NodeConfig())) as pair:
            server = im.serve(pair.server, build())
            async with Node() as caller, UnixTap(pair.server.addresses[0]) as tap:
                caller.add_peer(pair.server.agent_id, tap.url)
                async with (
                    im.connect(caller, pair.server.agent_id) as (read, write),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    assert text(await session.call_tool("add", {"a": 3, "b": 4})) == "7"
                    frames = [
                        f
                        for f in tap.tapped(UP, FrameType.MESSAGE)
                        if '"tools/call"' in f.message().payload_json
                    ]
                    assert len(frames) == 1
                    before = pair.server.stats().refused.get("duplicate", 0)
                    # the signed call again, byte for byte, on the caller's own connection
                    conn = caller.connection(pair.server.agent_id)
                    await conn.send(encode_frame(FrameType.MESSAGE, frames[0].frame.body))
                    await eventually(
                        lambda: pair.server.stats().refused.get("duplicate", 0) == before + 1,
                        timeout=5,
                    )
                    assert server.stats()["tools"] == {"add": 1}  # the tool ran once
                    assert text(await session.call_tool("add", {"a": 1, "b": 1})) == "2"

    run(main())


def test_the_server_going_away_mid_call_answers_a_jsonrpc_error():
    async def main():
        gone: list[BaseException] = []
        config = im.announce(NodeConfig(drain_timeout=0.2))  # the node does not wait for the tool
        async with node_pair("unix", server_config=config) as pair:
            im.serve(pair.server, build())
            async with (
                im.connect(pair.client, pair.server.agent_id, on_unreachable=gone.append) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                before = STATE["blocked"]
                call = asyncio.ensure_future(session.call_tool("block", {}))
                await eventually(lambda: STATE["blocked"] == before + 1, timeout=5)
                await pair.server.close()
                with pytest.raises(MCPError) as failed:
                    await asyncio.wait_for(call, 10)
                assert failed.value.error.code == im.UNREACHABLE
                assert "gone" in str(failed.value)
                assert len(gone) == 1

    run(main())


def test_a_node_without_the_capability_is_not_sent_mcp():
    async def main():
        async with node_pair("unix") as pair:
            with pytest.raises(PeerError) as exc_info:
                async with im.connect(pair.client, pair.server.agent_id):
                    pass
            assert exc_info.value.reason == "mcp_unsupported"
            with pytest.raises(Exception, match="announce"):
                im.serve(pair.server, build())

    run(main())


def test_malformed_and_oversized_messages_get_jsonrpc_errors_and_counters():
    async def main():
        limits = im.Limits(max_message_bytes=4096)
        async with node_pair("unix", server_config=im.announce(NodeConfig())) as pair:
            server = im.serve(pair.server, build(), limits=limits)
            to, sid = pair.server.agent_id, "s" * 16

            async def ask(payload):
                parts = [p.payload async for p in pair.client.stream(to, "RUN", payload, timeout=5)]
                return parts[-1]["message"]["error"]

            deep: dict = {}
            for _ in range(40):
                deep = {"x": deep}
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
            cases = [
                ({"mcp": "1", "session": sid, "message": {**call, "params": {"pad": "x" * 5000}}}, -32600),
                ({"mcp": "1", "session": sid, "message": {**call, "params": deep}}, -32600),
                ({"mcp": "1", "session": sid, "message": {"id": 1, "method": "x"}}, -32600),
                ({"mcp": "2", "session": sid, "message": call}, -32600),
                ({"mcp": "1", "session": "short", "message": call}, -32600),
            ]
            for payload, code in cases:
                assert (await ask(payload))["code"] == code
            assert server.stats()["refused"] == {
                "too_large": 1,
                "too_deep": 1,
                "not_jsonrpc": 1,
                "bad_version": 1,
                "bad_session": 1,
            }

    run(main())


def test_listen_streams_and_calls_fit_in_the_node_handlers():
    async def main():
        limits = im.Limits(listens_per_peer=1, listens_total=1)
        async with node_pair("unix", server_config=im.announce(NodeConfig())) as pair, Node() as other:
            with pytest.raises(Exception, match="max_handlers"):
                im.serve(pair.server, build(), limits=im.Limits(calls_total=60, listens_total=16))
            server = im.serve(pair.server, build(), limits=limits)
            other.add_peer(pair.server.agent_id, *pair.server.addresses)
            async with (
                im.connect(pair.client, pair.server.agent_id) as (r1, w1),
                ClientSession(r1, w1) as first,
            ):
                await first.initialize()
                await eventually(lambda: server.stats()["listening"] == 1, timeout=5)
                stats = im.ClientStats()
                async with (
                    im.connect(other, pair.server.agent_id, stats=stats) as (r2, w2),
                    ClientSession(r2, w2) as second,
                ):
                    await second.initialize()
                    await eventually(lambda: stats.failed.get("listen_refused") == 1, timeout=5)
                    assert server.stats()["refused"] == {"listens_full": 1}
                    # without a listen stream the session still calls tools
                    assert text(await second.call_tool("add", {"a": 5, "b": 5})) == "10"
            await eventually(lambda: server.stats()["listening"] == 0, timeout=5)

    run(main())


def test_a_run_handler_already_there_keeps_the_run_messages_that_are_not_mcp():
    async def main():
        async with node_pair("unix", server_config=im.announce(NodeConfig())) as pair:

            @pair.server.on("RUN")
            async def parts(ctx):  # an application's own streaming RUN handler (A2A's is one)
                for i in range(ctx.payload["n"]):
                    yield {"i": i}

            im.serve(pair.server, build())
            to = pair.server.agent_id
            got = [p.payload async for p in pair.client.stream(to, "RUN", {"n": 3}, timeout=5)]
            assert got == [{"i": 0}, {"i": 1}, {"i": 2}]
            async with im.connect(pair.client, to) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                assert text(await session.call_tool("add", {"a": 1, "b": 2})) == "3"

    run(main())


def test_a_principal_is_believed_only_from_a_trusted_gateway():
    async def main():
        async with node_pair("unix", server_config=im.announce(NodeConfig())) as pair, Node() as other:
            other.add_peer(pair.server.agent_id, *pair.server.addresses)
            server = im.serve(pair.server, build(), trusted_gateways=[pair.client.agent_id])
            to = pair.server.agent_id
            async with (
                im.connect(pair.client, to, principal="alice") as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                assert text(await session.call_tool("principal", {})) == "alice"
                assert text(await session.call_tool("whoami", {})) == pair.client.agent_id
            async with (
                im.connect(other, to, principal="alice") as (read, write),
                ClientSession(read, write) as s,
            ):
                with pytest.raises(MCPError) as refused:
                    await s.initialize()
                assert "unauthorized" in str(refused.value)
            assert server.stats()["refused"] == {"untrusted_principal": 1}

    run(main())
