"""The client side of A2A over IAC: an a2a-sdk ``ClientTransport`` whose calls are signed IAC
messages, dialed by an :class:`iac.Node` (QUIC, TLS/TCP or UNIX, with its fallback).

::

    factory = ClientFactory(ClientConfig(supported_protocol_bindings=["IAC", "JSONRPC"]))
    binding = register(factory, node)          # the factory now builds IacTransport for "IAC"
    client = factory.create(card)              # a card that lists an iac:// interface

Every A2A method is carried; what the card does not declare (streaming, push notifications) is
refused here as the agent would refuse it, without a round trip.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, TypeVar

from a2a.client import Client, ClientCallContext, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientTimeoutError
from a2a.client.transports.base import ClientTransport
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    A2AError,
    InvalidAgentResponseError,
    PushNotificationNotSupportedError,
    UnsupportedOperationError,
)
from google.protobuf.message import Message as ProtoMessage

from iac.errors import (
    DialError,
    ErrorCode,
    HandshakeError,
    IacError,
    RemoteError,
    RequestTimeout,
)
from iac.integrations.a2a import principal as _principal
from iac.integrations.a2a.binding import (
    BINDING,
    GET_AGENT_CARD,
    METHODS,
    MSG_TYPE,
    PRINCIPAL_STATE,
    IacBindingError,
    answer_error,
    call_payload,
    check_principal,
    iac_endpoints,
    parse_answer,
    parse_interface_url,
)
from iac.node.node import Node
from iac.node.types import Reply

M = TypeVar("M", bound=ProtoMessage)

#: Parts a unary call's stream may run ahead: its one part and the END, with no CREDIT sent.
_UNARY_WINDOW = 4


class BindingStats:
    """Counters of the IAC client side: ``calls`` per method, ``failed`` per reason (an A2A error
    class name, or the IAC error: ``wrong_peer``, ``timeout``, ``no_handler``, ...)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {"calls": dict(self.calls), "failed": dict(self.failed)}


class IacCaller:
    """Makes A2A calls to one IAC agent: the payloads of the binding, over ``node.stream``."""

    def __init__(
        self,
        node: Node,
        peer: str,
        *,
        timeout: float = 30.0,
        stream_timeout: float = 600.0,
        window: int = 16,
        principal: str = "",
        stats: BindingStats | None = None,
    ) -> None:
        _principal.enable(node)
        self.node = node
        self.peer = peer
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.window = window
        self.principal = check_principal(principal)
        self.stats = stats or BindingStats()

    def _principal_for(self, context: ClientCallContext | None) -> str:
        if context is not None and context.state.get(PRINCIPAL_STATE):
            return check_principal(str(context.state[PRINCIPAL_STATE]))
        return self.principal

    async def parts(
        self, method: str, params: ProtoMessage, context: ClientCallContext | None = None
    ) -> AsyncIterator[Any]:
        """The answer parts of a call, as decoded JSON, in order. An error part is yielded like the
        others (the stream is read to its END after it); IAC failures raise A2A client errors."""
        spec = METHODS[method]
        self.stats.calls[method] += 1
        timeout = context.timeout if context is not None and context.timeout else None
        if timeout is None:
            timeout = self.stream_timeout if spec.streaming else self.timeout
        extensions: list[str] = []
        if context is not None and context.service_parameters:
            ext = context.service_parameters.get("A2A-Extensions", "")
            extensions = [e.strip() for e in ext.split(",") if e.strip()]
        payload = call_payload(method, params, extensions=extensions)
        principal = self._principal_for(context)
        window = self.window if spec.streaming else _UNARY_WINDOW
        stream = self.node.stream(self.peer, MSG_TYPE, payload, timeout=timeout, window=window)
        try:
            while True:
                with self._errors(), _principal.stamping(self.peer, principal):
                    try:
                        part: Reply = await anext(stream)
                    except StopAsyncIteration:
                        return
                if part.sender != self.peer:  # the node matched the answer to the peer it asked
                    raise IacBindingError(
                        f"an answer came from {part.sender[:16]}…, not {self.peer[:16]}…", "wrong_peer"
                    )
                yield part.payload
        finally:
            with contextlib.suppress(IacError, OSError), _principal.stamping(self.peer, principal):
                close = getattr(stream, "aclose", None)  # an async generator: sends CANCEL if not ended
                if close is not None:
                    await close()

    async def unary(
        self, method: str, params: ProtoMessage, into: M | None, context: ClientCallContext | None
    ) -> M | None:
        """A call with one answer, decoded into ``into``."""
        answers = [p async for p in self.parts(method, params, context)]
        if len(answers) != 1:
            self.stats.failed["InvalidAgentResponseError"] += 1
            raise InvalidAgentResponseError(message=f"{method} answered {len(answers)} parts, not one")
        try:
            out = parse_answer(answers[0], into)
        except A2AError as exc:
            self.stats.failed[type(exc).__name__] += 1
            raise
        return out  # type: ignore[return-value]  # ``into`` itself, filled in

    async def streaming(
        self, method: str, params: ProtoMessage, context: ClientCallContext | None
    ) -> AsyncGenerator[pb.StreamResponse]:
        """A streaming call: one ``StreamResponse`` per part; an error part raises once the
        stream has ended."""
        error: A2AError | None = None
        async for payload in self.parts(method, params, context):
            if error is not None:
                continue  # the producer should have ended: drain to the END
            error = answer_error(payload)
            if error is None:
                parsed = parse_answer(payload, pb.StreamResponse())
                assert isinstance(parsed, pb.StreamResponse)
                yield parsed
        if error is not None:
            self.stats.failed[type(error).__name__] += 1
            raise error

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """IAC failures as A2A client errors (and counted)."""
        try:
            yield
        except RequestTimeout as exc:
            self.stats.failed["timeout"] += 1
            raise A2AClientTimeoutError(f"A2A over IAC: {exc}") from exc
        except RemoteError as exc:
            self.stats.failed[exc.code] += 1
            if exc.code == ErrorCode.TIMEOUT:
                raise A2AClientTimeoutError(f"A2A over IAC: the agent answered {exc}") from exc
            what = "serves no A2A over IAC" if exc.code == ErrorCode.NO_HANDLER else "refused the call"
            raise IacBindingError(f"{self.peer[:16]}… {what}: {exc}", exc.code) from exc
        except (HandshakeError, DialError) as exc:
            if isinstance(exc, HandshakeError):
                wrong = exc.reason == "wrong_peer"
            else:
                wrong = any(a.outcome == "wrong_peer" for a in exc.attempts)
            if wrong:
                self.stats.failed["wrong_peer"] += 1
                raise IacBindingError(
                    f"the card names {self.peer[:16]}…, but the peer at its addresses proved another "
                    f"AgentId in its HELLO: {exc}",
                    "wrong_peer",
                ) from exc
            self.stats.failed[exc.reason] += 1
            raise IacBindingError(f"A2A over IAC: {exc}", exc.reason) from exc
        except IacError as exc:
            self.stats.failed[exc.reason] += 1
            raise IacBindingError(f"A2A over IAC: {exc}", exc.reason) from exc


