"""Shared pieces of the A2A tests: an a2a-sdk AgentExecutor (unchanged A2A code: it knows nothing
of IAC), its card, and a stock HTTP A2A server under uvicorn. No tests here."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("a2a")

import uvicorn
from a2a.helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryPushNotificationConfigStore, InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskState,
)
from ports import free_port
from starlette.applications import Starlette

TOKEN = "token-for-alice-0123456789"
OTHER_TOKEN = "token-for-bob-0123456789ab"


def card(name: str = "worker", *, streaming: bool = True, push: bool = False, url: str = "") -> AgentCard:
    interfaces = [AgentInterface(protocol_binding="JSONRPC", protocol_version="1.0", url=url)] if url else []
    return AgentCard(
        name=name,
        description="test agent",
        version="1.0.0",
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        capabilities=AgentCapabilities(streaming=streaming, push_notifications=push),
        skills=[AgentSkill(id="work", name="work", description="works", tags=["test"])],
        supported_interfaces=interfaces,
    )


def user_message(text: str, *, task_id: str = "", blocking: bool = True) -> SendMessageRequest:
    msg = Message(role=Role.ROLE_USER, message_id=f"m-{text[:8]}-{id(text)}", parts=[Part(text=text)])
    if task_id:
        msg.task_id = task_id
    return SendMessageRequest(
        message=msg, configuration=SendMessageConfiguration(return_immediately=not blocking)
    )


class Worker(AgentExecutor):
    """``hello`` -> a message naming the caller; ``task N`` -> a task with N artifacts;
    ``slow`` -> a task that works until cancelled; ``fail`` -> raises; ``call`` -> ``on_call``."""

    def __init__(self, on_call: Callable[[RequestContext], Any] | None = None) -> None:
        self.executions = 0
        self.users: list[Any] = []
        self.states: list[dict[str, Any]] = []
        self.cancelled: list[str] = []
        self.started = asyncio.Event()
        self.on_call = on_call

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.executions += 1
        self.users.append(context.call_context.user)
        self.states.append(dict(context.call_context.state))
        text = context.get_user_input()
        if text == "hello":
            name = context.call_context.user.user_name
            await event_queue.enqueue_event(new_text_message(f"hi {name}"))
            return
        if text == "call" and self.on_call is not None:
            answer = await self.on_call(context)
            await event_queue.enqueue_event(new_text_message(str(answer)))
            return
        if text == "fail":
            raise RuntimeError("the agent failed")
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        if text == "slow":
            self.started.set()
            await asyncio.sleep(60)
            return
        n = int(text.split()[1]) if text.startswith("task ") else 1
        for i in range(n):
            await updater.add_artifact([Part(text=f"part {i}")], name=f"a{i}")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.cancelled.append(context.task_id or "")
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


def handler(worker: Worker, agent_card: AgentCard) -> DefaultRequestHandler:
    push = InMemoryPushNotificationConfigStore() if agent_card.capabilities.push_notifications else None
    return DefaultRequestHandler(worker, InMemoryTaskStore(), agent_card, push_config_store=push)


@contextlib.asynccontextmanager
async def http_agent(worker: Worker, *, name: str = "http-worker") -> AsyncIterator[tuple[str, AgentCard]]:
    """A stock a2a-sdk JSON-RPC server (uvicorn, loopback) around ``worker``: ``(url, card)``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    agent_card = card(name, url=url)
    routes = [*create_agent_card_routes(agent_card), *create_jsonrpc_routes(handler(worker, agent_card), "/")]
    config = uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield url, agent_card
    finally:
        server.should_exit = True
        await task


def texts(events: list[Any]) -> list[str]:
    out = []
    for ev in events:
        if ev.HasField("message"):
            out += [p.text for p in ev.message.parts]
        elif ev.HasField("artifact_update"):
            out += [p.text for p in ev.artifact_update.artifact.parts]
    return out


def last_state(events: list[Any]) -> int:
    state = TaskState.TASK_STATE_UNSPECIFIED
    for ev in events:
        if ev.HasField("task"):
            state = ev.task.status.state
        elif ev.HasField("status_update"):
            state = ev.status_update.status.state
    return state
