"""A2A over IAC with real components: a stock a2a-sdk client whose transport is IAC (QUIC, TLS,
UNIX) against a stock a2a-sdk server (DefaultRequestHandler around an unchanged AgentExecutor)
on an IAC node; streaming, cancel, every transport method, and the checks of the binding."""

from __future__ import annotations

import asyncio
import contextlib
import inspect

import pytest

pytest.importorskip("a2a")

from a2a.client import ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.client.transports.base import ClientTransport
from a2a.types import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import PushNotificationNotSupportedError, TaskNotFoundError, UnsupportedOperationError
from conftest import listen_url, run
from google.protobuf.json_format import MessageToDict
from test_a2a_support import Worker, card, handler, last_state, texts, user_message

from iac import Node
from iac.integrations import a2a as ia
from iac.testing import eventually


@contextlib.asynccontextmanager
async def agent_and_caller(transport: str, sockdir, worker: Worker, **card_kw):
    agent_card = card(**card_kw)
    async with Node(listen=[listen_url(transport, sockdir, "agent")]) as agent, Node() as caller:
        server = ia.serve(agent, handler(worker, agent_card), agent_card)
        yield agent, caller, server


@pytest.mark.parametrize("transport", ["quic", "tls", "unix"])
def test_a_stock_client_over_iac_reaches_a_stock_server(transport, sockdir):
    async def main():
        worker = Worker()
        async with agent_and_caller(transport, sockdir, worker) as (agent, caller, server):
            got = await ia.fetch_card(caller, agent.agent_id, *agent.addresses)
            assert ia.parse_interface_url(got.supported_interfaces[0].url).agent_id == agent.agent_id
            client = ia.client(caller, got)
            # streaming (the card declares it): a message naming the caller's AgentId
            events = [e async for e in client.send_message(user_message("hello"))]
            assert texts(events) == [f"hi {caller.agent_id}"]
            user = worker.users[-1]
            assert isinstance(user, ia.IacUser) and user.agent_id == caller.agent_id and not user.principal
            assert worker.states[-1]["iac_agent_id"] == caller.agent_id
            # a task streamed part by part
            events = [e async for e in client.send_message(user_message("task 5"))]
            assert texts(events) == [f"part {i}" for i in range(5)]
            assert last_state(events) == TaskState.TASK_STATE_COMPLETED
            task_id = next(e.task.id for e in events if e.HasField("task"))
            # unary methods
            task = await client.get_task(GetTaskRequest(id=task_id))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED and len(task.artifacts) == 5
            listed = await client.list_tasks(ListTasksRequest())
            assert [t.id for t in listed.tasks] == [task_id]
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="no-such-task"))
            assert (await client.get_extended_agent_card(GetExtendedAgentCardRequest())).name == "worker"
            await client.close()
            assert server.stats()["errors"] == {"TaskNotFoundError": 1}
            assert worker.executions == 2  # an unknown task id never reached the executor

    run(main())


def test_unary_send_when_streaming_is_off_and_what_the_card_does_not_declare(sockdir):
    async def main():
        worker = Worker()
        async with agent_and_caller("tls", sockdir, worker, streaming=False) as (agent, caller, _):
            got = await ia.fetch_card(caller, agent.agent_id, *agent.addresses)
            client = ia.client(caller, got)
            events = [e async for e in client.send_message(user_message("task 2"))]
            assert len(events) == 1 and events[0].task.status.state == TaskState.TASK_STATE_COMPLETED
            transport = ia.IacTransport(caller, got, got.supported_interfaces[0].url)
            with pytest.raises(UnsupportedOperationError):
                [e async for e in transport.send_message_streaming(user_message("hello"))]
            with pytest.raises(UnsupportedOperationError):
                [e async for e in transport.subscribe(SubscribeToTaskRequest(id="x"))]
            config = TaskPushNotificationConfig(task_id="x", url="https://example.org/hook")
            for call in (
                transport.create_task_push_notification_config(config),
                transport.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id="x")
                ),
                transport.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id="x")
                ),
                transport.delete_task_push_notification_config(
                    DeleteTaskPushNotificationConfigRequest(task_id="x", id="c")
                ),
            ):
                with pytest.raises(PushNotificationNotSupportedError):
                    await call

    run(main())


