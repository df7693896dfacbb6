"""A2A 0.3 clients through the gateway: the stock a2a-sdk client in its 0.3 mode (picked from the
card's 0.3 JSON-RPC interface), and a plain JSON-RPC call without an ``A2A-Version`` header (A2A
0.3 by the specification), both served by the IAC agent behind the gateway."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("a2a")

import httpx
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.types import GetTaskRequest, TaskState
from conftest import run
from test_a2a_gateway import gateway_in_front
from test_a2a_support import TOKEN, Worker, last_state, texts, user_message

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def test_the_stock_client_in_its_0_3_mode_through_the_gateway():
    async def main():
        worker = Worker()
        async with (
            gateway_in_front(worker) as (_agent, gw_node, gw, server),
            httpx.AsyncClient(headers=BEARER, timeout=10) as http,
        ):
            published = (await http.get(gw.url + ".well-known/agent-card.json")).json()
            # the card a 0.3 client reads: its url and version, beside the 1.0 interfaces
            assert (published["url"], published["protocolVersion"]) == (gw.url, "0.3")
            assert published["preferredTransport"] == "JSONRPC"
            card = parse_agent_card(published)
            legacy = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
            assert [(i.protocol_binding, i.url) for i in legacy] == [("JSONRPC", gw.url)]
            del card.supported_interfaces[:]
            card.supported_interfaces.extend(legacy)  # an agent as a 0.3-only client sees it
            client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
            assert isinstance(client._transport, CompatJsonRpcTransport)  # the SDK's 0.3 mode
            events = [e async for e in client.send_message(user_message("hello"))]
            assert texts(events) == ["hi alice"]  # served, as the principal the token names
            assert worker.users[-1].principal == "alice" and worker.users[-1].agent_id == gw_node.agent_id
            events = [e async for e in client.send_message(user_message("task 2"))]  # message/stream
            assert texts(events) == ["part 0", "part 1"]
            assert last_state(events) == TaskState.TASK_STATE_COMPLETED
            task_id = next(e.task.id for e in events if e.HasField("task"))
            got = await client.get_task(GetTaskRequest(id=task_id))
            assert got.id == task_id and got.status.state == TaskState.TASK_STATE_COMPLETED
            stats = gw.stats()
            assert stats["forwarded"]["SendStreamingMessage"] == 2 and stats["forwarded"]["GetTask"] == 1
            assert stats["refused"] == {}
            assert server.stats()["calls"]["SendStreamingMessage"] == 2  # forwarded as A2A 1.0

    run(main())


def test_a_call_without_a_version_header_is_a2a_0_3_and_served():
    async def main():
        worker = Worker()
        async with (
            gateway_in_front(worker) as (_agent, _, gw, server),
            httpx.AsyncClient(headers=BEARER, timeout=10) as http,
        ):

            async def post(method, params, rid=1):
                body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
                r = await http.post(
                    gw.url, content=json.dumps(body), headers={"content-type": "application/json"}
                )
                assert r.status_code == 200
                return r.json()

            message = {
                "kind": "message", "role": "user", "messageId": "m-v03-1",
                "parts": [{"kind": "text", "text": "hello"}],
            }  # fmt: skip
            answer = await post("message/send", {"message": message})
            assert "error" not in answer, answer
            assert answer["id"] == 1 and answer["result"]["kind"] == "message"
            assert [p["text"] for p in answer["result"]["parts"]] == ["hi alice"]
            again = await post("message/send", {"message": message}, rid=2)  # the same messageId
            assert again["id"] == 2 and again["result"] == answer["result"]
            assert gw.stats()["replayed"] == 1 and worker.executions == 1  # answered, not run again
            missing = await post("tasks/get", {"id": "no-such-task"})
            assert missing["error"]["code"] == -32001  # TaskNotFound, from the agent
            assert gw.stats()["answered_errors"] == {"TaskNotFoundError": 1}
            assert server.stats()["calls"]["SendMessage"] == 1
            # a 1.0 method without the header: told what to send, not that "0.3 is not supported"
            v1 = await post("GetTask", {"id": "t"})
            assert v1["error"]["code"] == -32009 and "'A2A-Version: 1.0'" in v1["error"]["message"]
            assert "not supported" not in v1["error"]["message"]
            call = {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"id": "t"}}
            r = await http.post(gw.url, json=call, headers={"A2A-Version": "1.0"})
            v03 = r.json()  # and a 0.3 method sent as 1.0: told to drop the header or use GetTask
            assert v03["id"] == 3 and v03["error"]["code"] == -32009
            assert "without the A2A-Version header" in v03["error"]["message"]
            assert gw.stats()["refused"] == {"VersionNotSupportedError": 2}

    run(main())
