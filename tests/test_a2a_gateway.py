"""The A2A gateway with real components: the stock a2a-sdk JSON-RPC client (over HTTP, with its
AuthInterceptor reading the scheme the gateway's card declares) against the gateway in front of an
IAC agent; streaming (SSE) and cancel; bad input answered at the gateway, never reaching the agent;
the bridge the other way; and a three-hop delegation where one hop is A2A."""

from __future__ import annotations

import contextlib
import json

import pytest

pytest.importorskip("a2a")

import httpx
from a2a.client import (
    AuthInterceptor,
    ClientCallContext,
    ClientConfig,
    ClientFactory,
    InMemoryContextCredentialStore,
)
from a2a.types import CancelTaskRequest, GetTaskRequest, SubscribeToTaskRequest, TaskState
from a2a.utils.errors import A2AError, TaskNotFoundError
from conftest import run
from test_a2a_support import (
    OTHER_TOKEN,
    TOKEN,
    Worker,
    card,
    handler,
    http_agent,
    last_state,
    texts,
    user_message,
)

from iac import Intent, MessageType, Node
from iac import TaskState as IacTask
from iac.integrations import a2a as ia
from iac.testing import eventually

HEADERS = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}


@contextlib.asynccontextmanager
async def gateway_in_front(worker: Worker, *, auth: ia.GatewayAuth | None = None, trusted: bool = True, **kw):
    agent_card = card()
    async with Node(listen=["quic://127.0.0.1:0"]) as agent, Node() as gw_node:
        server = ia.serve(
            agent, handler(worker, agent_card), agent_card,
            trusted_gateways=[gw_node.agent_id] if trusted else [],
        )  # fmt: skip
        auth = auth or ia.GatewayAuth.bearer({TOKEN: "alice", OTHER_TOKEN: "bob"})
        async with ia.A2AGateway(gw_node, agent.agent_id, addresses=agent.addresses, auth=auth, **kw) as gw:
            yield agent, gw_node, gw, server


async def stock_client(http: httpx.AsyncClient, url: str, token: str = TOKEN):
    store = InMemoryContextCredentialStore()
    await store.set_credentials("s", "iacGateway", token)
    factory = ClientFactory(ClientConfig(httpx_client=http))
    client = await factory.create_from_url(url, interceptors=[AuthInterceptor(store)])
    return client, ClientCallContext(state={"sessionId": "s"})


def test_the_stock_jsonrpc_client_through_the_gateway():
    async def main():
        worker = Worker()
        async with gateway_in_front(worker) as (_agent, gw_node, gw, server), httpx.AsyncClient() as http:
            published = (await http.get(gw.url + ".well-known/agent-card.json")).json()
            assert published["supportedInterfaces"][0] == {
                "url": gw.url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0",
            }  # fmt: skip
            assert published["supportedInterfaces"][1]["protocolBinding"] == "IAC"  # IAC clients go direct
            assert "iacGateway" in published["securitySchemes"]
            client, ctx = await stock_client(http, gw.url)
            events = [e async for e in client.send_message(user_message("hello"), context=ctx)]
            assert texts(events) == ["hi alice"]  # the executor runs as the principal
            user = worker.users[-1]
            assert (user.agent_id, user.principal) == (gw_node.agent_id, "alice")  # signer and principal
            events = [e async for e in client.send_message(user_message("task 4"), context=ctx)]  # SSE
            assert texts(events) == [f"part {i}" for i in range(4)]
            assert last_state(events) == TaskState.TASK_STATE_COMPLETED
            task_id = next(e.task.id for e in events if e.HasField("task"))
            assert (await client.get_task(GetTaskRequest(id=task_id), context=ctx)).id == task_id
            # bob's tasks are not alice's: a2a-sdk scopes tasks by the user, here the principal
            bob, bob_ctx = await stock_client(http, gw.url, OTHER_TOKEN)
            with pytest.raises(TaskNotFoundError):
                await bob.get_task(GetTaskRequest(id=task_id), context=bob_ctx)
            stats = gw.stats()
            assert stats["forwarded"]["SendStreamingMessage"] == 2 and stats["answered_errors"] == {
                "TaskNotFoundError": 1
            }
            assert server.stats()["calls"]["SendStreamingMessage"] == 2

    run(main())


def test_stream_and_cancel_through_the_gateway():
    async def main():
        worker = Worker()
        async with gateway_in_front(worker) as (agent, _, gw, _server), httpx.AsyncClient(timeout=10) as http:
            client, ctx = await stock_client(http, gw.url)
            stream = client.send_message(user_message("slow"), context=ctx)
            first = await anext(stream)
            task_id = first.task.id
            await stream.aclose()  # the HTTP client leaves: the gateway's IAC stream is cancelled
            await eventually(lambda: agent.stats().running == 0, timeout=5)
            sub = client.subscribe(SubscribeToTaskRequest(id=task_id), context=ctx)
            seen = [await anext(sub)]
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id), context=ctx)
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            seen += [e async for e in sub]
            assert last_state(seen) == TaskState.TASK_STATE_CANCELED and worker.cancelled == [task_id]

    run(main(), loop_errors=False)


