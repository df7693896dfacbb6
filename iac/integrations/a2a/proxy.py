"""An a2a-sdk ``RequestHandler`` that answers every A2A call by making it again through a
``ClientTransport``: the gateway's handler (HTTP in, :class:`~iac.integrations.a2a.client.IacTransport`
out) and the bridge's (IAC in, A2A's JSON-RPC transport out)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncGenerator, Callable
from typing import Any

from a2a.client import ClientCallContext
from a2a.client.transports.base import ClientTransport
from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import A2AError, InvalidAgentResponseError

from iac.integrations.a2a.binding import PRINCIPAL_STATE

#: What a proxied call is made with: the server context it arrived with -> the client context.
ContextMap = Callable[[ServerCallContext], ClientCallContext]


def forward_principal(scc: ServerCallContext) -> ClientCallContext:
    """The client context of a gateway: the authenticated user's name goes on as the principal
    (Message field 19), the extensions the caller asked for go on too."""
    params = (
        {"A2A-Extensions": ",".join(sorted(scc.requested_extensions))} if scc.requested_extensions else None
    )
    state = {PRINCIPAL_STATE: scc.user.user_name} if scc.user.is_authenticated else {}
    return ClientCallContext(state=state, service_parameters=params)


def forward_extensions(scc: ServerCallContext) -> ClientCallContext:
    """The client context of a bridge: only the extensions go on (the HTTP leg authenticates
    with the bridge's own credentials)."""
    params = (
        {"A2A-Extensions": ",".join(sorted(scc.requested_extensions))} if scc.requested_extensions else None
    )
    return ClientCallContext(service_parameters=params)


def _event(sr: pb.StreamResponse) -> Event:
    for name in ("task", "message", "status_update", "artifact_update"):
        if sr.HasField(name):
            out: Event = getattr(sr, name)
            return out
    raise InvalidAgentResponseError(message="a stream event carries nothing")


class ProxyHandler(RequestHandler):
    """Answers each call through ``transport``; ``forwarded`` counts them per method and
    ``failed`` the A2A errors they came back with."""

    def __init__(self, transport: ClientTransport, context: ContextMap = forward_principal) -> None:
        self.transport = transport
        self._context = context
        self.forwarded: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    async def _call(self, method: str, call: Any, scc: ServerCallContext) -> Any:
        self.forwarded[method] += 1
        try:
            return await call(context=self._context(scc))
        except A2AError as exc:
            self.failed[type(exc).__name__] += 1
            raise

    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task | None:
        out: pb.Task = await self._call(
            "GetTask", lambda **kw: self.transport.get_task(params, **kw), context
        )
        return out

    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        out: pb.ListTasksResponse = await self._call(
            "ListTasks", lambda **kw: self.transport.list_tasks(params, **kw), context
        )
        return out

    async def on_cancel_task(
        self, params: pb.CancelTaskRequest, context: ServerCallContext
    ) -> pb.Task | None:
        out: pb.Task = await self._call(
            "CancelTask", lambda **kw: self.transport.cancel_task(params, **kw), context
        )
        return out

    async def on_message_send(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> pb.Task | pb.Message:
        sent: pb.SendMessageResponse = await self._call(
            "SendMessage", lambda **kw: self.transport.send_message(params, **kw), context
        )
        if sent.HasField("task"):
            return sent.task
        if sent.HasField("message"):
            return sent.message
        raise InvalidAgentResponseError(message="SendMessage answered neither a task nor a message")

    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        self.forwarded["SendStreamingMessage"] += 1
        async for event in self._events(
            self.transport.send_message_streaming(params, context=self._context(context))
        ):
            yield event

    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        self.forwarded["SubscribeToTask"] += 1
        async for event in self._events(self.transport.subscribe(params, context=self._context(context))):
            yield event

    async def _events(self, stream: AsyncGenerator[pb.StreamResponse]) -> AsyncGenerator[Event]:
        try:
            async for sr in stream:
                yield _event(sr)
        except A2AError as exc:
            self.failed[type(exc).__name__] += 1
            raise
        finally:
            await stream.aclose()

    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        out: pb.TaskPushNotificationConfig = await self._call(
            "CreateTaskPushNotificationConfig",
            lambda **kw: self.transport.create_task_push_notification_config(params, **kw),
            context,
        )
        return out

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        out: pb.TaskPushNotificationConfig = await self._call(
            "GetTaskPushNotificationConfig",
            lambda **kw: self.transport.get_task_push_notification_config(params, **kw),
            context,
        )
        return out

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        out: pb.ListTaskPushNotificationConfigsResponse = await self._call(
            "ListTaskPushNotificationConfigs",
            lambda **kw: self.transport.list_task_push_notification_configs(params, **kw),
            context,
        )
        return out

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        await self._call(
            "DeleteTaskPushNotificationConfig",
            lambda **kw: self.transport.delete_task_push_notification_config(params, **kw),
            context,
        )

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        out: pb.AgentCard = await self._call(
            "GetExtendedAgentCard", lambda **kw: self.transport.get_extended_agent_card(params, **kw), context
        )
        return out


__all__ = ["ContextMap", "ProxyHandler", "forward_extensions", "forward_principal"]
