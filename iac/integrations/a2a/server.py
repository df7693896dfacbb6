"""The server side of A2A over IAC: an a2a-sdk ``RequestHandler`` (say ``DefaultRequestHandler``
around the agent's ``AgentExecutor``, unchanged) answering A2A calls that arrive on an
:class:`iac.Node`.

::

    server = serve(node, DefaultRequestHandler(MyExecutor(), InMemoryTaskStore(), card), card)

Nothing reaches the handler before the node's receive pipeline passed the message (signature,
freshness, replay, policy, guards) and the binding decoded the call. The caller's identity is
the AgentId that signed the request: the executor finds it as ``context.call_context.user``
(an :class:`IacUser`) and in ``call_context.state["iac_agent_id"]``. A call from a trusted
gateway (``trusted_gateways``) runs as the principal the gateway names in Message field 19.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.server.routes.common import serialize_list_tasks_response
from a2a.types import a2a_pb2 as pb
from a2a.utils.constants import VERSION_HEADER
from a2a.utils.errors import A2AError, InternalError, TaskNotFoundError
from a2a.utils.proto_utils import to_stream_response

from iac.errors import ConfigError, HandlerError
from iac.integrations.a2a.binding import (
    GET_AGENT_CARD,
    MSG_TYPE,
    Call,
    error_payload,
    iac_interface,
    parse_call,
    result_payload,
    with_iac_interface,
)
from iac.integrations.a2a.principal import principal_of
from iac.node.node import Context, Node

log = logging.getLogger("iac.integrations")


class IacUser(User):
    """Who made an A2A call over IAC. ``agent_id`` signed it; ``principal`` is who a trusted
    gateway says it forwards it for ("" for a direct call). ``user_name`` -- what a2a-sdk scopes
    tasks by -- is the principal when there is one, else the AgentId."""

    def __init__(self, agent_id: str, principal: str = "") -> None:
        self.agent_id = agent_id
        self.principal = principal

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.principal or self.agent_id

    def __repr__(self) -> str:
        via = f", principal={self.principal!r}" if self.principal else ""
        return f"IacUser({self.agent_id[:16]}…{via})"


class A2AServer:
    """Answers A2A calls on ``node`` with ``handler``; ``stats()`` counts them.

    ``card``: the public card (``GetAgentCard``); it gets this node's IAC interface when it lists
    none for it. ``trusted_gateways``: AgentIds whose principal (field 19) is believed; a call
    that names a principal from any other signer is refused with ERROR ``unauthorized``.
    """

    def __init__(
        self,
        node: Node,
        handler: RequestHandler,
        card: pb.AgentCard,
        *,
        trusted_gateways: Collection[str] = (),
    ) -> None:
        self.node = node
        self.handler = handler
        self._card = card
        self.trusted_gateways = frozenset(trusted_gateways)
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()

    @property
    def card(self) -> pb.AgentCard:
        """The public card, listing this node's IAC interface (its addresses once it listens)."""
        return with_iac_interface(self._card, self.node.agent_id, self.node.addresses)

    def attach(self) -> A2AServer:
        """Register the binding's handler (RUN) on the node."""
        self.node.on(MSG_TYPE)(self.handle)
        return self

    def stats(self) -> dict[str, dict[str, int]]:
        """``calls`` per method; ``errors`` per A2A error answered; ``refused``: calls that never
        reached the handler (malformed, unknown method or version, bad params, untrusted principal)."""
        return {"calls": dict(self.calls), "errors": dict(self.errors), "refused": dict(self.refused)}

    async def handle(self, ctx: Context) -> AsyncIterator[dict[str, Any]]:
        """The node handler: one answer part per result or event (an async generator)."""
        try:
            call = parse_call(ctx.payload)
        except A2AError as exc:
            self.refused[type(exc).__name__] += 1
            yield error_payload(exc)
            return
        try:
            principal = principal_of(ctx, self.trusted_gateways)
        except HandlerError:
            self.refused["untrusted_principal"] += 1
            raise
        self.calls[call.method.name] += 1
        scc = self._call_context(ctx, call, principal)
        try:
            if call.method.streaming:
                async for part in self._stream(call, scc):
                    yield part
            else:
                yield await self._unary(call, scc)
        except A2AError as exc:
            self.errors[type(exc).__name__] += 1
            yield error_payload(exc)
        except HandlerError:
            raise
        except Exception as exc:
            log.exception("A2A %s failed", call.method.name)
            self.errors["InternalError"] += 1
            yield error_payload(InternalError(message=f"{call.method.name} failed: {type(exc).__name__}"))

    def _call_context(self, ctx: Context, call: Call, principal: str) -> ServerCallContext:
        state: dict[str, Any] = {
            "headers": {VERSION_HEADER: call.version},
            "method": call.method.name,
            "iac_agent_id": ctx.sender,
            "iac_principal": principal,
            "iac_message": ctx.message,
        }
        return ServerCallContext(
            user=IacUser(ctx.sender, principal),
            state=state,
            tenant=getattr(call.params, "tenant", ""),
            requested_extensions=set(call.extensions),
        )

    async def _stream(self, call: Call, scc: ServerCallContext) -> AsyncIterator[dict[str, Any]]:
        params: Any = call.params
        if call.method.name == "SendStreamingMessage":
            events = self.handler.on_message_send_stream(params, scc)
        else:
            events = self.handler.on_subscribe_to_task(params, scc)
        async with contextlib.aclosing(events):
            async for event in events:
                yield result_payload(to_stream_response(event))

    async def _unary(self, call: Call, scc: ServerCallContext) -> dict[str, Any]:
        h, p, name = self.handler, call.params, call.method.name
        match name:
            case "SendMessage":
                out = await h.on_message_send(p, scc)  # type: ignore[arg-type]
                if isinstance(out, pb.Task):
                    return result_payload(pb.SendMessageResponse(task=out))
                return result_payload(pb.SendMessageResponse(message=out))
            case "GetTask":
                return _task(await h.on_get_task(p, scc))  # type: ignore[arg-type]
            case "CancelTask":
                return _task(await h.on_cancel_task(p, scc))  # type: ignore[arg-type]
            case "ListTasks":
                listed = await h.on_list_tasks(p, scc)  # type: ignore[arg-type]
                return result_payload(serialize_list_tasks_response(listed, p.include_artifacts))  # type: ignore[attr-defined]
            case "CreateTaskPushNotificationConfig":
                return result_payload(await h.on_create_task_push_notification_config(p, scc))  # type: ignore[arg-type]
            case "GetTaskPushNotificationConfig":
                return result_payload(await h.on_get_task_push_notification_config(p, scc))  # type: ignore[arg-type]
            case "ListTaskPushNotificationConfigs":
                return result_payload(await h.on_list_task_push_notification_configs(p, scc))  # type: ignore[arg-type]
            case "DeleteTaskPushNotificationConfig":
                await h.on_delete_task_push_notification_config(p, scc)  # type: ignore[arg-type]
                return result_payload(None)
            case "GetExtendedAgentCard":
                return result_payload(await h.on_get_extended_agent_card(p, scc))  # type: ignore[arg-type]
            case _:
                assert name == GET_AGENT_CARD
                return result_payload(self.card)