class IacTransport(ClientTransport):
    """An a2a-sdk transport that makes every A2A call an IAC request to the agent the card's
    ``iac://`` interface names, through ``node`` (which dials it and checks its HELLO)."""

    def __init__(self, node: Node, card: pb.AgentCard, url: str, **options: Any) -> None:
        endpoint = parse_interface_url(url)
        node.add_peer(endpoint.agent_id, *endpoint.addresses)
        self.agent_card = card
        self.url = url
        self.caller = IacCaller(node, endpoint.agent_id, **options)

    @property
    def peer(self) -> str:
        return self.caller.peer

    def _check(self, capability: str) -> None:
        caps = self.agent_card.capabilities
        if capability == "streaming" and not caps.streaming:
            raise UnsupportedOperationError(message="the agent card declares no streaming")
        if capability == "push" and not caps.push_notifications:
            raise PushNotificationNotSupportedError(message="the agent card declares no push notifications")

    async def send_message(
        self, request: pb.SendMessageRequest, *, context: ClientCallContext | None = None
    ) -> pb.SendMessageResponse:
        return await self._unary("SendMessage", request, pb.SendMessageResponse(), context)

    async def send_message_streaming(
        self, request: pb.SendMessageRequest, *, context: ClientCallContext | None = None
    ) -> AsyncGenerator[pb.StreamResponse]:
        self._check("streaming")
        async for event in self.caller.streaming("SendStreamingMessage", request, context):
            yield event

    async def get_task(
        self, request: pb.GetTaskRequest, *, context: ClientCallContext | None = None
    ) -> pb.Task:
        return await self._unary("GetTask", request, pb.Task(), context)

    async def list_tasks(
        self, request: pb.ListTasksRequest, *, context: ClientCallContext | None = None
    ) -> pb.ListTasksResponse:
        return await self._unary("ListTasks", request, pb.ListTasksResponse(), context)

    async def cancel_task(
        self, request: pb.CancelTaskRequest, *, context: ClientCallContext | None = None
    ) -> pb.Task:
        return await self._unary("CancelTask", request, pb.Task(), context)

    async def create_task_push_notification_config(
        self, request: pb.TaskPushNotificationConfig, *, context: ClientCallContext | None = None
    ) -> pb.TaskPushNotificationConfig:
        self._check("push")
        return await self._unary(
            "CreateTaskPushNotificationConfig", request, pb.TaskPushNotificationConfig(), context
        )

    async def get_task_push_notification_config(
        self, request: pb.GetTaskPushNotificationConfigRequest, *, context: ClientCallContext | None = None
    ) -> pb.TaskPushNotificationConfig:
        self._check("push")
        return await self._unary(
            "GetTaskPushNotificationConfig", request, pb.TaskPushNotificationConfig(), context
        )

    async def list_task_push_notification_configs(
        self, request: pb.ListTaskPushNotificationConfigsRequest, *, context: ClientCallContext | None = None
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        self._check("push")
        return await self._unary(
            "ListTaskPushNotificationConfigs", request, pb.ListTaskPushNotificationConfigsResponse(), context
        )

    async def delete_task_push_notification_config(
        self, request: pb.DeleteTaskPushNotificationConfigRequest, *, context: ClientCallContext | None = None
    ) -> None:
        self._check("push")
        await self.caller.unary("DeleteTaskPushNotificationConfig", request, None, context)

    async def subscribe(
        self, request: pb.SubscribeToTaskRequest, *, context: ClientCallContext | None = None
    ) -> AsyncGenerator[pb.StreamResponse]:
        self._check("streaming")
        async for event in self.caller.streaming("SubscribeToTask", request, context):
            yield event

    async def get_extended_agent_card(
        self, request: pb.GetExtendedAgentCardRequest, *, context: ClientCallContext | None = None
    ) -> pb.AgentCard:
        if not self.agent_card.capabilities.extended_agent_card:
            return self.agent_card  # as A2A's own transports do: the card is all there is
        return await self._unary("GetExtendedAgentCard", request, pb.AgentCard(), context)

    async def close(self) -> None:
        """Nothing to release: the node (and its connections) belong to the caller."""

    async def _unary(
        self, method: str, request: ProtoMessage, into: M, context: ClientCallContext | None
    ) -> M:
        out = await self.caller.unary(method, request, into, context)
        assert out is not None
        return out


class IacBinding:
    """The IAC transport of one node for a2a-sdk client factories; ``stats`` counts its calls."""

    def __init__(self, node: Node, **options: Any) -> None:
        self.node = node
        self.options = options
        self.stats = BindingStats()

    def transport(self, card: pb.AgentCard, url: str, config: ClientConfig | None = None) -> IacTransport:
        """The a2a-sdk transport producer (``ClientFactory.register(BINDING, binding.transport)``)."""
        return IacTransport(self.node, card, url, stats=self.stats, **self.options)


def register(factory: ClientFactory, node: Node, **options: Any) -> IacBinding:
    """Make ``factory`` build :class:`IacTransport` (through ``node``) for cards that list an
    ``iac://`` interface. ``options``: ``timeout`` (unary calls, s), ``stream_timeout``, ``window``
    (parts a stream may run ahead), ``principal`` (Message field 19: for gateways)."""
    binding = IacBinding(node, **options)
    factory.register(BINDING, binding.transport)
    return binding


def client(node: Node, card: pb.AgentCard, *, config: ClientConfig | None = None, **options: Any) -> Client:
    """An a2a-sdk ``Client`` that prefers the card's IAC interface (then JSON-RPC), wherever the
    card lists it (``use_client_preference=True``: a gateway's card lists its HTTP URL first).
    ``config``: a2a-sdk's, as given (its ``use_client_preference`` decides)."""
    config = config or ClientConfig(
        supported_protocol_bindings=[BINDING, "JSONRPC"], use_client_preference=True
    )
    factory = ClientFactory(config)
    register(factory, node, **options)
    return factory.create(card)


async def fetch_card(node: Node, agent_id: str, *addresses: str, timeout: float = 30.0) -> pb.AgentCard:
    """The public card of the A2A agent behind IAC agent ``agent_id`` (the binding's
    ``GetAgentCard``). A card whose IAC interfaces name another AgentId than the one that answered
    (and so proved itself in its HELLO and signature) raises :class:`IacBindingError` with
    ``code`` ``wrong_peer``."""
    if addresses:
        node.add_peer(agent_id, *addresses)
    caller = IacCaller(node, agent_id, timeout=timeout)
    card = await caller.unary(GET_AGENT_CARD, pb.GetExtendedAgentCardRequest(), pb.AgentCard(), None)
    assert isinstance(card, pb.AgentCard)
    named = {e.agent_id for e in iac_endpoints(card)}
    if named and agent_id not in named:
        caller.stats.failed["wrong_peer"] += 1
        raise IacBindingError(
            f"the card {agent_id[:16]}… served names {', '.join(n[:16] + '…' for n in sorted(named))}",
            "wrong_peer",
        )
    return card


__all__ = ["BindingStats", "IacBinding", "IacCaller", "IacTransport", "client", "fetch_card", "register"]
