"""The embeddable node: one object an agent framework runs in its asyncio process.

A :class:`Node` listens, dials peers from its peer book, and runs every received message through
the receive pipeline (docs/PROTOCOL.md, "The receive pipeline") before anything wakes agent code.
It is the facade over the collaborators that :class:`~iac.node.runtime.NodeRuntime` wires
together; this module holds what agent code calls: handlers, sending, and the :class:`Context` a
handler gets.

Conventions this node keeps on the wire:

* A message **expects a reply** exactly when its ``deadline`` is set: ``request``/``call``/
  ``delegate`` always set one, ``send`` never does. Handlers of one-way messages still run; their
  return value is dropped.
* An ACK_REQUESTED message is acknowledged (ACK, or the REPLY/ERROR of a request) once its handler
  finished; until then the sender retransmits it. The receiver's replay store is two-phase: an id
  is reserved when it passes the replay check and committed once handled, so a retransmission is
  answered again (the ACK, or the cached REPLY) and never handled twice.
* Broadcasts travel inside FORWARD and are delivered once per node, never answered.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from iac.errors import ConfigError, ErrorCode, RemoteError, TransportError
from iac.node.config import PeerEvent
from iac.node.dispatch import Handler
from iac.node.inbound import ErrorCallback
from iac.node.runtime import NodeRuntime
from iac.node.types import Broadcast, FileSent, ReceivedFile, Reply, Sent, dumps
from iac.protocol.files import TransferProgress
from iac.protocol.guards import RESPONSE_TYPES
from iac.wire._pb.iac_pb2 import Message, TaskState
from iac.wire.enums import MessageType, message_type
from iac.wire.message import FLAG_ORDERED, sender_of

log = logging.getLogger("iac.node")

F = TypeVar("F", bound=Callable[..., Any])

_CANCEL = int(MessageType.CANCEL)
_COMMAND = int(MessageType.COMMAND)
_DELEGATE_TASK = int(MessageType.DELEGATE_TASK)


@dataclass(frozen=True)
class Context:
    """What a handler gets: the verified message, its decoded payload and its deadline."""

    node: Node
    message: Message
    payload: Any
    expects_reply: bool
    #: The neighbour it came from: the key whose HELLO proved the connection (``sender`` itself
    #: unless it was relayed inside FORWARD).
    via: str = ""

    @property
    def sender(self) -> str:
        return sender_of(self.message)

    @property
    def msg_type(self) -> int:
        return int(self.message.msg_type)

    @property
    def task(self) -> TaskState | None:
        return self.message.task if self.message.HasField("task") else None

    @property
    def deadline_us(self) -> int:
        """µs since the epoch by which the caller stops waiting (0: none)."""
        return int(self.message.deadline)

    def time_left(self) -> float | None:
        """Seconds until the deadline by the node's clock (None: no deadline; may be negative)."""
        if not self.message.deadline:
            return None
        return (self.message.deadline - self.node.clock.now_us()) / 1e6

    @property
    def extra_data(self) -> bytes:
        return self.message.extra_data

    @property
    def principal(self) -> str:
        """Field 19: the caller a gateway authenticated and sends this for ("" when none). It is
        the gateway's word (``sender`` is the gateway): believe it only from gateways you trust."""
        return self.message.principal

    @property
    def broadcast(self) -> bool:
        """True for a broadcast (empty ``to``): it is never answered."""
        return not self.message.to