def _task(task: pb.Task | None) -> dict[str, Any]:
    if task is None:
        raise TaskNotFoundError
    return result_payload(task)


def agent_card(
    node: Node,
    name: str,
    *,
    description: str,
    version: str = "1.0.0",
    skills: Sequence[pb.AgentSkill] = (),
    streaming: bool = True,
    push_notifications: bool = False,
    input_modes: Sequence[str] = ("text/plain",),
    output_modes: Sequence[str] = ("text/plain",),
    interfaces: Sequence[pb.AgentInterface] = (),
) -> pb.AgentCard:
    """A card for the agent ``node`` serves, with every field A2A requires: ``node``'s IAC
    interface first (its addresses: start the node first), then ``interfaces``; ``skills`` (one
    named after the agent, with its ``description``, when none is given); the input and output
    media types. a2a-sdk warns ("not spec-compliant") about a card that lacks one of them."""
    if not name.strip() or not description.strip():
        raise ConfigError("an A2A agent card needs a name and a description")
    if not input_modes or not output_modes:
        raise ConfigError("an A2A agent card needs at least one input and one output media type")
    own = pb.AgentSkill(id=name, name=name, description=description, tags=[name])
    return pb.AgentCard(
        name=name,
        description=description,
        version=version,
        capabilities=pb.AgentCapabilities(streaming=streaming, push_notifications=push_notifications),
        supported_interfaces=[iac_interface(node.agent_id, node.addresses), *interfaces],
        default_input_modes=list(input_modes),
        default_output_modes=list(output_modes),
        skills=list(skills) or [own],
    )


def serve(
    node: Node, handler: RequestHandler, card: pb.AgentCard, *, trusted_gateways: Collection[str] = ()
) -> A2AServer:
    """Answer A2A calls over IAC on ``node`` with ``handler`` (see :class:`A2AServer`)."""
    return A2AServer(node, handler, card, trusted_gateways=trusted_gateways).attach()


__all__ = ["A2AServer", "IacUser", "agent_card", "serve"]