def test_bad_input_is_answered_at_the_gateway_and_counted():
    async def main():
        worker = Worker()
        async with (
            gateway_in_front(worker, max_body=4096) as (_agent, _, gw, server),
            httpx.AsyncClient() as http,
        ):

            async def post(body, headers=HEADERS):
                r = await http.post(
                    gw.url, content=body, headers={**headers, "content-type": "application/json"}
                )
                return r.status_code, (r.json()["error"]["code"] if r.content else None)

            def call(method, params, **extra):
                return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params, **extra})

            assert await post(b"{not json") == (200, -32700)
            assert await post(b"[]") == (200, -32600)
            assert await post(json.dumps({"jsonrpc": "1.0", "id": 1, "method": "GetTask"})) == (200, -32600)
            assert await post(call("tasks/explode", {})) == (200, -32601)
            assert await post(call("GetTask", {"id": {"x": 1}})) == (200, -32602)
            version_missing = {"Authorization": HEADERS["Authorization"]}
            assert await post(call("GetTask", {"id": "t"}), version_missing) == (200, -32009)
            assert await post(call("GetTask", {"id": "t"}), {}) == (401, -32600)
            wrong = {"Authorization": "Bearer wrong-token-000000"}
            assert await post(call("GetTask", {"id": "t"}), wrong) == (401, -32600)
            assert await post(b"x" * 5000) == (413, -32600)  # declared too large

            async def chunks():
                for _ in range(10):
                    yield b" " * 1000

            r = await http.post(gw.url, content=chunks(), headers=HEADERS)  # chunked, over the bound
            assert r.json()["error"]["code"] == -32600
            assert await post(call("GetTask", {"id": "no-such-task"})) == (200, -32001)  # forwarded
            stats = gw.stats()
            assert stats["refused"] == {
                "JSONParseError": 1, "InvalidRequestError": 2, "MethodNotFoundError": 1,
                "InvalidParamsError": 1, "VersionNotSupportedError": 1, "unauthenticated": 2, "too_large": 2,
            }  # fmt: skip
            assert stats["forwarded"] == {"GetTask": 1} and stats["answered_errors"] == {
                "TaskNotFoundError": 1
            }
            assert stats["requests"] == 11
            assert worker.executions == 0 and server.stats()["calls"] == {"GetAgentCard": 1, "GetTask": 1}

    run(main())


def test_an_api_key_gateway_and_a_gateway_the_agent_does_not_trust():
    async def main():
        worker = Worker()
        auth = ia.GatewayAuth.api_key({TOKEN: "alice"}, header="X-Key")
        async with gateway_in_front(worker, auth=auth, trusted=False) as (_, _gw_node, gw, server):
            async with httpx.AsyncClient() as http:
                published = (await http.get(gw.url + ".well-known/agent-card.json")).json()
                assert published["securitySchemes"]["iacGateway"]["apiKeySecurityScheme"]["name"] == "X-Key"
                client, ctx = await stock_client(http, gw.url)
                with pytest.raises(A2AError, match="unauthorized"):
                    [e async for e in client.send_message(user_message("hello"), context=ctx)]
            assert server.stats()["refused"] == {"untrusted_principal": 1} and worker.executions == 0

    run(main())


def test_the_bridge_lets_iac_peers_call_an_http_agent():
    async def main():
        worker = Worker()
        async with (
            http_agent(worker) as (url, _),
            Node(listen=["tls://127.0.0.1:0"]) as bridge_node,
            Node() as me,
        ):
            bridge = await ia.serve_remote(bridge_node, url)
            got = await ia.fetch_card(me, bridge_node.agent_id, *bridge_node.addresses)
            assert ia.parse_interface_url(got.supported_interfaces[0].url).agent_id == bridge_node.agent_id
            client = ia.client(me, got)
            events = [e async for e in client.send_message(user_message("task 3"))]
            assert texts(events) == ["part 0", "part 1", "part 2"]
            stream = client.send_message(user_message("slow"))
            task_id = (await anext(stream)).task.id
            await stream.aclose()
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            assert bridge.server.stats()["calls"]["SendStreamingMessage"] == 2
            await bridge.close()

    run(main(), loop_errors=False)


def test_three_hops_one_of_them_a2a():
    """HTTP A2A client -> gateway -> (A2A over IAC) -> planner agent, whose executor delegates a
    step (IAC DELEGATE_TASK) to a writer node -> back along the same path."""

    async def main():
        async with Node(listen=["tls://127.0.0.1:0"]) as writer:

            @writer.on(MessageType.DELEGATE_TASK)
            def write(ctx):
                return {"draft": ctx.payload["topic"].upper(), "for": ctx.sender}

            async def delegate(context):
                node = planner_node[0]
                task = IacTask(
                    task_id="t-1", intent=Intent.ASSIGN_TASK, step=1, steps=1, state_ref="kv://t-1"
                )
                reply = await node.delegate(writer.agent_id, task, {"topic": "q3 report"}, timeout=5)
                who = context.call_context.user.user_name
                return f"{reply.payload['draft']} for {who}"

            planner_node: list[Node] = []
            worker = Worker(on_call=delegate)
            async with gateway_in_front(worker) as (agent, _, gw, _server), httpx.AsyncClient() as http:
                planner_node.append(agent)
                agent.add_peer(writer.agent_id, *writer.addresses)
                client, ctx = await stock_client(http, gw.url)
                events = [e async for e in client.send_message(user_message("call"), context=ctx)]
                assert texts(events) == ["Q3 REPORT for alice"]

    run(main())
