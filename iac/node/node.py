"""The embeddable node: one object an agent framework runs in its asyncio process.

A :class:`Node` listens, dials peers from its peer book, and runs every
received message through the receive pipeline (SPEC section 5) before anything
wakes agent code::

    signature → freshness and replay → addressed to me → topology policy →
    unseal and inner-header check → schema (type, JSON, task envelope, deadline) →
    content guards → reorder (ORDERED) → handler

Each refusal is counted by reason (:class:`~iac.node.config.Refusal`) and
answered with ERROR when the sender is authenticated — never for ERROR, ACK,
REPLY, replays or duplicates.

Conventions this node keeps on the wire:

* A message **expects a reply** exactly when its ``deadline`` is set (a reply is
  useful until then): ``request``/``call``/``delegate`` always set one, ``send``
  never does. Handlers of one-way messages still run; their return value is
  dropped.
* Toward each peer the node keeps up to three sessions, so that ordered streams
  have contiguous msg_ids: one for unordered traffic (requests, one-way
  messages, answers), one for ORDERED + ACK_REQUESTED messages, one for ORDERED
  messages without acknowledgement. Sessions survive reconnects.
* An ACK_REQUESTED message is acknowledged (ACK, or the REPLY/ERROR of a request)
  once its handler finished; until then the sender retransmits it (same ids,
  fresh timestamp, signed again) with exponential backoff and after every
  reconnect, up to ``delivery_timeout``. The receiver's replay store is
  two-phase: an id is reserved when it passes the replay check and committed
  once handled, so a retransmission is answered again (the ACK, or the cached
  REPLY) and never handled twice.

Relays, broadcast and files (docs/PROTOCOL.md section 11):

* A FORWARD frame goes to the sans-IO :class:`~iac.protocol.routing.Router` first (the
  origin's signature, hop limit, loop, path, seen-cache, ``NodeConfig.relay_policy``);
  the node sends on what it returns and runs a delivered inner message through
  the pipeline above from step 2, with the origin as sender (the impersonation
  check binds MESSAGE frames only; for a Forward the path check binds the
  neighbour). Answers to a relayed message follow the learned reverse route.
  A unicast Forward that crossed no relay is refused (``forward_not_relayed``).
* ``send``/``request(..., via=relay)`` or a route (:meth:`Node.add_route`) wrap
  the signed message in FORWARD when the destination is not connected.
* :meth:`Node.broadcast` floods a message with an empty ``to``; broadcasts are
  delivered once per node and never answered.
* FILE_TRANSFER messages are the node's own: :meth:`Node.send_file` drives a
  :class:`~iac.protocol.files.FileSender`; chunks are written by a
  :class:`~iac.protocol.files.FileReceiver` into ``NodeConfig.inbox_dir`` (in a
  worker thread, one chunk at a time, in each connection's order). Without an
  inbox a chunk is refused with ERROR ``no_handler``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import os
import types
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from types import TracebackType
from typing import Any, TypeAlias, TypeVar

from google.protobuf.message import DecodeError

from iac.errors import (
    CloseCode,
    ConfigError,
    ConnectionClosed,
    FileTransferError,
    IacError,
    LocalError,
    RemoteError,
    ReplayStoreFull,
    SealHeaderMismatch,
    StaleMessage,
    TransportError,
)
from iac.node.config import (
    DeliveryError,
    ErrorCode,
    HandlerError,
    NodeConfig,
    NodeStats,
    PeerEvent,
    Refusal,
    RequestTimeout,
)
from iac.node.types import (
    Context,
    FileSent,
    Key,
    ReceivedFile,
    Reply,
    Sent,
    _Counters,
    _dumps,
    _error_fields,
    _error_payload,
    _FileOut,
    _Item,
    _Ordered,
    _Out,
)
from iac.protocol.clock import Clock
from iac.protocol.files import (
    AckPayload,
    ChunkHeader,
    FileReceiver,
    FileSender,
    TooManyTransfers,
    TransferProgress,
    failure_ack,
    new_transfer_id,
    parse_payload,
)
from iac.protocol.guards import (
    RESPONSE_TYPES,
    TokenBucket,
    check_call,
    check_deadline,
    check_task,
    check_type,
    decode_payload,
    run_guards,
)
from iac.protocol.reorder import Delivered, Duplicate, GapSkipped, Late, ReorderBuffer, ReorderConfig
from iac.protocol.replay import MemoryReplayStore, ReplayConfig, ReplayGuard, ReplayStore, Verdict
from iac.protocol.routing import Router, RouteRefusal, parse_forward
from iac.transport import dial as transport_dial
from iac.transport import listen as transport_listen
from iac.transport.base import Address, Connection, ConnectionTable, Incoming, Listener, TransportConfig
from iac.transport.dialer import Dialer
from iac.wire._pb.iac_pb2 import Message, MessageType, TaskState
from iac.wire.frames import FrameType, encode_frame
from iac.wire.identity import Identity, check_agent_id, check_agent_id_cached
from iac.wire.message import FLAG_ACK_REQUESTED, FLAG_ORDERED, Session, build_message, sender_of, sign_message
from iac.wire.seal import open_sealed, seal_payload

log = logging.getLogger("iac.node")

Handler: TypeAlias = Callable[["Context"], Any]
F = TypeVar("F", bound=Callable[..., Any])

_MAIN, _ORDERED_ACK, _ORDERED = "main", "ordered_ack", "ordered"
_BROADCAST, _FILE = "broadcast", "file"
#: Forward bodies larger than this are sent without trying zstd (file chunks do not compress).
_COMPRESS_LIMIT = 64 * 1024
#: ERROR codes that end a file transfer (others refuse one chunk, which is sent again).
_FILE_RETRY_CODES = frozenset({ErrorCode.BUSY.value, ErrorCode.BAD_REQUEST.value, ErrorCode.TIMEOUT.value})
_MAX_FILE_MSGS = 65_536
# Message types as plain ints: the protobuf enum wrapper's attribute lookup costs on every message.
_REPLY = int(MessageType.REPLY)
_ERROR = int(MessageType.ERROR)
_ACK = int(MessageType.ACK)
_CANCEL = int(MessageType.CANCEL)
_COMMAND = int(MessageType.COMMAND)
_FILE_TRANSFER = int(MessageType.FILE_TRANSFER)
_DELEGATE_TASK = int(MessageType.DELEGATE_TASK)
_MESSAGE_FRAME = FrameType.MESSAGE
_FORWARD_FRAME = FrameType.FORWARD


class Node:
    """An IAC agent endpoint: identity, listeners, peer book, handlers, the receive pipeline.

    Use as ``async with Node(identity, listen=["tls://127.0.0.1:0"]) as node: ...``
    (or :meth:`start` / :meth:`close`).
    """

    def __init__(
        self,
        identity: Identity | None = None,
        *,
        listen: Sequence[str] = (),
        config: NodeConfig | None = None,
        replay_store: ReplayStore | None = None,
        clock: Clock | None = None,
        peers: dict[str, Sequence[str]] | None = None,
    ) -> None:
        config = config if config is not None else NodeConfig()
        if clock is not None:
            config = dataclasses.replace(config, transport=dataclasses.replace(config.transport, clock=clock))
        self.identity = identity if identity is not None else Identity.generate()
        self.config = config
        self.clock: Clock = config.transport.clock
        self._listen_urls = list(listen)
        self._replay_store_arg = replay_store
        self._guard: ReplayGuard | None = None
        self.addresses: list[str] = []
        self._listeners: list[Listener] = []
        self._peers: dict[str, list[str]] = {}
        for aid, urls in (peers or {}).items():
            self.add_peer(aid, *urls)
        self._handlers: dict[int, Handler] = {MessageType.PING: lambda ctx: None}
        self._async_funcs: dict[Callable[..., Any], bool] = {}
        self._exposed: dict[str, Callable[..., Any]] = {}
        self._table = ConnectionTable(self.identity.agent_id)
        self._dial_locks: dict[str, asyncio.Lock] = {}
        self._dialer: Dialer | None = None
        self._sessions: dict[tuple[str, str], Session] = {}
        self._outs: dict[Key, _Out] = {}
        self._outs_by_peer: dict[str, dict[Key, _Out]] = {}
        self._in_flight: dict[str, asyncio.Semaphore] = {}
        self._answers: OrderedDict[Key, Message] = OrderedDict()
        self._running: dict[Key, asyncio.Task[None]] = {}
        self._cancel_requested: set[Key] = set()
        self._per_peer: Counter[str] = Counter()
        self._ordered: dict[tuple[str, int], _Ordered] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._conn_tasks: set[asyncio.Task[Any]] = set()
        self._slots: asyncio.Semaphore | None = None
        self._n_running = 0
        self._n_waiting = 0
        self._n_ordered_queued = 0
        self._peer_callbacks: list[Callable[[PeerEvent], Any]] = []
        self._event_queues: list[asyncio.Queue[PeerEvent | None]] = []
        self._error_callbacks: list[Callable[[str, Message, str, str], Any]] = []
        self._live_peers: set[str] = set()
        self._c = _Counters()
        self._started = False
        self._draining = False
        self._closing = False
        self._closed = False
        self._housekeeping: asyncio.Task[None] | None = None
        # relays and broadcast
        self._router = Router(
            self.identity.agent_id,
            config.relay_policy,
            max_skew_us=config.transport.max_skew_us,
            max_seen=config.max_seen,
            max_routes=config.max_routes,
            broadcast_hop_limit=config.broadcast_hop_limit,
            unicast_hop_limit=config.unicast_hop_limit,
        )
        self._static_routes: dict[str, str] = {}
        self._relay_dials: set[str] = set()
        # file transfer
        self._receiver: FileReceiver | None = None
        self._file_lock = asyncio.Lock()
        self._file_job: asyncio.Future[Any] | None = None
        self._file_outs: dict[tuple[str, str], _FileOut] = {}
        self._file_msgs: OrderedDict[Key, tuple[str, str]] = OrderedDict()
        self._file_callbacks: list[Callable[[ReceivedFile], Any]] = []

    # --- lifecycle --------------------------------------------------------------------------------

    @property
    def agent_id(self) -> str:
        return self.identity.agent_id

    async def start(self) -> None:
        """Open the replay store and the listeners."""
        if self._started:
            return
        self._started = True
        c = self.config
        store = self._replay_store_arg
        if store is None:
            store = MemoryReplayStore(
                self.clock.now_us(),
                ReplayConfig(c.replay_window, c.transport.max_skew_us, c.max_sessions),
            )
        if store.max_skew_us != c.transport.max_skew_us:
            raise ConfigError("the replay store's max_skew_us differs from the node's transport.max_skew_us")
        self._guard = ReplayGuard(store)
        self._slots = asyncio.Semaphore(c.max_handlers)
        if c.inbox_dir is not None:
            self._receiver = FileReceiver(
                c.inbox_dir,
                max_size=c.max_file_size,
                max_frame_size=c.transport.max_frame_size,
                max_transfers=c.max_transfers,
                overwrite=c.overwrite_files,
                durable=c.durable_files,
            )
        try:
            for url in self._listen_urls:
                lst = await transport_listen(url, self.identity, self._on_connection, config=c.transport)
                self._listeners.append(lst)
                self.addresses.extend(lst.addresses)
        except BaseException:
            await self.close()
            raise
        self._dialer = Dialer(self.identity, self._transport_config(), dial_fn=self._dial_one)
        self._housekeeping = self._spawn(self._housekeep())

    def _transport_config(self) -> TransportConfig:
        if self.addresses and not self.config.transport.listen_addrs:
            return dataclasses.replace(self.config.transport, listen_addrs=tuple(self.addresses))
        return self.config.transport

    async def close(self) -> None:
        """Drain and close: stop accepting, let in-flight handlers and unacknowledged messages
        finish (up to ``drain_timeout``), then GOAWAY every connection."""
        if self._closing:
            return
        self._closing = True
        self._draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_timeout
        while loop.time() < deadline and (self._running or self._n_waiting or self._n_ordered_queued):
            await asyncio.sleep(0.01)
        while loop.time() < deadline and any(o.reliable and not o.future.done() for o in self._outs.values()):
            await asyncio.sleep(0.01)
        self._closed = True
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        for task in list(self._tasks):
            task.cancel()
        for out in list(self._outs.values()):
            self._finish_out(out, exc=ConnectionClosed("node closed"))
        for st in self._ordered.values():
            if st.timer is not None:
                st.timer.cancel()
        conns = self._table.connections()
        await asyncio.gather(
            *(conn.close(CloseCode.GOING_AWAY, "node shutting down") for conn in conns),
            return_exceptions=True,
        )
        await asyncio.gather(*(lst.close() for lst in self._listeners), return_exceptions=True)
        for task in list(self._conn_tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, *self._conn_tasks, return_exceptions=True)
        if self._file_job is not None:
            await asyncio.wait([self._file_job])
        if self._receiver is not None:
            self._receiver.close()
        for q in self._event_queues:
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait(None)

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<Node {self.agent_id[:16]}… {self.addresses}>"

    # --- registration -----------------------------------------------------------------------------

    def add_peer(self, agent_id: str, *urls: str) -> None:
        """Add addresses for a peer (tried in order by the fallback dialer)."""
        check_agent_id(agent_id)
        from iac.transport.base import parse_address

        for url in urls:
            parse_address(url)
        known = self._peers.setdefault(agent_id, [])
        known.extend(u for u in urls if u not in known)

    def add_route(self, dest: str, via: str) -> None:
        """Reach ``dest`` through the relay ``via`` (a static route: never replaced by a learned one).

        A message to ``dest`` goes inside FORWARD to ``via`` whenever this node has no connection to
        ``dest`` itself (``via`` is dialed from the peer book if needed). The relay must be configured to
        relay (``RelayPolicy(relay_unicast=True)``); the reply comes back the same way.
        """
        check_agent_id(dest)
        check_agent_id(via)
        if dest == via or dest == self.agent_id:
            raise ConfigError("a route leads to another node through a third one")
        self._static_routes[dest] = via
        self._router.add_route(dest, via)

    def remove_route(self, dest: str) -> None:
        self._static_routes.pop(dest, None)
        self._router.remove_route(dest)

    @property
    def routes(self) -> dict[str, str]:
        """The static routes (``dest -> via``), a copy."""
        return dict(self._static_routes)

    async def connect(self, peer: str) -> None:
        """Dial ``peer`` now (from the peer book) unless already connected."""
        self._check_open()
        await self._connect(peer)

    def on_file(self, callback: Callable[[ReceivedFile], Any]) -> None:
        """Call ``callback(ReceivedFile)`` (sync or async) when a file was verified and renamed into
        the inbox (``NodeConfig.inbox_dir``)."""
        self._file_callbacks.append(callback)

    def on(self, msg_type: int) -> Callable[[F], F]:
        """Register the handler of a message type: ``@node.on(MessageType.DELEGATE_TASK)``.

        The handler takes a :class:`Context` (sync or async); its return value (JSON) is the
        REPLY; :class:`HandlerError` becomes that ERROR code, any other exception ``internal``.
        """
        if msg_type in RESPONSE_TYPES or msg_type == _CANCEL:
            raise ConfigError("REPLY, ERROR, ACK and CANCEL are handled by the node itself")
        if msg_type == _COMMAND:
            raise ConfigError("COMMAND carries remote calls: register functions with node.expose()")
        if msg_type == _FILE_TRANSFER:
            raise ConfigError("FILE_TRANSFER is handled by the node: use send_file(), inbox_dir, on_file()")

        def register(func: F) -> F:
            self._handlers[int(msg_type)] = func
            return func

        return register

    def expose(self, func_or_name: Callable[..., Any] | str | None = None, *, name: str | None = None) -> Any:
        """Put a function on the remote-call allow-list: ``@node.expose``, ``@node.expose("name")``
        or ``node.expose(func, name="name")``. Nothing else is ever callable by name."""

        def register(func: Callable[..., Any], as_name: str | None) -> Callable[..., Any]:
            call_name = as_name or getattr(func, "__name__", None)
            if not isinstance(call_name, str) or not call_name:
                raise ConfigError("an exposed function needs a name")
            self._exposed[call_name] = func
            return func

        if callable(func_or_name):
            return register(func_or_name, name)
        chosen = func_or_name if isinstance(func_or_name, str) else name
        return lambda func: register(func, chosen)

    def on_peer(self, callback: Callable[[PeerEvent], Any]) -> Callable[[], None]:
        """Call ``callback(PeerEvent)`` when a peer comes up or goes down (sync or async).

        Returns a function that removes the callback again."""
        self._peer_callbacks.append(callback)

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._peer_callbacks.remove(callback)

        return remove

    def handler(self, msg_type: int) -> Handler | None:
        """The handler registered for ``msg_type`` (:meth:`on`), or None."""
        return self._handlers.get(int(msg_type))

    def on_error(self, callback: Callable[[str, Message, str, str], Any]) -> None:
        """Call ``callback(peer, message, code, text)`` for an ERROR that answers no pending request
        (e.g. a one-way message refused with ``busy``)."""
        self._error_callbacks.append(callback)

    async def peer_events(self) -> AsyncIterator[PeerEvent]:
        """Peer up/down events as an async iterator (ends when the node closes)."""
        q: asyncio.Queue[PeerEvent | None] = asyncio.Queue(self.config.event_queue)
        self._event_queues.append(q)
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    return
                yield ev
        finally:
            self._event_queues.remove(q)

    # --- sending ----------------------------------------------------------------------------------

    def _session(self, peer: str, kind: str = _MAIN) -> Session:
        s = self._sessions.get((peer, kind))
        if s is None:
            s = self._sessions[(peer, kind)] = Session()
        return s

    def _build(
        self,
        peer: str,
        msg_type: int,
        payload: Any,
        *,
        kind: str = _MAIN,
        payload_json: str | None = None,
        extra_data: bytes = b"",
        flags: int = 0,
        task: TaskState | None = None,
        deadline_us: int = 0,
        reply_to: int = 0,
        reply_session_id: int = 0,
        sealed: bool = False,
    ) -> Message:
        check_agent_id_cached(peer)
        text = payload_json if payload_json is not None else ("" if payload is None else _dumps(payload))
        msg = build_message(
            sender=self.agent_id,
            to=peer,
            msg_type=msg_type,
            session=self._session(peer, kind),
            timestamp_us=self.clock.now_us(),
            payload_json=text,
            extra_data=extra_data,
            flags=flags,
            task=task,
            deadline_us=deadline_us,
            reply_to=reply_to,
            reply_session_id=reply_session_id,
        )
        if sealed:
            self._seal_message(msg)
        return msg

    def _seal_message(self, msg: Message) -> None:
        text, extra = msg.payload_json, msg.extra_data
        msg.payload_json = ""
        msg.extra_data = b""
        seal_payload(self.identity, msg, msg.to, text, extra)

    async def send(
        self,
        peer: str,
        msg_type: int,
        payload: Any = None,
        *,
        ack: bool = False,
        ordered: bool = False,
        sealed: bool = False,
        extra_data: bytes = b"",
        task: TaskState | None = None,
        payload_json: str | None = None,
        via: str | None = None,
    ) -> Sent:
        """Send a one-way message. ``payload`` is any JSON value (or pass ``payload_json``).

        ``ack=True`` (ACK_REQUESTED): retransmitted until acknowledged; waits while
        ``max_in_flight`` messages to this peer are unacknowledged; ``await sent.wait()``
        for the ACK. ``ordered=True`` (ORDERED): delivered in order per session.
        ``via``: send it inside FORWARD through this relay (else: directly when connected, then
        a route of :meth:`add_route` or a learned reverse route, then the peer book).
        """
        self._check_open()
        flags = (FLAG_ACK_REQUESTED if ack else 0) | (FLAG_ORDERED if ordered else 0)
        kind = (_ORDERED_ACK if ack else _ORDERED) if ordered else _MAIN
        if not ack:
            msg = self._build(peer, msg_type, payload, kind=kind, payload_json=payload_json,
                              extra_data=extra_data, flags=flags, task=task, sealed=sealed)  # fmt: skip
            await self._transmit(peer, msg, via)
            return Sent(peer, msg.session_id, msg.msg_id, None)
        sem = self._sem(peer)
        await sem.acquire()
        try:
            msg = self._build(peer, msg_type, payload, kind=kind, payload_json=payload_json,
                              extra_data=extra_data, flags=flags, task=task, sealed=sealed)  # fmt: skip
            out = self._track(peer, msg, reliable=True, is_request=False, via=via)
        except BaseException:
            sem.release()
            raise
        out.future.add_done_callback(lambda _f: sem.release())
        await self._first_send(out)
        return Sent(peer, msg.session_id, msg.msg_id, out.future)

    async def request(
        self,
        peer: str,
        msg_type: int,
        payload: Any = None,
        *,
        timeout: float | None = None,
        ack: bool = False,
        sealed: bool = False,
        extra_data: bytes = b"",
        task: TaskState | None = None,
        payload_json: str | None = None,
        via: str | None = None,
    ) -> Reply:
        """Send a request and wait for its REPLY. Raises :class:`~iac.RemoteError` for an ERROR
        answer, :class:`RequestTimeout` after ``timeout`` (a CANCEL is sent), or a
        :class:`~iac.TransportError`. ``ack=True`` retransmits until the callee answers or
        acknowledges. ``via``: through this relay (see :meth:`send`); the reply comes back the same way."""
        self._check_open()
        timeout = self.config.request_timeout if timeout is None else timeout
        if timeout <= 0:
            raise ConfigError("timeout must be positive")
        sem = self._sem(peer)
        loop = asyncio.get_running_loop()
        start = loop.time()
        if sem.locked():
            try:
                await asyncio.wait_for(sem.acquire(), timeout)
            except TimeoutError:
                raise RequestTimeout(
                    f"{peer[:16]}…: {self.config.max_in_flight} requests in flight"
                ) from None
        else:
            await sem.acquire()  # a free permit: taken without waiting (no task, no timer)
        out: _Out | None = None
        timer: asyncio.TimerHandle | None = None
        try:
            left = max(0.001, timeout - (loop.time() - start))
            msg = self._build(
                peer, msg_type, payload, payload_json=payload_json, extra_data=extra_data,
                flags=FLAG_ACK_REQUESTED if ack else 0, task=task, sealed=sealed,
                deadline_us=self.clock.now_us() + int(left * 1e6),
            )  # fmt: skip
            out = self._track(peer, msg, reliable=ack, is_request=True, via=via)
            await self._first_send(out)
            # One timer instead of wait_for(shield(...)): on expiry it fails the future with _Expired.
            # A cancelled caller cancels the future itself; the out stays tracked until `finally`,
            # which is how the handler below tells "not answered yet" (send CANCEL) from answered.
            if not out.future.done():
                timer = loop.call_later(left, _expire, out.future)
            result: Reply = await out.future
            return result
        except (_Expired, TimeoutError):
            if out is not None:
                self._spawn(self._send_cancel(out))
            raise RequestTimeout(f"no answer from {peer[:16]}… within {timeout:g} s") from None
        except asyncio.CancelledError:
            if out is not None and self._outs.get(out.key) is out:
                self._spawn(self._send_cancel(out))
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if out is not None:
                self._finish_out(out, exc=asyncio.CancelledError())
            sem.release()

    async def call(self, peer: str, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call a function that ``peer`` exposed; return its result (JSON)."""
        return await self.invoke(peer, name, args, kwargs)

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
        targets = [peer, *([fallback] if isinstance(fallback, str) else list(fallback or ()))]
        last: BaseException | None = None
        for i, target in enumerate(targets):
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
                if exc.code not in (ErrorCode.BUSY, ErrorCode.TIMEOUT) or i == len(targets) - 1:
                    raise
                last = exc
            except TransportError as exc:  # includes RequestTimeout and DialError
                if i == len(targets) - 1:
                    raise
                last = exc
            log.info("delegation to %s… failed (%s); trying the fallback", target[:16], last)
        raise AssertionError("unreachable")  # pragma: no cover

    # --- broadcast ------------------------------------------------------------------------------

    async def broadcast(
        self,
        msg_type: int = MessageType.BROADCAST,
        payload: Any = None,
        *,
        payload_json: str | None = None,
        extra_data: bytes = b"",
        hop_limit: int | None = None,
    ) -> Sent:
        """Flood a message (empty ``to``) to every connected peer, inside FORWARD with a hop limit
        (``NodeConfig.broadcast_hop_limit``). Every node that gets it hands it to its handler for
        ``msg_type`` once and sends it on to its own peers (relay policy permitting); this node does
        not deliver it to itself. Broadcasts are never answered. Returns the ids it went out with
        (``sent.peer`` is empty)."""
        self._check_open()
        if msg_type in RESPONSE_TYPES or msg_type == _CANCEL:
            raise ConfigError("REPLY, ERROR, ACK and CANCEL cannot be broadcast")
        text = payload_json if payload_json is not None else ("" if payload is None else _dumps(payload))
        now = self.clock.now_us()
        msg = build_message(
            sender=self.agent_id,
            to="",
            msg_type=msg_type,
            session=self._session("", _BROADCAST),
            timestamp_us=now,
            payload_json=text,
            extra_data=extra_data,
        )
        body = sign_message(self.identity, msg)
        conns = {c.peer.agent_id: c for c in self._table.connections()}
        sends = self._router.originate_broadcast(body, conns, now, hop_limit)
        await self._send_all(conns, sends)
        self._c.sent += 1
        return Sent("", msg.session_id, msg.msg_id, None)

    async def _send_all(self, conns: dict[str, Connection], sends: Sequence[Any]) -> None:
        """Send Forwards to several peers at once (one slow peer does not hold up the others)."""
        jobs = [self._send_forward(conns[s.peer], s.data) for s in sends if s.peer in conns]
        if len(jobs) == 1:
            with contextlib.suppress(IacError, OSError):
                await jobs[0]
            return
        for res in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(res, BaseException) and not isinstance(res, (IacError, OSError)):
                raise res

    # --- file transfer --------------------------------------------------------------------------

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
        :class:`RequestTimeout`. A refusal raises :class:`~iac.TransferRefused` (a ``failed`` ack:
        ``code`` is the receiver's error name, e.g. ``file_exists``) or :class:`~iac.RemoteError`
        (an ERROR such as ``no_handler`` from a node without an inbox).
        """
        self._check_open()
        check_agent_id(peer)
        c = self.config
        stall = c.request_timeout if timeout is None else timeout
        if stall <= 0:
            raise ConfigError("timeout must be positive")
        loop = asyncio.get_running_loop()
        started = loop.time()
        conn = await self._first_hop(peer, via)
        _, limit = self._frame_params(conn)
        sender = await asyncio.to_thread(
            FileSender,
            new_transfer_id(),
            path,
            name=name,
            chunk_size=chunk_size if chunk_size is not None else c.file_chunk_size,
            max_frame_size=limit,
            window=window if window is not None else c.file_window,
            retransmit_timeout=c.file_retransmit_timeout,
            on_progress=on_progress,
        )
        fkey = (peer, sender.transfer_id)
        st = _FileOut(peer, sender, max_events=4 * sender.window + 16)
        self._file_outs[fkey] = st
        try:
            resumed = await self._drive_file(st, conn, via, stall)
        except BaseException:
            self._c.files_failed += 1
            raise
        finally:
            self._file_outs.pop(fkey, None)
            for k in [k for k, v in self._file_msgs.items() if v == fkey]:
                del self._file_msgs[k]
            sender.close()
        self._c.files_sent += 1
        return FileSent(
            peer=peer,
            transfer_id=sender.transfer_id,
            name=sender.name,
            size=sender.size,
            sha256=sender.sha256,
            chunks=sender.total,
            chunks_sent=sender.stats.chunks_sent,
            chunks_resent=sender.stats.chunks_resent,
            resumed=resumed,
            seconds=loop.time() - started,
        )

    async def _drive_file(self, st: _FileOut, conn: Connection, via: str | None, stall: float) -> int:
        """The send loop of one transfer: window, acks, timeouts, reconnect and resume."""
        loop = asyncio.get_running_loop()
        sender, peer = st.sender, st.peer
        fkey = (peer, sender.transfer_id)
        resumed = 0
        need_query = False  # after a reconnect: ask the receiver what it holds before sending more
        queried_at: float | None = None
        last_progress = loop.time()
        done_before = sender.progress.chunks_done
        closed: asyncio.Future[None] = asyncio.ensure_future(conn.wait_closed())
        try:
            while not sender.done:
                if self._closed:
                    raise ConnectionClosed("the node is closed")
                if closed.done():
                    sender.connection_lost()
                    st.events.clear()
                    conn = await self._redial(peer, via, last_progress + stall)
                    closed = asyncio.ensure_future(conn.wait_closed())
                    resumed += 1
                    self._c.files_resumed += 1
                    need_query, queried_at = True, None
                now = loop.time()
                try:
                    if need_query:
                        if queried_at is None or now - queried_at >= sender.retransmit_timeout:
                            query = self._build(peer, _FILE_TRANSFER, None, kind=_FILE,
                                                payload_json=sender.query_json())  # fmt: skip
                            self._note_file_msg(query, fkey)
                            queried_at = now
                            await self._send_on(conn, query)
                    else:
                        for chunk in sender.next_chunks(now):
                            msg = self._build(
                                peer,
                                _FILE_TRANSFER,
                                None,
                                kind=_FILE,
                                payload_json=chunk.payload_json,
                                extra_data=chunk.data,
                            )
                            self._note_file_msg(msg, fkey)
                            await self._send_on(conn, msg, compress=False)
                except (TransportError, OSError) as exc:
                    log.debug("file transfer to %s…: send failed (%s)", peer[:16], exc)
                    await asyncio.wait([closed], timeout=self.config.transport.handshake_timeout)
                    if not closed.done():
                        raise
                    continue
                # Wait for an ack or ERROR, a retransmission timer, the connection closing, or a stall.
                timer = sender.next_timer() if not need_query else None
                if need_query and queried_at is not None:
                    timer = queried_at + sender.retransmit_timeout
                wake_at = last_progress + stall if timer is None else min(timer, last_progress + stall)
                if not st.events:
                    st.waiter = loop.create_future()
                    await asyncio.wait([st.waiter, closed], timeout=max(0.0, wake_at - loop.time()),
                                       return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                    st.waiter = None
                while st.events:
                    ev = st.events.popleft()
                    if isinstance(ev, RemoteError):
                        if ev.code in _FILE_RETRY_CODES:
                            log.debug("file transfer to %s…: refused once (%s)", peer[:16], ev)
                            continue
                        raise ev
                    if need_query:  # the receiver's state: continue from exactly what it holds
                        sender.resume_from(ev)  # a failed ack raises TransferRefused
                        need_query, queried_at = False, None
                        last_progress = loop.time()
                    else:
                        sender.on_ack(ev)
                now = loop.time()
                if sender.progress.chunks_done != done_before:
                    done_before = sender.progress.chunks_done
                    last_progress = now
                if not need_query:
                    timer = sender.next_timer()
                    if timer is not None and timer <= now:
                        sender.on_timeout(now)
                if now >= last_progress + stall and not sender.done:
                    raise RequestTimeout(f"file transfer to {peer[:16]}…: no progress for {stall:g} s")
        finally:
            closed.cancel()
        return resumed

    async def _redial(self, peer: str, via: str | None, deadline: float) -> Connection:
        """Reach ``peer`` (or the relay) again after a broken connection, retrying until ``deadline``."""
        loop = asyncio.get_running_loop()
        delay = 0.05
        while True:
            try:
                return await self._first_hop(peer, via)
            except (TransportError, OSError) as exc:
                if self._closed or loop.time() + delay >= deadline:
                    raise
                log.debug("file transfer to %s…: redial failed (%s)", peer[:16], exc)
            await asyncio.sleep(delay)  # back off between dial attempts
            delay = min(1.0, delay * 2)

    def _note_file_msg(self, msg: Message, fkey: tuple[str, str]) -> None:
        """Remember which transfer a chunk message belongs to (an ERROR answering it ends up there)."""
        self._file_msgs[(msg.to, msg.session_id, msg.msg_id)] = fkey
        while len(self._file_msgs) > _MAX_FILE_MSGS:
            self._file_msgs.popitem(last=False)

    def _check_open(self) -> None:
        if not self._started:
            raise LocalError("the node is not started (use `async with node:` or `await node.start()`)")
        if self._closed:
            raise ConnectionClosed("the node is closed")

    def _sem(self, peer: str) -> asyncio.Semaphore:
        sem = self._in_flight.get(peer)
        if sem is None:
            sem = self._in_flight[peer] = asyncio.Semaphore(self.config.max_in_flight)
        return sem

    def _track(
        self, peer: str, msg: Message, *, reliable: bool, is_request: bool, via: str | None = None
    ) -> _Out:
        loop = asyncio.get_running_loop()
        out = _Out(
            peer,
            msg,
            reliable=reliable,
            is_request=is_request,
            give_up_at=loop.time() + self.config.delivery_timeout,
            rto=self.config.retransmit_initial,
            future=loop.create_future(),
            via=via,
        )
        self._outs[out.key] = out
        self._outs_by_peer.setdefault(peer, {})[out.key] = out
        return out

    def _finish_out(self, out: _Out, result: Any = None, exc: BaseException | None = None) -> None:
        if out.timer is not None:
            out.timer.cancel()
            out.timer = None
        self._outs.pop(out.key, None)
        by_peer = self._outs_by_peer.get(out.peer)
        if by_peer is not None:
            by_peer.pop(out.key, None)
            if not by_peer:
                del self._outs_by_peer[out.peer]
        if not out.future.done():
            if isinstance(exc, asyncio.CancelledError):
                out.future.cancel()
            elif exc is not None:
                out.future.set_exception(exc)
                out.future.exception()  # mark retrieved: nobody may be waiting
            else:
                out.future.set_result(result)

    async def _first_send(self, out: _Out) -> None:
        try:
            await self._transmit(out.peer, out.msg, out.via)
        except (TransportError, OSError) as exc:
            if not out.reliable:
                self._finish_out(out, exc=exc)
                raise
            log.debug("send to %s… failed (%s); will retransmit", out.peer[:16], exc)
        if out.reliable and out.key in self._outs:
            self._arm(out)

    def _arm(self, out: _Out) -> None:
        if out.timer is not None:
            out.timer.cancel()
        loop = asyncio.get_running_loop()
        out.timer = loop.call_later(out.rto, self._on_rto, out)

    def _on_rto(self, out: _Out) -> None:
        out.timer = None
        if out.key not in self._outs or out.acked:
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= out.give_up_at:
            self._c.delivery_failures += 1
            self._finish_out(
                out,
                exc=DeliveryError(
                    f"message {out.msg.msg_id} to {out.peer[:16]}… not acknowledged within "
                    f"{self.config.delivery_timeout:g} s"
                ),
            )
            return
        out.rto = min(out.rto * 2, self.config.retransmit_max)
        self._spawn(self._retransmit(out))

    async def _retransmit(self, out: _Out) -> None:
        if out.key not in self._outs or out.acked:
            return
        self._c.retransmits += 1
        try:
            await self._transmit(out.peer, out.msg, out.via)
        except (TransportError, OSError) as exc:
            log.debug("retransmit to %s… failed: %s", out.peer[:16], exc)
        if out.key in self._outs and not out.acked:
            self._arm(out)

    async def _send_cancel(self, out: _Out) -> None:
        with contextlib.suppress(IacError, OSError):
            if out.via is None and self._table.get(out.peer) is None and self._route_hop(out.peer) is None:
                return
            msg = self._build(out.peer, _CANCEL, None, reply_to=out.msg.msg_id,
                              reply_session_id=out.msg.session_id)  # fmt: skip
            await self._transmit(out.peer, msg, out.via)

    async def _transmit(
        self, peer: str, msg: Message, via: str | None = None, *, compress: bool = True
    ) -> None:
        """Sign (fresh timestamp) and send toward ``peer``: inside FORWARD through ``via`` when given;
        else on the peer's connection; else through a route's next hop; else dial the peer."""
        await self._send_on(await self._first_hop(peer, via), msg, compress=compress)

    async def _first_hop(self, peer: str, via: str | None = None) -> Connection:
        """The connection a message to ``peer`` leaves on (dialing the peer or the relay if needed)."""
        if via is not None and via != peer:
            return await self._connect(via)
        conn = self._table.get(peer)
        if conn is not None:
            return conn
        hop = self._route_hop(peer)
        if hop is not None:
            return await self._connect(hop)
        return await self._connect(peer)

    def _route_hop(self, dest: str) -> str | None:
        """The relay toward ``dest`` when it is not connected: a connected next hop from the route
        table (static or learned), else the static route's relay (to be dialed)."""
        hop = self._router.next_hop(dest, self._peer_ids(), self.clock.now_us())
        if hop is not None and hop != dest:
            return hop
        return self._static_routes.get(dest)

    def _peer_ids(self) -> set[str]:
        return {c.peer.agent_id for c in self._table.connections()}

    async def _send_on(self, conn: Connection, msg: Message, *, compress: bool = True) -> None:
        """A MESSAGE frame when ``conn`` leads to ``msg.to`` itself, else a FORWARD through it."""
        if conn.peer.agent_id == msg.to:
            await self._transmit_on(conn, msg, compress=compress)
        else:
            await self._forward_on(conn, msg)

    async def _send_to(self, to: str, msg: Message, hint: Connection | None = None) -> None:
        """Send an answer: on ``hint`` when it is the connection to ``to``, else the usual way."""
        conn = self._table.get(to)
        if conn is None and hint is not None and hint.peer.agent_id == to and not hint.closed:
            conn = hint
        if conn is not None:
            await self._transmit_on(conn, msg)
        else:
            await self._transmit(to, msg)

    def _frame_params(self, conn: Connection) -> tuple[Any, int]:
        hello = conn.peer.hello
        # The dictionary this side pushed once the peer acknowledged it, else the first one
        # the peer listed in its HELLO.
        dictionary = conn.send_dictionary or self.config.transport.dictionaries.choose(hello.dict_ids)
        return dictionary, min(self.config.transport.max_frame_size, hello.max_frame_size or 1 << 30)

    async def _transmit_on(self, conn: Connection, msg: Message, *, compress: bool = True) -> None:
        msg.timestamp = self.clock.now_us()
        body = sign_message(self.identity, msg)
        dictionary, limit = self._frame_params(conn)
        frame = encode_frame(
            _MESSAGE_FRAME, body, compress_with=dictionary if compress else None, max_frame_size=limit
        )
        await conn.send(frame)
        self._c.sent += 1
        self._c.bytes_sent += len(frame)

    async def _forward_on(self, conn: Connection, msg: Message) -> None:
        """Sign ``msg`` and send it inside a FORWARD to the relay at the other end of ``conn``."""
        now = self.clock.now_us()
        msg.timestamp = now
        body = sign_message(self.identity, msg)
        relay = conn.peer.agent_id
        send = self._router.originate(body, (relay,), now, via=relay)
        await self._send_forward(conn, send.data)
        self._c.sent += 1

    async def _send_forward(self, conn: Connection, data: bytes) -> None:
        dictionary, limit = self._frame_params(conn)
        frame = encode_frame(
            FrameType.FORWARD,
            data,
            compress_with=dictionary if len(data) <= _COMPRESS_LIMIT else None,
            max_frame_size=limit,
        )
        await conn.send(frame)
        self._c.bytes_sent += len(frame)

    async def _connect(self, peer: str) -> Connection:
        conn = self._table.get(peer)
        if conn is not None:
            return conn
        lock = self._dial_locks.setdefault(peer, asyncio.Lock())
        async with lock:
            conn = self._table.get(peer)
            if conn is not None:
                return conn
            if self._closed:
                raise ConnectionClosed("the node is closed")
            urls = self._peers.get(peer)
            if not urls:
                raise TransportError(f"no connection to {peer[:16]}… and no address for it in the peer book")
            if self._dialer is None:
                raise LocalError("the node is not started")
            return self._register(await self._dialer.dial(urls, expect=peer))

    async def _dial_one(
        self, addr: Address, identity: Identity, expect: str | None, config: TransportConfig
    ) -> Connection:
        sid = self._session(expect).session_id if expect else 0
        return await transport_dial(addr, identity, expect=expect, config=config, session_id=sid)

    # --- connections ------------------------------------------------------------------------------

    async def _on_connection(self, conn: Connection) -> None:
        if self._draining:
            await conn.close(CloseCode.GOING_AWAY, "node is draining")
            return
        self._register(conn, spawn_reader=False)
        await self._read_loop(conn)

    def _register(self, conn: Connection, *, spawn_reader: bool = True) -> Connection:
        peer = conn.peer.agent_id
        kept, to_close = self._table.add(conn)
        if spawn_reader:
            task = asyncio.get_running_loop().create_task(self._read_loop(conn))
            self._conn_tasks.add(task)
            task.add_done_callback(self._conn_tasks.discard)
        if to_close is not None:
            self._spawn(to_close.close(CloseCode.GOING_AWAY, "duplicate connection"))
        if peer not in self._live_peers:
            self._live_peers.add(peer)
            self._emit(PeerEvent(peer, True, kept.peer.transport, kept.peer.address))
        if kept is conn:  # a (re)connection: resend what is unacknowledged at once
            for out in list(self._outs_by_peer.get(peer, {}).values()):
                if out.reliable and not out.acked and out.timer is not None:
                    out.timer.cancel()
                    out.timer = None
                    self._spawn(self._retransmit(out))
        return kept

    async def _read_loop(self, conn: Connection) -> None:
        peer = conn.peer.agent_id
        try:
            while True:
                inc = await conn.recv()
                await self._throttle(peer, 1.0)
                await self._on_incoming(conn, inc)
        except (IacError, OSError):
            pass
        finally:
            self._table.remove(conn)
            if self._table.get(peer) is None and peer in self._live_peers:
                self._live_peers.discard(peer)
                self._emit(PeerEvent(peer, False, conn.peer.transport, conn.peer.address))

    async def _throttle(self, peer: str, cost: float) -> None:
        bucket = self._buckets.get(peer)
        now = self.clock.monotonic()
        if bucket is None:
            bucket = self._buckets[peer] = TokenBucket(self.config.verify_rate, self.config.verify_burst, now)
        wait = bucket.take(cost, now)
        if wait > 0:
            self._c.throttled += 1
            await asyncio.sleep(wait)

    def _emit(self, event: PeerEvent) -> None:
        for cb in self._peer_callbacks:
            try:
                res = cb(event)
                if inspect.isawaitable(res):
                    self._spawn(_await(res))
            except Exception:
                log.exception("peer event callback failed")
        for q in self._event_queues:
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
                self._c.peer_events_dropped += 1
            q.put_nowait(event)

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- the receive pipeline ---------------------------------------------------------------------

    async def _on_incoming(self, conn: Connection, inc: Incoming) -> None:
        self._c.received += 1
        self._c.bytes_received += inc.frame.wire_size or len(inc.frame.body)
        msg = inc.message
        if msg is None:
            if inc.rejected is not None:  # 1. signature (verified by the transport)
                await self._on_bad_signature(conn, inc)
            elif inc.frame.type == _FORWARD_FRAME:
                await self._on_forward(conn, inc.frame.body)
            return
        await self._pipeline(conn, msg)

    async def _on_forward(self, conn: Connection, body: bytes, *, retry: bool = True) -> None:
        """A FORWARD frame: the Router checks it (origin's signature, hop limit, loop, path, seen-cache,
        policy); this node sends on what it says and runs a delivered message through the pipeline."""
        from_peer = conn.peer.agent_id
        conns = {c.peer.agent_id: c for c in self._table.connections()}
        dec = self._router.on_forward(body, from_peer, conns, self.clock.now_us())
        if dec.refusal is RouteRefusal.BAD_SIGNATURE:
            await self._throttle(from_peer, self.config.bad_signature_cost)
        elif dec.refusal is RouteRefusal.NO_ROUTE and retry:
            self._relay_after_dial(conn, body)
        if dec.refusal is not None and dec.refusal is not RouteRefusal.DUPLICATE:
            log.debug("FORWARD from %s… refused: %s (%s)", from_peer[:16], dec.refusal.value, dec.error)
        if dec.sends:
            self._c.relayed += len(dec.sends)
            await self._send_all(conns, dec.sends)
        msg = dec.message
        if msg is None:
            return
        if msg.to and dec.origin == from_peer and len(dec.path) == 1:
            # Nothing was relayed: the neighbour's own message to this node belongs in a MESSAGE frame.
            self._c.refused[Refusal.FORWARD_NOT_RELAYED.value] += 1
            return
        await self._pipeline(conn, msg, forwarded=True)

    def _relay_after_dial(self, conn: Connection, body: bytes) -> None:
        """A unicast to relay toward a peer this node knows but is not connected to: dial it, then
        decide again (the Router refused it before entering it in the seen-cache)."""
        policy = self.config.relay_policy
        if not policy.relay_unicast:
            return
        try:
            inner = Message.FromString(parse_forward(body).message)
        except (IacError, DecodeError):
            return
        to = inner.to
        if not to or to not in self._peers or to in self._relay_dials or len(self._relay_dials) >= 64:
            return
        self._relay_dials.add(to)

        async def dial_then_relay() -> None:
            try:
                await self._connect(to)
            except (IacError, OSError) as exc:
                log.debug("relay: could not dial %s…: %s", to[:16], exc)
                return
            finally:
                self._relay_dials.discard(to)
            self._router.stats.refused[RouteRefusal.NO_ROUTE] -= 1  # counted again if it fails again
            await self._on_forward(conn, body, retry=False)

        self._spawn(dial_then_relay())

    async def _on_bad_signature(self, conn: Connection, inc: Incoming) -> None:
        self._c.refused[Refusal.BAD_SIGNATURE.value] += 1
        await self._throttle(conn.peer.agent_id, self.config.bad_signature_cost)
        try:
            claimed = Message.FromString(inc.frame.body)
        except DecodeError:
            return
        if claimed.msg_type in RESPONSE_TYPES:
            return
        # The connection's HELLO proved who sent the frame: answer that peer.
        await self._send_error(
            conn, conn.peer.agent_id, claimed, ErrorCode.BAD_SIGNATURE, "signature does not verify"
        )

    async def _refuse(
        self, conn: Connection, msg: Message, reason: Refusal, detail: str, *, answer: bool = True
    ) -> None:
        self._c.refused[reason.value] += 1
        log.debug("refused %s from %s…: %s", reason.value, sender_of(msg)[:16], detail)
        code = reason.code
        if answer and code is not None and msg.msg_type not in RESPONSE_TYPES:
            await self._send_error(conn, sender_of(msg), msg, code, detail)

    async def _send_error(self, conn: Connection, to: str, req: Message, code: str, detail: str) -> None:
        code = code.value if isinstance(code, ErrorCode) else code
        try:
            err = self._build(to, _ERROR, None, payload_json=_error_payload(code, detail),
                              reply_to=req.msg_id, reply_session_id=req.session_id)  # fmt: skip
            await self._send_to(to, err, conn)
            self._c.errors_sent[code] += 1
        except (IacError, OSError) as exc:
            log.debug("could not send ERROR %s to %s…: %s", code, to[:16], exc)

    async def _pipeline(self, conn: Connection, msg: Message, *, forwarded: bool = False) -> None:
        """Steps 2 on (the signature was checked by the transport, or by the Router for a Forward's
        inner message, whose ``from`` is the origin rather than the neighbour)."""
        guard = self._guard
        assert guard is not None
        sender = sender_of(msg)
        mt = int(msg.msg_type)
        is_response = mt in RESPONSE_TYPES
        broadcast = forwarded and not msg.to
        answer = not broadcast
        now = self.clock.now_us()
        key: Key = (sender, msg.session_id, msg.msg_id)
        # 2. freshness and replay (two-phase for what a handler takes)
        try:
            if is_response:
                verdict = guard.check_and_mark(sender, msg.session_id, msg.msg_id, msg.timestamp, now)
            else:
                verdict = guard.reserve(sender, msg.session_id, msg.msg_id, msg.timestamp, now)
        except StaleMessage as exc:
            await self._refuse(conn, msg, Refusal.STALE, f"stale: {exc}", answer=answer)
            return
        except ReplayStoreFull as exc:
            await self._refuse(conn, msg, Refusal.REPLAY_STORE_FULL, str(exc), answer=answer)
            return
        if verdict is not Verdict.NEW:
            await self._on_duplicate(conn, msg, verdict, answer=answer)
            return
        if is_response:
            await self._pipeline_response(conn, msg, now)
            return
        committed = False
        try:
            refusal = self._check(msg, sender, now, broadcast)
            payload: Any = None
            sealed = bool(msg.sealed)
            if refusal is None and sealed:
                msg, refusal = self._unseal(msg)
            if refusal is None:
                payload, refusal = decode_payload(msg.payload_json)
            if refusal is None:
                refusal = self._check_late(msg, sender, payload, now)
            if refusal is not None:
                committed = True
                guard.commit(sender, msg.session_id, msg.msg_id, now)
                self._skip_ordered(msg, now)
                await self._refuse(conn, msg, *refusal, answer=answer)
                return
            committed = True  # from here the handler path commits or releases
            item = _Item(conn, msg, payload, key, sealed, broadcast)
            if mt == _FILE_TRANSFER and not broadcast:
                await self._on_file_message(item)
                return
            if mt == _CANCEL:
                guard.commit(sender, msg.session_id, msg.msg_id, now)
                self._on_cancel(sender, msg)
                return
            if msg.flags & FLAG_ORDERED:
                self._push_ordered(item, now)
            else:
                await self._dispatch(item)
        finally:
            if not committed:
                guard.release(sender, msg.session_id, msg.msg_id, self.clock.now_us())

    def _check(
        self, msg: Message, sender: str, now: int, broadcast: bool = False
    ) -> tuple[Refusal, str] | None:
        # 3. addressed to me (or a broadcast that came inside FORWARD; relays take FORWARD frames only)
        if msg.to != self.agent_id and not broadcast:
            return (
                Refusal.NOT_ADDRESSED,
                "addressed to another agent (or broadcast) in a MESSAGE frame: relays take FORWARD",
            )
        if broadcast and msg.sealed:
            return Refusal.UNSEAL_FAILED, "a broadcast cannot be sealed"
        # 4. topology policy
        topo = self.config.topology
        if topo is not None and not topo.allows(sender, self.agent_id):
            return Refusal.POLICY_DENIED, "topology policy does not allow this sender to reach this node"
        return None

    def _unseal(self, msg: Message) -> tuple[Message, tuple[Refusal, str] | None]:
        """Step 5: open a sealed payload and check its inner header; the opened copy carries the
        clear ``payload_json`` and ``extra_data`` (``sealed`` emptied)."""
        try:
            text, extra = open_sealed(self.identity, msg)
        except SealHeaderMismatch as exc:
            return msg, (Refusal.SEALED_HEADER, str(exc))
        except IacError as exc:
            return msg, (Refusal.UNSEAL_FAILED, str(exc))
        clear = Message()
        clear.CopyFrom(msg)
        clear.sealed = b""
        clear.payload_json = text
        clear.extra_data = extra
        return clear, None

    def _check_late(self, msg: Message, sender: str, payload: Any, now: int) -> tuple[Refusal, str] | None:
        # 6. schema (payload JSON was decoded by the caller)
        c = self.config
        r = (
            check_type(msg, c.allowed_types)
            or check_task(msg, c.delegators, sender)
            or check_deadline(msg, now)
        )
        if r is None and msg.msg_type == _COMMAND:
            r = check_call(payload)
        # 7. content guards
        if r is None and c.guards:
            r = run_guards(c.guards, msg, payload)
        return r

    async def _on_duplicate(
        self, conn: Connection, msg: Message, verdict: Verdict, *, answer: bool = True
    ) -> None:
        if verdict is Verdict.TOO_OLD:
            self._c.refused[Refusal.REPLAYED.value] += 1
            return
        self._c.refused[Refusal.DUPLICATE.value] += 1
        if verdict is Verdict.IN_PROGRESS or msg.msg_type in RESPONSE_TYPES or not answer:
            return  # the first copy's answer is on its way
        key: Key = (sender_of(msg), msg.session_id, msg.msg_id)
        cached = self._answers.get(key)
        with contextlib.suppress(IacError, OSError):
            if cached is not None:
                await self._send_to(key[0], cached, conn)
            elif msg.flags & FLAG_ACK_REQUESTED:
                await self._send_ack(conn, msg)

    async def _pipeline_response(self, conn: Connection, msg: Message, now: int) -> None:
        sender = sender_of(msg)
        if msg.to != self.agent_id:
            self._c.refused[Refusal.NOT_ADDRESSED.value] += 1
            return
        if msg.sealed:
            msg, r = self._unseal(msg)
            if r is not None:
                self._c.refused[r[0].value] += 1
                return
        payload, r = decode_payload(msg.payload_json)
        if r is not None:
            self._c.refused[r[0].value] += 1
            return
        key: Key = (sender, msg.reply_session_id, msg.reply_to)
        out = self._outs.get(key)
        mt = msg.msg_type
        if mt == _ERROR:
            code, text = _error_fields(payload)
            self._c.errors_received[code] += 1
            fkey = self._file_msgs.get(key) if out is None else None
            fout = self._file_outs.get(fkey) if fkey is not None else None
            if out is not None:
                self._finish_out(out, exc=RemoteError(code, text))
            elif fout is not None:
                fout.push(RemoteError(code, text))
            else:
                for cb in self._error_callbacks:
                    with contextlib.suppress(Exception):
                        cb(sender, msg, code, text)
            return
        if out is None:
            if mt == _ACK:
                self._c.acks_received += 1
            else:
                self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            return
        if mt == _ACK:
            self._c.acks_received += 1
            if out.is_request:
                out.acked = True  # keep waiting for the REPLY, stop retransmitting
                if out.timer is not None:
                    out.timer.cancel()
                    out.timer = None
            else:
                self._finish_out(out, None)
            return
        if not out.is_request:
            self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            return
        self._finish_out(out, Reply(msg, payload))

    # --- file transfer: the receiving side, and acks for the sending side -------------------------

    async def _on_file_message(self, item: _Item) -> None:
        """A FILE_TRANSFER message that passed the pipeline's checks: an ack for one of this node's
        transfers, or a chunk / state query for the inbox. Handled here, in the connection's order."""
        msg, origin = item.msg, item.key[0]
        try:
            parsed = parse_payload(msg.payload_json)
        except FileTransferError as exc:
            self._guard_commit(item)
            await self._refuse(item.conn, msg, Refusal.FILE_TRANSFER, f"{exc.name}: {exc}")
            return
        if isinstance(parsed, AckPayload):
            self._guard_commit(item)
            fout = self._file_outs.get((origin, parsed.transfer_id))
            if fout is None:
                self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            else:
                fout.push(parsed)
            return
        rx = self._receiver
        if rx is None:
            self._guard_commit(item)
            await self._refuse(item.conn, msg, Refusal.NO_HANDLER, "this node takes no files (no inbox)")
            return
        completed = rx.stats.completed
        try:
            async with self._file_lock:
                job = asyncio.get_running_loop().run_in_executor(
                    None,
                    functools.partial(
                        rx.on_message,
                        msg.payload_json,
                        msg.extra_data,
                        sender=origin,
                        now=self.clock.monotonic(),
                    ),
                )
                self._file_job = job
                ack = await asyncio.shield(job)
        except FileTransferError as exc:
            self._guard_commit(item)
            self._c.refused[Refusal.FILE_TRANSFER.value] += 1
            if not exc.fatal:  # only this chunk: the sender sends it again after its timeout
                code = ErrorCode.BUSY if isinstance(exc, TooManyTransfers) else ErrorCode.BAD_REQUEST
                await self._send_error(item.conn, origin, msg, code, f"{exc.name}: {exc}")
                return
            ack = failure_ack(exc, parsed.transfer_id)
        except OSError as exc:
            self._guard_commit(item)
            log.warning("file transfer from %s…: %s", origin[:16], exc)
            await self._send_error(item.conn, origin, msg, ErrorCode.INTERNAL, "the receiver cannot write")
            return
        self._guard_commit(item)
        answer = self._build(origin, _FILE_TRANSFER, None, kind=_FILE, payload_json=ack.to_json())
        with contextlib.suppress(IacError, OSError):
            await self._send_to(origin, answer, item.conn)
        if isinstance(parsed, ChunkHeader) and rx.stats.completed > completed:
            self._c.files_received += 1
            got = ReceivedFile(origin, parsed.transfer_id, parsed.name, rx.inbox / parsed.name,
                               parsed.size, parsed.sha256)  # fmt: skip
            for cb in self._file_callbacks:
                try:
                    res = cb(got)
                    if inspect.isawaitable(res):
                        self._spawn(_await(res))
                except Exception:
                    log.exception("file callback failed")

    # --- ordered delivery -------------------------------------------------------------------------

    def _stream(self, msg: Message, now: int) -> _Ordered:
        skey = (sender_of(msg), msg.session_id)
        st = self._ordered.get(skey)
        if st is None:
            reliable = bool(msg.flags & FLAG_ACK_REQUESTED)
            cfg = ReorderConfig(
                max_buffered=self.config.reorder_max_buffered,
                reliable=reliable,
                retransmit_deadline_us=int(self.config.delivery_timeout * 1e6),
            )
            # Sessions start at msg_id 1; a session first seen further on (this node restarted)
            # starts where it is seen.
            first = 1 if msg.msg_id < self.config.reorder_max_buffered else msg.msg_id
            st = self._ordered[skey] = _Ordered(ReorderBuffer(cfg, first_id=first), now)
        st.last_us = now
        return st

    def _push_ordered(self, item: _Item, now: int) -> None:
        st = self._stream(item.msg, now)
        self._apply(st, st.buffer.push(item.msg.msg_id, item, now, item.msg.timestamp))

    def _skip_ordered(self, msg: Message, now: int) -> None:
        if msg.flags & FLAG_ORDERED:
            st = self._stream(msg, now)
            self._apply(st, st.buffer.skip(msg.msg_id, now))

    def _apply(self, st: _Ordered, events: list[Any]) -> None:
        for ev in events:
            if isinstance(ev, Delivered):
                self._enqueue_ordered(st, ev.item)
            elif isinstance(ev, GapSkipped):
                self._c.gaps += 1
                log.info("ordered session: gave up on %d message(s) (%s)", ev.count, ev.reason.value)
            elif isinstance(ev, Late):
                # Behind the delivery point (its gap was given up): handle it out of order, never drop.
                self._c.late += 1
                self._enqueue_ordered(st, ev.item)
            elif isinstance(ev, Duplicate):  # pragma: no cover - the replay store stops these first
                self._c.refused[Refusal.DUPLICATE.value] += 1
                item = ev.item
                self._guard_release(item)
        if st.queue and st.worker is None:
            st.worker = self._spawn(self._ordered_worker(st))
        self._arm_reorder(st)

    def _enqueue_ordered(self, st: _Ordered, item: _Item) -> None:
        if len(st.queue) >= self.config.max_backlog or self._draining:
            self._guard_release(item)
            self._spawn(self._refuse(item.conn, item.msg, Refusal.BUSY, "ordered queue full"))
            return
        st.queue.append(item)
        self._n_ordered_queued += 1

    def _arm_reorder(self, st: _Ordered) -> None:
        at = st.buffer.next_deadline()
        if at is None or at == st.timer_at:
            return
        if st.timer is not None:
            st.timer.cancel()
        delay = max(0.0, (at - self.clock.now_us()) / 1e6)
        st.timer_at = at
        st.timer = asyncio.get_running_loop().call_later(delay, self._on_reorder_timer, st)

    def _on_reorder_timer(self, st: _Ordered) -> None:
        st.timer = None
        st.timer_at = None
        self._apply(st, st.buffer.poll(self.clock.now_us()))

    async def _ordered_worker(self, st: _Ordered) -> None:
        try:
            while st.queue:
                item = st.queue.popleft()
                self._n_ordered_queued -= 1
                self._admit(item)
                await self._run(item, ordered=True)
        finally:
            st.worker = None
            if st.queue and not self._closed:
                st.worker = self._spawn(self._ordered_worker(st))

    # --- handlers ---------------------------------------------------------------------------------

    async def _dispatch(self, item: _Item) -> None:
        """Admit an unordered message to a handler slot, or refuse it with ``busy``."""
        sender = item.key[0]
        c = self.config
        if self._draining or self._n_waiting >= c.max_backlog or self._per_peer[sender] >= c.max_per_peer:
            why = (
                "node is draining"
                if self._draining
                else (
                    "handler backlog full" if self._n_waiting >= c.max_backlog else "per-peer quota reached"
                )
            )
            self._guard_release(item)
            await self._refuse(item.conn, item.msg, Refusal.BUSY, why)
            return
        self._admit(item)
        if self._can_run_inline(item):
            self._run_inline(item)
        else:
            self._spawn(self._run(item, ordered=False))

    def _can_run_inline(self, item: _Item) -> bool:
        """True when the handler is a plain function (run on the event loop) and a slot is free: it
        then runs right here, with no task unless its answer has to wait (see :meth:`_run_inline`)."""
        slots = self._slots
        if self.config.sync_in_thread or slots is None or slots.locked():
            return False
        if item.msg.msg_type == _COMMAND:
            func = self._exposed.get(item.payload["name"])
        else:
            func = self._handlers.get(item.msg.msg_type)
        return func is None or not self._is_async(func)

    def _run_inline(self, item: _Item) -> None:
        """Run :meth:`_run` for a sync handler now, in a copy of the context (as a task would).

        The coroutine runs until it first has to wait — usually never: the handler is a plain function
        and the answer goes into the connection's send queue. If it does wait (a full send queue, a dial,
        a handler that returned an awaitable), the rest continues in a task; for an awaitable result that
        task is registered in ``_running`` before it runs, so a CANCEL reaches it as it would reach
        :meth:`_run`'s own task."""
        ctx = contextvars.copy_context()
        coro = self._run(item, ordered=False, inline=True)
        try:
            yielded = ctx.run(coro.send, None)
        except StopIteration:
            return
        except Exception:  # what a task would have logged as "exception was never retrieved"
            log.exception("handler run for msg_type %d failed", item.msg.msg_type)
            return
        task = asyncio.get_running_loop().create_task(_Continuation(coro, yielded), context=ctx)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if yielded is _TO_TASK:
            self._running[item.key] = task

    def _is_async(self, func: Callable[..., Any]) -> bool:
        try:
            return self._async_funcs[func]
        except KeyError:
            pass
        except TypeError:  # unhashable callable
            return inspect.iscoroutinefunction(func)
        is_async = self._async_funcs[func] = inspect.iscoroutinefunction(func)
        if len(self._async_funcs) > 4096:
            self._async_funcs.clear()
        return is_async

    def _admit(self, item: _Item) -> None:
        """Count a message as waiting for a slot (before its task starts, so bounds hold)."""
        self._per_peer[item.key[0]] += 1
        self._n_waiting += 1
        self._c.backlog_peak = max(self._c.backlog_peak, self._n_waiting)

    def _guard_release(self, item: _Item) -> None:
        assert self._guard is not None
        self._guard.release(item.key[0], item.key[1], item.key[2], self.clock.now_us())

    def _guard_commit(self, item: _Item) -> None:
        assert self._guard is not None
        self._guard.commit(item.key[0], item.key[1], item.key[2], self.clock.now_us())

    async def _run(self, item: _Item, *, ordered: bool, inline: bool = False) -> None:
        """Wait for a slot, then run the handler in its own task (so CANCEL can reach it).

        ``inline``: started by :meth:`_run_inline` (a sync handler, a free slot): not a task yet, so
        not in ``_running`` (a running sync handler cannot be cancelled anyway)."""
        sender = item.key[0]
        assert self._slots is not None
        if not inline:
            task = asyncio.current_task()
            assert task is not None
            self._running[item.key] = task
        acquired = False
        try:
            await self._slots.acquire()
            acquired = True
            self._n_waiting -= 1
            self._n_running += 1
            self._c.running_peak = max(self._c.running_peak, self._n_running)
            await self._handle(item, inline)
        except asyncio.CancelledError:
            if item.key not in self._cancel_requested or self._closed:
                self._guard_release(item)
                raise
            task = asyncio.current_task()
            assert task is not None
            task.uncancel()  # a CANCEL from the caller ends this handler, not the task
            await self._finish_cancelled(item)
        finally:
            if acquired:
                self._n_running -= 1
                self._slots.release()
            else:
                self._n_waiting -= 1
            self._running.pop(item.key, None)
            self._cancel_requested.discard(item.key)
            self._per_peer[sender] -= 1
            if self._per_peer[sender] <= 0:
                del self._per_peer[sender]

    async def _finish_cancelled(self, item: _Item) -> None:
        self._c.cancelled += 1
        self._guard_commit(item)
        if item.msg.deadline or item.msg.flags & FLAG_ACK_REQUESTED:
            await self._answer_error(item, ErrorCode.CANCELLED, "cancelled by the caller")

    def _on_cancel(self, sender: str, msg: Message) -> None:
        key: Key = (sender, msg.reply_session_id, msg.reply_to)
        task = self._running.get(key)
        if task is None:
            self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            return
        self._cancel_requested.add(key)
        task.cancel()

    async def _handle(self, item: _Item, inline: bool = False) -> None:
        msg = item.msg
        now = self.clock.now_us()
        expects_reply = bool(msg.deadline)
        if msg.deadline and msg.deadline <= now:  # not started past its deadline
            self._c.refused[Refusal.DEADLINE_PASSED.value] += 1
            self._guard_commit(item)
            await self._answer_error(item, ErrorCode.TIMEOUT, "deadline passed before the handler started")
            return
        mt = int(msg.msg_type)
        func: Callable[..., Any] | None
        if mt == _COMMAND:
            call = item.payload
            func = self._exposed.get(call["name"])
            if func is None:
                self._c.refused[Refusal.NO_HANDLER.value] += 1
                self._guard_commit(item)
                await self._answer_error(
                    item, ErrorCode.NO_HANDLER, f"no exposed function {call['name'][:100]!r}"
                )
                return
            args, kwargs = call.get("args", []), call.get("kwargs", {})
            try:
                inspect.signature(func).bind(*args, **kwargs)
            except TypeError as exc:
                self._c.refused[Refusal.BAD_CALL.value] += 1
                self._guard_commit(item)
                await self._answer_error(item, ErrorCode.BAD_REQUEST, f"bad arguments: {exc}")
                return
            except ValueError:  # no signature (builtins): let the call decide
                pass
            invoke: Callable[[], Any] = functools.partial(func, *args, **kwargs)
        else:
            handler = self._handlers.get(mt)
            if handler is None:
                self._c.refused[Refusal.NO_HANDLER.value] += 1
                self._guard_commit(item)
                await self._answer_error(item, ErrorCode.NO_HANDLER, f"no handler for msg_type {mt}")
                return
            invoke = functools.partial(handler, Context(self, msg, item.payload, expects_reply))
            func = handler
        try:
            try:
                result = await self._invoke(func, invoke, msg, inline)
            finally:
                self._running.pop(item.key, None)  # a CANCEL from now on is too late
        except HandlerError as exc:
            self._c.handled += 1
            self._guard_commit(item)
            await self._answer_error(item, exc.code, exc.message)
            return
        except TimeoutError:
            self._c.handled += 1
            self._guard_commit(item)
            await self._answer_error(item, ErrorCode.TIMEOUT, "deadline passed while the handler ran")
            return
        except Exception:
            log.exception("handler for msg_type %d failed", mt)
            self._c.handled += 1
            self._guard_commit(item)
            await self._answer_error(item, ErrorCode.INTERNAL, "the handler failed")
            return
        self._c.handled += 1
        self._guard_commit(item)
        if expects_reply:
            try:
                text = _dumps(result)
            except (TypeError, ValueError):
                await self._answer_error(item, ErrorCode.INTERNAL, "the handler's result is not JSON")
                return
            await self._answer(item, _REPLY, text)
        elif msg.flags & FLAG_ACK_REQUESTED:
            await self._send_ack(item.conn, msg)

    async def _invoke(
        self, func: Callable[..., Any], invoke: Callable[[], Any], msg: Message, inline: bool = False
    ) -> Any:
        timeout: float | None = None
        if self.config.enforce_deadline and msg.deadline:
            timeout = max(0.0, (msg.deadline - self.clock.now_us()) / 1e6)
        if self._is_async(func):
            coro = invoke()
        elif self.config.sync_in_thread:
            coro = asyncio.to_thread(invoke)
        else:
            result = invoke()
            if not inspect.isawaitable(result):
                return result
            coro = result
            if inline:  # awaiting needs a task (for CANCEL and the timeout): continue in one
                try:
                    await _to_task()
                except BaseException:  # cancelled before the task ran: the awaitable never will
                    if inspect.iscoroutine(coro):
                        coro.close()
                    raise
        if timeout is None:
            return await coro
        async with asyncio.timeout(timeout):
            return await coro

    async def _answer_error(self, item: _Item, code: str, text: str) -> None:
        msg = item.msg
        if not (msg.deadline or msg.flags & FLAG_ACK_REQUESTED) or item.broadcast:
            return  # nobody waits for an answer to a one-way message without ACK, or to a broadcast
        code = code.value if isinstance(code, ErrorCode) else code
        self._c.errors_sent[code] += 1
        await self._answer(item, _ERROR, _error_payload(code, text))

    async def _answer(self, item: _Item, msg_type: int, payload_json: str) -> None:
        msg = item.msg
        sender = item.key[0]
        if item.broadcast:
            return
        ans = self._build(sender, msg_type, None, payload_json=payload_json, reply_to=msg.msg_id,
                          reply_session_id=msg.session_id, sealed=item.sealed)  # fmt: skip
        if msg_type == _REPLY:
            self._c.replies_sent += 1
        self._answers[item.key] = ans
        while len(self._answers) > self.config.answer_cache:
            self._answers.popitem(last=False)
        with contextlib.suppress(IacError, OSError):
            await self._send_to(sender, ans, item.conn)

    async def _send_ack(self, conn: Connection, msg: Message) -> None:
        sender = sender_of(msg)
        if not msg.to:
            return  # broadcasts are never answered
        ack = self._build(sender, _ACK, None, reply_to=msg.msg_id, reply_session_id=msg.session_id)
        with contextlib.suppress(IacError, OSError):
            await self._send_to(sender, ack, conn)
            self._c.acks_sent += 1

    # --- housekeeping and stats -------------------------------------------------------------------

    async def _housekeep(self) -> None:
        retention = 2 * self.config.transport.max_skew_us
        while True:
            await asyncio.sleep(1.0)
            now = self.clock.now_us()
            if self._guard is not None:
                self._guard.expire(now)
            self._router.expire(now)
            if self._receiver is not None and (self._file_job is None or self._file_job.done()):
                self._receiver.expire(self.clock.monotonic(), self.config.file_idle_timeout)
            for skey, st in list(self._ordered.items()):
                if not len(st.buffer) and not st.queue and st.worker is None and now - st.last_us > retention:
                    del self._ordered[skey]

    def stats(self) -> NodeStats:
        c = self._c
        rs = self._router.stats
        rx = self._receiver
        return NodeStats(
            sent=c.sent,
            received=c.received,
            bytes_sent=c.bytes_sent,
            bytes_received=c.bytes_received,
            handled=c.handled,
            replies_sent=c.replies_sent,
            acks_sent=c.acks_sent,
            acks_received=c.acks_received,
            retransmits=c.retransmits,
            delivery_failures=c.delivery_failures,
            throttled=c.throttled,
            gaps=c.gaps,
            late=c.late,
            cancelled=c.cancelled,
            peer_events_dropped=c.peer_events_dropped,
            refused=dict(c.refused),
            errors_sent=dict(c.errors_sent),
            errors_received=dict(c.errors_received),
            running=self._n_running,
            backlog=self._n_waiting,
            backlog_peak=c.backlog_peak,
            running_peak=c.running_peak,
            ordered_queued=self._n_ordered_queued,
            reorder_held=sum(len(st.buffer) for st in self._ordered.values()),
            pending_requests=sum(1 for o in self._outs.values() if o.is_request),
            unacked=sum(1 for o in self._outs.values() if o.reliable and not o.acked),
            answer_cache=len(self._answers),
            connections=len(self._table.connections()),
            routing={
                "delivered": rs.delivered,
                "forwarded": rs.forwarded,
                "originated": rs.originated,
                "relayed": c.relayed,
                "duplicates": rs.duplicates,
                "flood_ends": rs.flood_ends,
            },
            route_refused={
                str(k): v for k, v in rs.refused.items() if v and k != RouteRefusal.DUPLICATE.value
            },
            files={
                "sent": c.files_sent,
                "received": c.files_received,
                "failed": c.files_failed,
                "resumed": c.files_resumed,
                "chunks_received": rx.stats.chunks if rx is not None else 0,
                "chunk_duplicates": rx.stats.duplicates if rx is not None else 0,
            },
            file_refused=dict(rx.stats.refused) if rx is not None else {},
        )

    @property
    def peers(self) -> dict[str, list[str]]:
        """The peer book (a copy)."""
        return {k: list(v) for k, v in self._peers.items()}

    @property
    def exposed(self) -> list[str]:
        return sorted(self._exposed)

    def connected(self, peer: str) -> bool:
        return self._table.get(peer) is not None


class _Expired(Exception):
    """A request's timer fired before its answer came (becomes :class:`RequestTimeout`)."""


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(_Expired())


#: What :func:`_to_task` yields to :meth:`Node._run_inline`: "continue me in a task now".
_TO_TASK = object()


@types.coroutine
def _to_task() -> Generator[Any, Any, None]:
    yield _TO_TASK


class _Continuation(Coroutine[Any, Any, None]):
    """The rest of a coroutine that began outside any task, for an :class:`asyncio.Task` to drive.

    ``pending`` is what the coroutine yielded last and no task has seen: a future it waits on (the
    task's first step returns it, so the task waits on it), or :data:`_TO_TASK` (the first step just
    goes on). A task cancelled before its first step throws into the coroutine where it stopped,
    cancelling the future it waited on — what a task does when cancelled while waiting."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, None], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def send(self, value: Any) -> Any:
        pending = self._pending
        if pending is not None:
            self._pending = None
            if pending is not _TO_TASK:
                return pending
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        pending = self._pending
        self._pending = None
        if isinstance(pending, asyncio.Future):
            pending.cancel()
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # pragma: no cover - the three-argument form

    def close(self) -> None:
        self._pending = None
        self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:  # pragma: no cover - only a task drives it
        raise TypeError("a _Continuation is driven by a task, not awaited")


async def _await(aw: Awaitable[Any]) -> None:
    try:
        await aw
    except Exception:
        log.exception("peer event callback failed")


__all__ = ["Context", "Node", "Reply", "Sent"]
