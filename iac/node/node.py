"""The embeddable node: one object an agent framework runs in its asyncio process.

A :class:`Node` listens, dials peers from its peer book, and runs every received message through
the receive pipeline (docs/PROTOCOL.md, "The receive pipeline") before anything wakes agent code.
It is the facade over the collaborators that :class:`~iac.node.runtime.NodeRuntime` wires
together (a Node holds its runtime); this module holds what agent code calls: handlers, sending,
state, and the :class:`Context` a handler gets.

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

import functools
import logging
import os
import warnings
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ParamSpec, Self, TypeVar, cast, overload

from iac.errors import ConfigError, ErrorCode, RemoteError, TransportError
from iac.node.config import NodeConfig, NodeStats, PeerEvent
from iac.node.dispatch import Handler
from iac.node.inbound import ErrorCallback
from iac.node.observe import Attachable, Observer
from iac.node.peers import Paths
from iac.node.runtime import NodeRuntime
from iac.node.transports import import_transports
from iac.node.types import (
    Broadcast,
    FileSent,
    ReceivedFile,
    Reply,
    SendOptions,
    Sent,
    payload_text,
    send_options,
    subscribe,
)
from iac.protocol.clock import Clock
from iac.protocol.files import TransferProgress
from iac.protocol.guards import RESPONSE_TYPES
from iac.protocol.replay import ReplayStore
from iac.transport.base import Connection
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType, message_type
from iac.wire.identity import Identity
from iac.wire.message import FLAG_ORDERED, sender_of
from iac.wire.task import TaskState

log = logging.getLogger("iac.node")

F = TypeVar("F", bound=Callable[..., Any])
P = ParamSpec("P")
R = TypeVar("R")


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
    def has_task(self) -> bool:
        """The message carries a task envelope (every DELEGATE_TASK does)."""
        return self.message.HasField("task")

    @property
    def task(self) -> TaskState:
        """The message's task envelope. Every DELEGATE_TASK carries one (the node checked its intent
        and step before the handler runs); another type only when its sender attached one
        (:attr:`has_task`): without one this raises :class:`~iac.ConfigError`."""
        if not self.message.HasField("task"):
            raise ConfigError(
                f"this {MessageType(self.msg_type).name} message carries no task; check ctx.has_task first"
            )
        return cast(TaskState, self.message.task)

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


class Node:
    """An IAC agent endpoint: identity, listeners, peer book, handlers, the receive pipeline.

    Use as ``async with Node(identity, listen=["tls://127.0.0.1:0"]) as node: ...``
    (or :meth:`start` / :meth:`close`).
    """

    def __init__(
        self,
        identity: Identity | None = None,
        *,
        listen: str | Sequence[str] = (),
        config: NodeConfig | None = None,
        replay_store: ReplayStore | None = None,
        clock: Clock | None = None,
        peers: dict[str, Sequence[str]] | None = None,
        metrics: Attachable | None = None,
    ) -> None:
        rt = self._runtime = NodeRuntime(
            identity,
            listen=listen,
            config=config,
            replay_store=replay_store,
            clock=clock,
            peers=peers,
            context=functools.partial(Context, self),  # (the dispatcher always names ``via``)
        )
        self.identity: Identity = rt.identity
        self.config: NodeConfig = rt.config
        self.clock: Clock = rt.clock
        #: The URLs this node listens on (filled by :meth:`start`).
        self.addresses: list[str] = rt.addresses
        #: Set by a NAT traversal role: its counters, under ``stats().nat``.
        self.nat_stats: Callable[[], Mapping[str, Any]] | None = None
        self._metrics = metrics
        self._detach: list[Callable[[], None]] = []
        self._peers, self._outbox, self._pending = rt.peers, rt.outbox, rt.pending
        self._streams, self._dispatch, self._files, self._inbound = (
            rt.streams,
            rt.dispatch,
            rt.files,
            rt.inbound,
        )
        self._paths = Paths(rt.peers, rt.clock)

    # --- lifecycle --------------------------------------------------------------------------------

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    async def start(self) -> None:
        """Open the replay store and the listeners; import the transports the peer book dials."""
        if self._runtime.started:
            return
        await self._runtime.start()
        import_transports(url for urls in self.peer_book.values() for url in urls)
        if self._metrics is not None:
            self._detach.append(self._metrics.attach(self))

    async def close(self) -> None:
        """Drain and close: stop accepting, let in-flight handlers and unacknowledged messages
        finish (up to ``drain_timeout``), then GOAWAY every connection."""
        await self._runtime.close()
        detach, self._detach = self._detach, []
        for undo in detach:
            undo()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<Node {self.agent_id[:16]}… {self.addresses}>"

    def _check_open(self) -> None:
        self._runtime.check_open()

    # --- state ------------------------------------------------------------------------------------

    def peer_state(self) -> dict[str, int]:
        """How many entries the node keeps per peer, by table (all bounded or expired)."""
        return self._runtime.peer_state()

    @property
    def peer_book(self) -> dict[str, list[str]]:
        """The peer book: the addresses this node may dial, by AgentId (a copy). What is connected
        now is :meth:`connected` / :meth:`connection`, and ``stats().peer_links``."""
        return {k: list(v) for k, v in self._peers.book.items()}

    @property
    def peers(self) -> dict[str, list[str]]:
        """Deprecated name of :attr:`peer_book` (it holds addresses, not connections)."""
        warnings.warn("Node.peers is now Node.peer_book", DeprecationWarning, stacklevel=2)
        return self.peer_book

    def peer_links(self) -> dict[str, dict[str, Any]]:
        """Per peer that is connected or was asked something: ``connected``, ``transport``,
        ``address``, ``path`` (``direct``, ``relayed`` through a route, ``none``), ``rtt_ms``
        (smoothed request round trip, None before a reply), ``in_flight``."""
        return self._runtime.peer_links()

    @property
    def paths(self) -> Paths:
        """What NAT traversal uses of this node's connections (:class:`~iac.node.Paths`)."""
        return self._paths

    def count_short_broadcast(self) -> None:
        """A role of this node (the registry) saw a broadcast miss agents it knows: counted in
        ``stats().routing["short"]``."""
        self._runtime.counters.broadcasts_short += 1

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Call ``observer``'s hooks as messages move (:class:`~iac.node.observe.Observer`);
        returns a function that removes it again."""
        return self._runtime.observers.add(observer)

    @property
    def exposed(self) -> list[str]:
        return sorted(self._dispatch.exposed)

    def connected(self, peer: str) -> bool:
        return self._peers.table.get(peer) is not None

    def connection(self, peer: str) -> Connection | None:
        """The live connection to ``peer``, or None."""
        return self._peers.table.get(peer)

    def stats(self) -> NodeStats:
        return self._runtime.stats(self.nat_stats() if self.nat_stats is not None else {})

    # --- registration -----------------------------------------------------------------------------

    def add_peer(self, agent_id: str, *urls: str) -> None:
        """Add addresses for a peer (tried in order by the fallback dialer)."""
        self._peers.add(agent_id, *urls)
        import_transports(urls)

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

    def on(self, msg_type: MessageType | int | str, *, replace: bool = False) -> Callable[[F], F]:
        """Register the handler of a message type: ``@node.on(MessageType.DELEGATE_TASK)`` or
        ``@node.on("DELEGATE_TASK")``.

        The handler takes a :class:`Context` (sync or async, or an async generator that streams
        its answer: :meth:`stream`); its return value (JSON) is the REPLY;
        :class:`~iac.HandlerError` becomes that ERROR code, any other exception ``internal``.
        A second handler for a type raises :class:`~iac.ConfigError` unless ``replace=True``.
        """
        mt = message_type(msg_type)
        self._dispatch.check_handled_type(mt)

        def register(func: F) -> F:
            self._dispatch.on(mt, func, replace=replace)
            return func

        return register

    @overload
    def expose(
        self, func_or_name: Callable[P, R], *, name: str | None = None, replace: bool = False
    ) -> Callable[P, R]: ...

    @overload
    def expose(
        self, func_or_name: str | None = None, *, name: str | None = None, replace: bool = False
    ) -> Callable[[Callable[P, R]], Callable[P, R]]: ...

    def expose(
        self,
        func_or_name: Callable[..., Any] | str | None = None,
        *,
        name: str | None = None,
        replace: bool = False,
    ) -> Any:
        """Put a function on the remote-call allow-list: ``@node.expose``, ``@node.expose("name")``
        or ``node.expose(func, name="name")``; the function is returned as it is, with its type.
        Nothing else is ever callable by name. A second function under a name raises
        :class:`~iac.ConfigError` unless ``replace=True``."""
        if callable(func_or_name):
            return self._dispatch.expose(func_or_name, name, replace=replace)
        chosen = func_or_name if isinstance(func_or_name, str) else name
        return lambda func: self._dispatch.expose(func, chosen, replace=replace)

    def handler(self, msg_type: MessageType | int | str) -> Handler | None:
        """The handler registered for ``msg_type`` (:meth:`on`), or None."""
        return self._dispatch.handlers.get(message_type(msg_type))

    def on_peer(self, callback: Callable[[PeerEvent], Any]) -> Callable[[], None]:
        """Call ``callback(PeerEvent)`` when a peer comes up or goes down (sync or async).

        Returns a function that removes the callback again."""
        return self._peers.on_peer(callback)

    def on_error(self, callback: ErrorCallback) -> Callable[[], None]:
        """Call ``callback(peer, message, code, text)`` for an ERROR that answers no pending request
        (e.g. a one-way message refused with ``busy``).

        Returns a function that removes the callback again."""
        return subscribe(self._inbound.error_callbacks, callback)

    def on_file(self, callback: Callable[[ReceivedFile], Any]) -> Callable[[], None]:
        """Call ``callback(ReceivedFile)`` (sync or async) when a file was verified and renamed into
        the inbox (``NodeConfig.inbox_dir``).

        Returns a function that removes the callback again."""
        return self._files.on_file(callback)

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
        options: SendOptions | None = None,
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
        ``options``: these settings in one :class:`~iac.SendOptions` (the keywords win).
        """
        self._check_open()
        o = send_options(options, ack=ack, ordered=ordered, sealed=sealed, extra_data=extra_data,
                         via=via, early=early, principal=principal)  # fmt: skip
        mt = message_type(msg_type)
        build: dict[str, Any] = {"payload_json": payload_json, "extra_data": o.extra_data, "task": task}
        build |= {"sealed": o.sealed, "principal": o.principal}
        if o.ack:
            return await self._pending.send_reliable(
                peer, mt, payload, ordered=o.ordered, via=o.via, early=o.early, **build
            )
        kind, flags = ("ordered", FLAG_ORDERED) if o.ordered else ("main", 0)
        msg = self._outbox.build(peer, mt, payload, kind=kind, flags=flags, **build)
        await self._outbox.transmit(peer, msg, o.via, early=o.early)
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
        options: SendOptions | None = None,
    ) -> Reply:
        """Send a request and wait for its REPLY. Raises :class:`~iac.RemoteError` for an ERROR
        answer, :class:`~iac.RequestTimeout` after ``timeout`` (a CANCEL is sent), or a
        :class:`~iac.TransportError`. ``ack=True`` retransmits until the callee answers or
        acknowledges. ``via``: through this relay (see :meth:`send`); the reply comes back the same way.
        ``early=False``: never in 0-RTT early data (see :meth:`send`). ``options``: these settings
        in one :class:`~iac.SendOptions` (the keywords win)."""
        self._runtime.check_open()
        if options is not None:
            o = options.merged(timeout=timeout, ack=ack, sealed=sealed, extra_data=extra_data, via=via,
                               early=early, principal=principal)  # fmt: skip
            timeout, ack, sealed, extra_data = o.timeout, o.ack, o.sealed, o.extra_data
            via, early, principal = o.via, o.early, o.principal
        return await self._pending.request(
            peer, message_type(msg_type), payload,
            timeout=self.config.request_timeout if timeout is None else timeout,
            ack=ack, task=task, via=via, early=early, payload_json=payload_json,
            extra_data=extra_data, sealed=sealed, principal=principal,
        )  # fmt: skip

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
        options: SendOptions | None = None,
    ) -> AsyncGenerator[Reply, None]:
        """A request answered by a sequence of parts: ``async for part in node.stream(peer, "RUN")``.

        The handler is an async generator; each value it yields is a :class:`Reply` here, in order.
        Flow control is end to end: the handler runs at most ``window`` parts ahead of what this
        side took. ``timeout`` bounds the whole stream (default ``request_timeout``),
        ``idle_timeout`` the wait for each part (default: ``timeout``); either raises
        :class:`~iac.RequestTimeout`. An ERROR from the handler raises :class:`~iac.RemoteError`.
        Leaving the loop early (or ``aclose()``, or cancelling) sends CANCEL, which stops the
        handler; use ``contextlib.aclosing(node.stream(...))`` to close at once. ``options``: the
        settings of :meth:`request` in one :class:`~iac.SendOptions` (the keywords win)."""
        self._check_open()
        o = send_options(options, timeout=timeout, sealed=sealed, extra_data=extra_data, via=via,
                         early=early, principal=principal)  # fmt: skip
        timeout = self.config.request_timeout if o.timeout is None else o.timeout
        return self._streams.consume(
            peer,
            message_type(msg_type),
            payload,
            timeout=timeout,
            idle_timeout=timeout if idle_timeout is None else idle_timeout,
            window=window,
            via=o.via,
            early=o.early,
            sealed=o.sealed,
            extra_data=o.extra_data,
            task=task,
            payload_json=payload_json,
            principal=o.principal,
        )

    async def call(
        self,
        peer: str,
        name: str,
        /,
        *args: Any,
        timeout: float | None = None,
        options: SendOptions | None = None,
        **kwargs: Any,
    ) -> Any:
        """Call a function that ``peer`` exposed; return its result (JSON). ``timeout`` and
        ``options`` as for :meth:`request` (a remote keyword argument named ``timeout`` or
        ``options`` goes through :meth:`invoke`)."""
        return await self.invoke(peer, name, args, kwargs, timeout=timeout, options=options)

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
        options: SendOptions | None = None,
    ) -> Any:
        """:meth:`call` with the arguments as values, a timeout and options (as for :meth:`request`)."""
        payload = {"name": name, "args": list(args), "kwargs": dict(kwargs or {})}
        o = send_options(options, timeout=timeout, sealed=sealed, ack=ack, via=via)
        reply = await self.request(peer, _COMMAND, payload, options=o)
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
        options: SendOptions | None = None,
    ) -> Reply:
        """Hand a task to ``peer`` (DELEGATE_TASK). If it does not answer in time (or cannot be
        reached, or is ``busy``), try the fallback agent(s) in order. ``options`` as for
        :meth:`request`."""
        o = send_options(options, timeout=timeout, sealed=sealed, ack=ack, via=via)
        if not isinstance(task, TaskState):
            raise ConfigError(
                "delegate() takes the task envelope as iac.TaskState(task_id=..., intent=..., step=..., "
                f"steps=...), not {type(task).__name__}; the payload is the third argument"
            )
        targets = [peer, *([fallback] if isinstance(fallback, str) else list(fallback or ()))]
        for i, target in enumerate(targets):
            last = i == len(targets) - 1
            try:
                return await self.request(target, _DELEGATE_TASK, payload, task=task, options=o)
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
        text = payload_text(payload, payload_json)
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