def test_push_notification_configs_travel_when_declared(sockdir):
    async def main():
        worker = Worker()
        async with agent_and_caller("unix", sockdir, worker, push=True) as (agent, caller, _):
            got = await ia.fetch_card(caller, agent.agent_id, *agent.addresses)
            client = ia.client(
                caller, got, config=ClientConfig(streaming=False, supported_protocol_bindings=["IAC"])
            )
            events = [e async for e in client.send_message(user_message("task 1"))]
            task_id = events[0].task.id
            config = TaskPushNotificationConfig(task_id=task_id, id="c1", url="https://example.org/hook")
            made = await client.create_task_push_notification_config(config)
            assert made.url == "https://example.org/hook"
            got_cfg = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="c1")
            )
            assert got_cfg.id == "c1"
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            assert [c.id for c in listed.configs] == ["c1"]
            await client.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="c1")
            )
            listed = await client.list_task_push_notification_configs(
                ListTaskPushNotificationConfigsRequest(task_id=task_id)
            )
            assert not listed.configs

    run(main())


@pytest.mark.parametrize("transport", ["quic", "unix"])
def test_cancel_a_running_task_and_close_a_stream_early(transport, sockdir):
    async def main():
        worker = Worker()
        async with agent_and_caller(transport, sockdir, worker) as (agent, caller, server):
            got = await ia.fetch_card(caller, agent.agent_id, *agent.addresses)
            client = ia.client(caller, got)
            # leave a stream early: the node sends CANCEL, the producer's handler stops
            stream = client.send_message(user_message("slow"))
            first = await anext(stream)
            task_id = first.task.id
            await stream.aclose()
            await eventually(lambda: agent.stats().running == 0, timeout=5)
            # the task itself runs on (A2A semantics): resubscribe, then cancel it through A2A
            sub = client.subscribe(SubscribeToTaskRequest(id=task_id))
            seen = [await anext(sub)]
            cancelled = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            seen += [e async for e in sub]
            assert last_state(seen) == TaskState.TASK_STATE_CANCELED
            assert worker.cancelled == [task_id]
            assert server.stats()["calls"]["CancelTask"] == 1

    run(main())


def test_a_card_naming_another_agent_than_the_hello_proves_is_refused(sockdir):
    async def main():
        worker = Worker()
        async with (
            agent_and_caller("tls", sockdir, worker) as (agent, caller, _),
            Node(listen=["tls://127.0.0.1:0"]) as impostor,
        ):
            got = await ia.fetch_card(caller, agent.agent_id, *agent.addresses)
            forged = card()
            forged.supported_interfaces.append(ia.iac_interface(agent.agent_id, impostor.addresses))
            fresh = Node()  # no earlier connection to the real agent
            async with fresh:
                binding = ia.register(
                    factory := ClientFactory(ClientConfig(supported_protocol_bindings=["IAC"])), fresh
                )
                client = factory.create(forged)
                with pytest.raises(ia.IacBindingError) as mismatch:
                    [e async for e in client.send_message(user_message("hello"))]
                assert mismatch.value.code == "wrong_peer"
                assert binding.stats.failed["wrong_peer"] == 1
                # a card served by one agent that names another is refused as well
                says = ia.with_iac_interface(card(), agent.agent_id, agent.addresses)
                assert ia.with_iac_interface(says, impostor.agent_id, []).supported_interfaces[0].url == (
                    f"iac://{impostor.agent_id}"
                )  # a server lists itself, never another agent

                @impostor.on("RUN")
                async def lying(ctx):  # another implementation could serve anything
                    yield {"result": MessageToDict(says)}

                with pytest.raises(ia.IacBindingError) as mismatch:
                    await ia.fetch_card(fresh, impostor.agent_id, *impostor.addresses)
                assert mismatch.value.code == "wrong_peer"
            assert got.name == "worker" and worker.executions == 0

    run(main())