class Node(NodeRuntime):
    """An IAC agent endpoint: identity, listeners, peer book, handlers, the receive pipeline.

    Use as ``async with Node(identity, listen=["tls://127.0.0.1:0"]) as node: ...``
    (or :meth:`start` / :meth:`close`).
    """

    def _context(self, msg: Message, payload: Any, expects_reply: bool, via: str = "") -> Context:
        return Context(self, msg, payload, expects_reply, via or sender_of(msg))

    # --- registration -----------------------------------------------------------------------------

    def add_peer(self, agent_id: str, *urls: str) -> None:
        """Add addresses for a peer (tried in order by the fallback dialer)."""
        self._peers.add(agent_id, *urls)

    def add_route(self, dest: str, via: str) -> None:
        """Reach ``dest`` through the relay ``via`` (a static route: never replaced by a learned one).

        A message to ``dest`` goes inside FORWARD to ``via`` whenever this node has no connection to
        ``dest`` itself (``via`` is dialed from the peer book if needed). The relay must be configured to
        relay (``RelayPolicy(relay_unicast=True)``); the reply comes back the same way.
        """
        self._peers.add_route(dest, via)

    def remove_route(self, dest: str) -> None:
        self._peers.remove_route(dest)

    @property
    def routes(self) -> dict[str, str]:
        """The static routes (``dest -> via``), a copy."""
        return dict(self._peers.static_routes)

    def keep_connected(self, peer: str) -> None:
        """Keep an outbound connection to ``peer`` (a registry, a relay): dialed now (from the
        peer book) and again within about a second whenever it drops, with a keep-alive message
        every ``NodeConfig.keepalive_messages`` s that counts as traffic at both ends (a NAT
        keeps its mapping; neither side closes it idle). The relays of static routes
        (:meth:`add_route`) are kept too, once dialed."""
        self._peers.keep(peer)

    def stop_keeping(self, peer: str) -> None:
        """Undo :meth:`keep_connected` (the connection stays until it idles out)."""
        self._peers.unkeep(peer)

    async def connect(self, peer: str) -> None:
        """Dial ``peer`` now (from the peer book) unless already connected."""
        self._check_open()
        await self._peers.connect(peer)

    def on(self, msg_type: MessageType | int | str) -> Callable[[F], F]:
        """Register the handler of a message type: ``@node.on(MessageType.DELEGATE_TASK)`` or
        ``@node.on("DELEGATE_TASK")``.

        The handler takes a :class:`Context` (sync or async); its return value (JSON) is the
        REPLY; :class:`~iac.HandlerError` becomes that ERROR code, any other exception ``internal``.
        """
        mt = message_type(msg_type)
        self._dispatch.check_handled_type(mt)

        def register(func: F) -> F:
            self._dispatch.on(mt, func)
            return func

        return register

    def expose(self, func_or_name: Callable[..., Any] | str | None = None, *, name: str | None = None) -> Any:
        """Put a function on the remote-call allow-list: ``@node.expose``, ``@node.expose("name")``
        or ``node.expose(func, name="name")``. Nothing else is ever callable by name."""
        if callable(func_or_name):
            return self._dispatch.expose(func_or_name, name)
        chosen = func_or_name if isinstance(func_or_name, str) else name
        return lambda func: self._dispatch.expose(func, chosen)

    def handler(self, msg_type: MessageType | int | str) -> Handler | None:
        """The handler registered for ``msg_type`` (:meth:`on`), or None."""
        return self._dispatch.handlers.get(message_type(msg_type))

    def on_peer(self, callback: Callable[[PeerEvent], Any]) -> Callable[[], None]:
        """Call ``callback(PeerEvent)`` when a peer comes up or goes down (sync or async).

        Returns a function that removes the callback again."""
        return self._peers.on_peer(callback)

    def on_error(self, callback: ErrorCallback) -> None:
        """Call ``callback(peer, message, code, text)`` for an ERROR that answers no pending request
        (e.g. a one-way message refused with ``busy``)."""
        self._inbound.error_callbacks.append(callback)

    def on_file(self, callback: Callable[[ReceivedFile], Any]) -> None:
        """Call ``callback(ReceivedFile)`` (sync or async) when a file was verified and renamed into
        the inbox (``NodeConfig.inbox_dir``)."""
        self._files.on_file(callback)

    def peer_events(self) -> AsyncIterator[PeerEvent]:
        """Peer up/down events as an async iterator (ends when the node closes)."""
        return self._peers.events()

    # --- sending ----------------------------------------------------------------------------------

    async def send(
        self,
        peer: str,
        msg_type: MessageType | int | str,
        payload: Any = None,
        *,
        ack: bool = False,
        ordered: bool = False,
        sealed: bool = False,
        extra_data: bytes = b"",
        task: TaskState | None = None,
        payload_json: str | None = None,
        via: str | None = None,
        early: bool = True,
        principal: str = "",
    ) -> Sent:
        """Send a one-way message. ``payload`` is any JSON value (or pass ``payload_json``).

        ``ack=True`` (ACK_REQUESTED): retransmitted until acknowledged; waits while
        ``max_in_flight`` messages to this peer are unacknowledged; ``await sent.wait()``
        for the ACK. ``ordered=True`` (ORDERED): delivered in order per session.
        ``via``: send it inside FORWARD through this relay (else: directly when connected, then
        a route of :meth:`add_route` or a learned reverse route, then the peer book).
        ``principal``: for a gateway, the caller it authenticated (field 19, signed with the
        message; the receiver sees it as ``ctx.principal``).
        ``early=False``: never in 0-RTT early data (docs/PROTOCOL.md, "0-RTT": on a resumed QUIC
        connection it waits until the peer's HELLO verified).
        """
        self._check_open()
        mt = message_type(msg_type)
        build: dict[str, Any] = {"payload_json": payload_json, "extra_data": extra_data, "task": task}
        build |= {"sealed": sealed, "principal": principal}
        if ack:
            return await self._pending.send_reliable(
                peer, mt, payload, ordered=ordered, via=via, early=early, **build
            )
        kind, flags = ("ordered", FLAG_ORDERED) if ordered else ("main", 0)
        msg = self._outbox.build(peer, mt, payload, kind=kind, flags=flags, **build)
        await self._outbox.transmit(peer, msg, via, early=early)
        return Sent(peer, msg.session_id, msg.msg_id, None)

    async def request(
        self,
        peer: str,
        msg_type: MessageType | int | str,
        payload: Any = None,
        *,
        timeout: float | None = None,
        ack: bool = False,
        sealed: bool = False,
        extra_data: bytes = b"",
        task: TaskState | None = None,
        payload_json: str | None = None,
        via: str | None = None,
        early: bool = True,
        principal: str = "",
    ) -> Reply:
        """Send a request and wait for its REPLY. Raises :class:`~iac.RemoteError` for an ERROR
        answer, :class:`~iac.RequestTimeout` after ``timeout`` (a CANCEL is sent), or a
        :class:`~iac.TransportError`. ``ack=True`` retransmits until the callee answers or
        acknowledges. ``via``: through this relay (see :meth:`send`); the reply comes back the same way.
        ``early=False``: never in 0-RTT early data (see :meth:`send`)."""
        self._check_open()
        return await self._pending.request(
            peer,
            message_type(msg_type),
            payload,
            timeout=self.config.request_timeout if timeout is None else timeout,
            ack=ack,
            task=task,
            via=via,
            early=early,
            payload_json=payload_json,
            extra_data=extra_data,
            sealed=sealed,
            principal=principal,
        )

    def stream(
        self,
        peer: str,
        msg_type: MessageType | int | str,
        payload: Any = None,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        window: int = 16,
        sealed: bool = False,
        extra_data: bytes = b"",
        task: TaskState | None = None,
        payload_json: str | None = None,
        via: str | None = None,
        early: bool = True,
        principal: str = "",
    ) -> AsyncIterator[Reply]:
        """A request answered by a sequence of parts: ``async for part in node.stream(peer, "RUN")``.

        The handler is an async generator; each value it yields is a :class:`Reply` here, in order.
        Flow control is end to end: the handler runs at most ``window`` parts ahead of what this
        side took. ``timeout`` bounds the whole stream (default ``request_timeout``),
        ``idle_timeout`` the wait for each part (default: ``timeout``); either raises
        :class:`~iac.RequestTimeout`. An ERROR from the handler raises :class:`~iac.RemoteError`.
        Leaving the loop early (or ``aclose()``, or cancelling) sends CANCEL, which stops the
        handler; use ``contextlib.aclosing(node.stream(...))`` to close at once."""
        self._check_open()
        timeout = self.config.request_timeout if timeout is None else timeout
        return self._streams.consume(
            peer,
            message_type(msg_type),
            payload,
            timeout=timeout,
            idle_timeout=timeout if idle_timeout is None else idle_timeout,
            window=window,
            via=via,
            early=early,
            sealed=sealed,
            extra_data=extra_data,
            task=task,
            payload_json=payload_json,
            principal=principal,
        )

    async def call(
        self, peer: str, name: str, /, *args: Any, timeout: float | None = None, **kwargs: Any
    ) -> Any:
        """Call a function that ``peer`` exposed; return its result (JSON). ``timeout`` as for
        :meth:`request` (a remote keyword argument named ``timeout`` goes through :meth:`invoke`)."""
        return await self.invoke(peer, name, args, kwargs, timeout=timeout)

    async def invoke(
        self,
        peer: str,
        name: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        sealed: bool = False,
        ack: bool = False,
        via: str | None = None,
    ) -> Any:
        """:meth:`call` with a timeout and options."""
        payload = {"name": name, "args": list(args), "kwargs": dict(kwargs or {})}
        reply = await self.request(peer, _COMMAND, payload, timeout=timeout, sealed=sealed, ack=ack, via=via)
        return reply.payload

    async def delegate(
        self,
        peer: str,
        task: TaskState,
        payload: Any = None,
        *,
        timeout: float | None = None,
        fallback: str | Sequence[str] | None = None,
        sealed: bool = False,
        ack: bool = False,
        via: str | None = None,
    ) -> Reply:
        """Hand a task to ``peer`` (DELEGATE_TASK). If it does not answer in time (or cannot be
        reached, or is ``busy``), try the fallback agent(s) in order."""
        if not isinstance(task, TaskState):
            raise ConfigError(
                "delegate() takes the task envelope as iac.TaskState(task_id=..., intent=..., step=..., "
                f"steps=...), not {type(task).__name__}; the payload is the third argument"
            )
        targets = [peer, *([fallback] if isinstance(fallback, str) else list(fallback or ()))]
        for i, target in enumerate(targets):
            last = i == len(targets) - 1
            try:
                return await self.request(
                    target,
                    _DELEGATE_TASK,
                    payload,
                    timeout=timeout,
                    task=task,
                    sealed=sealed,
                    ack=ack,
                    via=via,
                )
            except RemoteError as exc:
                if exc.code not in (ErrorCode.BUSY, ErrorCode.TIMEOUT) or last:
                    raise
                why: Exception = exc
            except TransportError as exc:  # includes RequestTimeout and DialError
                if last:
                    raise
                why = exc
            log.info("delegation to %s… failed (%s); trying the fallback", target[:16], why)
        raise AssertionError("unreachable")  # pragma: no cover

    async def broadcast(
        self,
        msg_type: MessageType | int | str = MessageType.BROADCAST,
        payload: Any = None,
        *,
        payload_json: str | None = None,
        extra_data: bytes = b"",
        hop_limit: int | None = None,
    ) -> Broadcast:
        """Flood a message (empty ``to``) to every connected peer, inside FORWARD with a hop limit
        (``NodeConfig.broadcast_hop_limit``). Every node that gets it hands it to its handler for
        ``msg_type`` once and sends it on to its own peers (relay policy permitting); this node does
        not deliver it to itself. Broadcasts are never answered. Returns a :class:`Broadcast`: the
        ids it went out with (``peer`` is empty) and ``peers``, how many connected peers it was
        sent to. 0 (this node has no connection, e.g. a mesh that idled out) is not an error, as
        peers may come later, but it is logged as a WARNING and counted in
        ``stats().routing["unsent"]`` (a metric too), so a broadcast that reached nobody is seen."""
        self._check_open()
        mt = message_type(msg_type)
        if mt in RESPONSE_TYPES or mt == _CANCEL:
            raise ConfigError("REPLY, ERROR, ACK and CANCEL cannot be broadcast")
        text = payload_json if payload_json is not None else ("" if payload is None else dumps(payload))
        return await self._outbox.broadcast(mt, text, extra_data, hop_limit)

    async def send_file(
        self,
        peer: str,
        path: str | os.PathLike[str],
        *,
        name: str | None = None,
        on_progress: Callable[[TransferProgress], None] | None = None,
        timeout: float | None = None,
        via: str | None = None,
        window: int | None = None,
        chunk_size: int | None = None,
    ) -> FileSent:
        """Send a file to ``peer``'s inbox; return once the receiver verified its SHA-256 and renamed it.

        Chunks go as FILE_TRANSFER messages, ``window`` (``NodeConfig.file_window``) in flight, each
        acknowledged by the receiver's state. A broken connection is redialed; the sender asks the
        receiver what it holds and sends only the rest (acknowledged chunks are never sent again).
        ``on_progress(TransferProgress)`` runs after every ack that adds chunks. ``timeout`` is how
        long the transfer may go without progress (default ``request_timeout``): then
        :class:`~iac.RequestTimeout`. A refusal raises :class:`~iac.TransferRefused` (a ``failed``
        ack: ``code`` is the receiver's error name, e.g. ``file_exists``) or :class:`~iac.RemoteError`
        (an ERROR such as ``no_handler`` from a node without an inbox).
        """
        self._check_open()
        return await self._files.send(
            peer,
            path,
            name=name,
            on_progress=on_progress,
            timeout=timeout,
            via=via,
            window=window,
            chunk_size=chunk_size,
        )


__all__ = ["Context", "Node"]