def test_malformed_calls_never_reach_the_agent(sockdir):
    async def main():
        worker = Worker()
        async with agent_and_caller("unix", sockdir, worker) as (agent, caller, server):
            caller.add_peer(agent.agent_id, *agent.addresses)

            async def answer(payload):
                return [p.payload async for p in caller.stream(agent.agent_id, "RUN", payload, timeout=5)]

            bad = {
                "not an object": [1, 2],
                "no method": {"a2a": "1.0"},
                "old version": {"a2a": "0.3", "method": "SendMessage", "params": {}},
                "unknown method": {"a2a": "1.0", "method": "message/send", "params": {}},
                "params not an object": {"a2a": "1.0", "method": "GetTask", "params": [1]},
                "bad params": {"a2a": "1.0", "method": "GetTask", "params": {"id": {"x": 1}}},
            }
            codes = {}
            for name, payload in bad.items():
                (part,) = await answer(payload)
                codes[name] = part["error"]["code"]
            assert codes == {
                "not an object": -32600, "no method": -32600, "old version": -32009,
                "unknown method": -32601, "params not an object": -32602, "bad params": -32602,
            }  # fmt: skip
            # a principal from a signer the agent does not trust as a gateway: ERROR unauthorized
            transport = ia.IacTransport(
                caller, card(), ia.interface_url(agent.agent_id, []), principal="mallory"
            )
            with pytest.raises(ia.IacBindingError) as err:
                await transport.send_message(user_message("hello"))
            assert err.value.code == "unauthorized"
            refused = server.stats()["refused"]
            assert refused == {
                "InvalidRequestError": 2, "VersionNotSupportedError": 1, "MethodNotFoundError": 1,
                "InvalidParamsError": 2, "untrusted_principal": 1,
            }  # fmt: skip
            assert worker.executions == 0 and not server.stats()["calls"]

    run(main())


def test_a_trusted_gateway_calls_as_its_principal(sockdir):
    async def main():
        worker = Worker()
        agent_card = card()
        async with Node(listen=["tls://127.0.0.1:0"]) as agent, Node() as gateway:
            ia.serve(agent, handler(worker, agent_card), agent_card, trusted_gateways=[gateway.agent_id])
            url = ia.interface_url(agent.agent_id, agent.addresses)
            transport = ia.IacTransport(gateway, agent_card, url, principal="alice@example.org")
            sent = await transport.send_message(user_message("hello"))
            assert sent.message.parts[0].text == "hi alice@example.org"
            user = worker.users[-1]
            assert (user.agent_id, user.principal) == (gateway.agent_id, "alice@example.org")
            assert worker.states[-1]["iac_message"].principal == "alice@example.org"
            # the same gateway node's other traffic to the agent carries no principal
            seen = []
            agent.on("PING")(lambda ctx: seen.append(ctx.message.principal))
            await gateway.request(agent.agent_id, "PING", timeout=5)
            assert seen == [""]
            with pytest.raises(Exception, match="principal"):
                ia.IacTransport(gateway, agent_card, url, principal="x" * 300)

    run(main())


def test_every_abstract_method_of_the_sdk_transport_is_implemented():
    abstract = {
        n for n, v in inspect.getmembers(ClientTransport) if getattr(v, "__isabstractmethod__", False)
    }
    assert abstract <= set(vars(ia.IacTransport))
    assert not ia.IacTransport.__abstractmethods__
    for name in abstract:  # none of them is a stub
        assert "NotImplementedError" not in inspect.getsource(getattr(ia.IacTransport, name))


def test_a_timeout_is_an_a2a_client_timeout(sockdir):
    async def main():
        worker = Worker()
        async with agent_and_caller("tls", sockdir, worker) as (agent, caller, _):
            got = await ia.fetch_card(caller, agent.agent_id, *agent.addresses)
            transport = ia.IacTransport(caller, got, got.supported_interfaces[0].url, timeout=0.5)
            with pytest.raises(A2AClientError, match="IAC"):
                await transport.send_message(user_message("slow"))
            await asyncio.sleep(0)

    run(main())


def test_a_plain_handler_sees_the_gateway_and_the_principal_and_allow_lists_gateways():
    from iac import RemoteError
    from iac.integrations.a2a import principal as stamp

    async def main():
        async with Node(listen=["tls://127.0.0.1:0"]) as agent, Node() as gateway, Node() as other:

            @agent.on("RUN")
            def who(ctx):
                return {
                    "sender": ctx.sender,
                    "said": ctx.message.principal,
                    "believed": ia.principal_of(ctx, {gateway.agent_id}),
                }

            for node in (gateway, other):
                node.add_peer(agent.agent_id, *agent.addresses)
                stamp.enable(node)
            with stamp.stamping(agent.agent_id, "alice"):
                reply = await gateway.request(agent.agent_id, "RUN", timeout=5)
            assert reply.payload == {"sender": gateway.agent_id, "said": "alice", "believed": "alice"}
            assert (await gateway.request(agent.agent_id, "RUN", timeout=5)).payload["said"] == ""
            with stamp.stamping(agent.agent_id, "alice"), pytest.raises(RemoteError) as err:
                await other.request(agent.agent_id, "RUN", timeout=5)
            assert err.value.code == "unauthorized"

    run(main())
