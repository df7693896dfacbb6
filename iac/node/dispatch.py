"""Handlers: the registry of handlers and exposed functions, handler slots and quotas, running a
handler (inline, in a thread, or in its own task) and answering with its outcome.

A CANCEL or an expired deadline ends a running handler through the ``asyncio.timeout`` scope it
runs in (rescheduled to now), so the task that runs it is never cancelled from outside."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from types import GeneratorType
from typing import Any, TypeAlias

from iac.errors import ConfigError, ErrorCode, HandlerError, Refusal
from iac.node.answers import Answers
from iac.node.fair import FairThreads, HandlerSpeeds, Slots
from iac.node.parts import Parts
from iac.node.streams import StreamOut
from iac.node.types import WANTS_ACK, WANTS_REPLY, Item, Key, dumps
from iac.protocol.guards import RESPONSE_TYPES
from iac.wire._pb.iac_pb2 import Message
from iac.wire.enums import MessageType, type_name
from iac.wire.message import FLAG_STREAM

log = logging.getLogger("iac.node")

Handler: TypeAlias = Callable[[Any], Any]
#: Builds what a handler is called with: ``(message, payload, expects_reply, via) -> Context``.
ContextFactory: TypeAlias = Callable[[Message, Any, bool, str], Any]

#: The context a handler runs in when nothing observes the node.
_UNOBSERVED = contextlib.nullcontext()

_REPLY = int(MessageType.REPLY)
_CANCEL = int(MessageType.CANCEL)
_COMMAND = int(MessageType.COMMAND)
_FILE_TRANSFER = int(MessageType.FILE_TRANSFER)


def _answer_ping(ctx: Any) -> None:
    """The node's own PING handler: an empty REPLY (``node.on("PING")`` replaces it)."""


def _qualname(func: Callable[..., Any]) -> str:
    return str(getattr(func, "__qualname__", None) or repr(func))


class Dispatcher:
    """Runs handlers for delivered messages and answers with their outcome."""

    def __init__(self, parts: Parts, answers: Answers, make_context: ContextFactory) -> None:
        self.config = config = parts.config
        self._answers = answers
        self._c = parts.counters
        self._tasks = parts.tasks
        self._clock = parts.rx_clock
        self._make_context = make_context
        self._observers = parts.observers
        self._store = parts.store
        self.handlers: dict[int, Handler] = {int(MessageType.PING): _answer_ping}
        self.exposed: dict[str, Callable[..., Any]] = {}
        #: What each handler is: 0 a plain function, 1 a coroutine function, 2 an async generator.
        self._kinds: dict[Callable[..., Any], int] = {}
        self.slots = Slots(config.max_handlers)
        #: Admitted messages per sender (waiting or running); a sender with none has no entry.
        self.per_peer: dict[str, int] = {}
        self.waiting = 0
        #: Synchronous handlers' threads (``sync_in_thread``), taken by the peers in turn.
        self.threads = FairThreads(config.handler_threads)
        #: Plain functions that proved quick enough to run on the loop (``adaptive_sync``).
        self.speeds = HandlerSpeeds()
        #: Admitted requests by key (waiting or running), with the timeout scope of a running
        #: handler that a CANCEL ends; keys a CANCEL named.
        self._active: dict[Key, asyncio.Timeout | None] = {}
        self._cancelled: set[Key] = set()
        #: Streams this node produces: the credit each consumer granted.
        self._streams: dict[Key, StreamOut] = {}
        #: Streams ended because their connection is gone (:meth:`link_lost`).
        self._abandoned: set[Key] = set()
        self.draining = False

    # --- registration ---------------------------------------------------------------------------

    def on(self, msg_type: int, func: Handler, *, replace: bool = False) -> None:
        """Register ``func`` for ``msg_type``; a second handler for a type is refused unless
        ``replace`` (the node's own PING answer is replaced without it)."""
        self.check_handled_type(msg_type)
        old = self.handlers.get(int(msg_type))
        if old is not None and old is not _answer_ping and not replace:
            raise ConfigError(
                f"{type_name(int(msg_type))} already has a handler ({_qualname(old)}); "
                "pass replace=True to replace it"
            )
        self.handlers[int(msg_type)] = func

    @staticmethod
    def check_handled_type(msg_type: int) -> None:
        """Refuse the message types the node handles itself."""
        if msg_type in RESPONSE_TYPES or msg_type == _CANCEL:
            raise ConfigError("REPLY, ERROR, ACK and CANCEL are handled by the node itself")
        if msg_type == _COMMAND:
            raise ConfigError("COMMAND carries remote calls: register functions with node.expose()")
        if msg_type == _FILE_TRANSFER:
            raise ConfigError("FILE_TRANSFER is handled by the node: use send_file(), inbox_dir, on_file()")
        if msg_type == MessageType.CREDIT:
            raise ConfigError("CREDIT is a stream's flow control, handled by the node")

    def expose(
        self, func: Callable[..., Any], name: str | None, *, replace: bool = False
    ) -> Callable[..., Any]:
        call_name = name or getattr(func, "__name__", None)
        if not isinstance(call_name, str) or not call_name:
            raise ConfigError("an exposed function needs a name")
        old = self.exposed.get(call_name)
        if old is not None and not replace:
            raise ConfigError(
                f"{call_name!r} is already exposed ({_qualname(old)}); pass replace=True to replace it, "
                "or name=... to expose it under another name"
            )
        self.exposed[call_name] = func
        return func

    # --- admission ------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return self.slots.used

    @property
    def busy(self) -> bool:
        """Handlers are running or waiting (what a draining node waits for)."""
        return self.waiting > 0 or self.slots.used > 0

    async def dispatch(self, item: Item) -> None:
        """An unordered message: run its handler (right here when it is a plain function and a slot
        is free), or refuse it with ``busy``."""
        sender = item.key[0]
        c = self.config
        if self.draining or self.waiting >= c.max_backlog or self.per_peer.get(sender, 0) >= c.max_per_peer:
            why = (
                "node is draining"
                if self.draining
                else ("handler backlog full" if self.waiting >= c.max_backlog else "per-peer quota reached")
            )
            self.commit(item)  # busy is this message's answer: a retransmission gets it again
            await self._answers.refuse(item.conn, item.msg, Refusal.BUSY, why)
            return
        self.admit(item)
        if item.mode == _RUN_LOOP and self.slots.try_take():  # a plain function may run right here
            self.waiting -= 1
            await self._handle(item, inline=True)
        else:
            self._tasks.spawn(self.run(item))

    def admit(self, item: Item) -> None:
        """Count a message as waiting for a slot (before its task starts, so bounds hold), and
        make its handler plan: which function, and how it runs (decided here, once)."""
        sender = item.key[0]
        self.per_peer[sender] = self.per_peer.get(sender, 0) + 1
        self.waiting += 1
        if self.waiting > self._c.backlog_peak:
            self._c.backlog_peak = self.waiting
        if not item.broadcast:
            self._active[item.key] = None
        mt = item.msg_type
        func = self.exposed.get(item.payload["name"]) if mt == _COMMAND else self.handlers.get(mt)
        item.handler = func
        if func is None:  # refused when its turn comes: right here where a plain function would run
            item.mode = _RUN_THREAD if self.config.sync_in_thread else _RUN_LOOP
            return
        try:
            kind = self._kinds[func]
        except (KeyError, TypeError):  # not seen yet, or unhashable
            kind = self._kind(func)
        if item.flags & FLAG_STREAM or kind == _ASYNC_GEN:  # (a stream waits for credit)
            item.mode = _RUN_STREAM
        elif kind == _ASYNC:
            item.mode = _RUN_ASYNC
        elif self.config.sync_in_thread and not self._quick(func):
            item.mode = _RUN_THREAD
        else:
            item.mode = _RUN_LOOP

    async def run(self, item: Item) -> None:
        """Wait for a slot, run the handler, answer. The item was :meth:`admit`-ted."""
        try:
            await self.slots.take(item.key[0])
        except BaseException:
            self.waiting -= 1
            self._done(item)
            self.release(item)
            raise
        self.waiting -= 1
        await self._handle(item)

    def credit(self, sender: str, msg: Message) -> None:
        """A CREDIT for a stream this node produces."""
        out = self._streams.get((sender, msg.reply_session_id, msg.reply_to))
        if out is None:
            self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            return
        out.grant(int(msg.credit))

    async def _produce(self, item: Item, func: Callable[..., Any], invoke: Callable[[], Any]) -> None:
        """Answer a STREAM request: each value the handler yields (an async generator) is a REPLY
        part, sent once the consumer granted credit for it; then END, or ERROR if it failed. A
        plain handler's result is one part. A generator handler asked without STREAM answers its
        first part as the REPLY (then it is closed)."""
        msg = item.msg
        if not item.flags & FLAG_STREAM:

            async def first() -> Any:
                parts = invoke()
                try:
                    async for value in parts:
                        return value
                    return None
                finally:
                    await parts.aclose()

            try:
                result = await self._scoped(item, first())
            except Exception as exc:
                await self._failed(item, exc)
                return
            await self._complete(item, result)
            return
        out = self._streams[item.key] = StreamOut(int(msg.credit), item.conn.peer.agent_id)

        async def send(value: Any) -> None:
            try:
                text = dumps(value)
            except (TypeError, ValueError) as exc:
                # answered as a handler's chosen error: internal, with the reason
                raise HandlerError(
                    ErrorCode.INTERNAL, f"a part of the stream is not JSON: {exc}"[:200]
                ) from None
            await out.wait_for(item.parts + 1)
            await self._answers.part(item, text)

        async def run() -> None:
            if not inspect.isasyncgenfunction(func):
                result = invoke()
                if inspect.isawaitable(result):
                    result = await result
                await send(result)
                return
            parts = invoke()
            try:
                async for value in parts:
                    await send(value)
            finally:
                await parts.aclose()

        try:
            await self._scoped(item, run())
        except TimeoutError:
            if item.key in self._abandoned:  # nobody can take an answer: none is sent
                self._ended(item)
                self._c.cancelled += 1
                self.commit(item)
                log.info("stream to %s… ended: its connection is gone", item.key[0][:16])
                return
            await self._failed(item, TimeoutError())
        except Exception as exc:
            await self._failed(item, exc)
        else:
            self._ended(item)
            self._c.handled += 1
            self.commit(item)
            await self._answers.part(item, "", end=True)
        finally:
            del self._streams[item.key]
            self._abandoned.discard(item.key)

    def stream_links(self) -> set[str]:
        """The neighbours that streams this node produces came through."""
        return {out.link for out in self._streams.values()}

    def link_lost(self, peer: str) -> int:
        """This node has no connection to ``peer`` any more: end the streams whose request came
        through it now (their parts cannot go; the handler's slot is freed), with no answer: the
        handler's timeout scope ends, which wakes a wait for credit too.
        Returns how many."""
        n = 0
        for key, out in self._streams.items():
            if out.link != peer or key in self._abandoned:
                continue
            self._abandoned.add(key)
            self._end_scope(key)
            n += 1
        return n

    def _end_scope(self, key: Key) -> None:
        """End the timeout scope the handler of ``key`` runs in, now (a CANCEL, a lost link). A
        scope already expiring (an earlier CANCEL or its deadline) ends anyway: it is left alone,
        as ``asyncio.Timeout`` refuses to reschedule one that is no longer entered."""
        scope = self._active.get(key)
        if scope is not None and not scope.expired():
            scope.reschedule(asyncio.get_running_loop().time())

    def cancel(self, sender: str, msg: Message) -> None:
        """A CANCEL for a request this node is handling (or holds, waiting for a slot)."""
        key: Key = (sender, msg.reply_session_id, msg.reply_to)
        if key not in self._active:
            self._c.refused[Refusal.UNMATCHED_RESPONSE.value] += 1
            return
        self._cancelled.add(key)
        self._end_scope(key)

    # --- running a handler ----------------------------------------------------------------------

    async def _handle(self, item: Item, *, inline: bool = False) -> None:
        """Run the handler in the slot this item holds, answer, give the slot back. ``inline``: in
        the connection's read loop, which an awaitable returned by a plain function must not hold
        up: a task of its own takes the item over then."""
        if self.slots.used > self._c.running_peak:
            self._c.running_peak = self.slots.used
        handed_over = False
        try:
            handed_over = await self._run_handler(item, inline)
        except BaseException:
            self.release(item)
            raise
        finally:
            if not handed_over:
                self._done(item)

    async def _finish_later(self, item: Item, aw: Awaitable[Any]) -> None:
        """The rest of :meth:`_run_handler` for an awaitable that a plain function returned."""
        try:
            try:
                result = await self._scoped(item, aw)
            except Exception as exc:
                await self._failed(item, exc)
                return
            await self._complete(item, result)
        except BaseException:
            self.release(item)
            raise
        finally:
            self._done(item)

    def _done(self, item: Item) -> None:
        sender = item.key[0]
        n = self.per_peer.get(sender, 0) - 1
        if n > 0:
            self.per_peer[sender] = n
        else:
            self.per_peer.pop(sender, None)
        active = self._active  # (an empty table needs no hash of the key: the usual case here)
        if active and item.key in active:  # not ended yet (a key a CANCEL named is active too)
            self._ended(item)
        if item.slot:
            item.slot = False
            self.slots.give()

    async def _run_handler(self, item: Item, inline: bool) -> bool:
        msg = item.msg
        item.slot = True
        cancelled = self._cancelled
        if cancelled and item.key in cancelled:  # cancelled while it waited for a slot
            self._c.cancelled += 1
            await self._outcome(item, ErrorCode.CANCELLED, "cancelled by the caller")
            return False
        deadline, command = item.deadline, item.msg_type == _COMMAND  # (read once, by the pipeline)
        if deadline and deadline <= self._clock.now_us():  # not started past its deadline
            await self._refused(
                item, Refusal.DEADLINE_PASSED, ErrorCode.TIMEOUT, "deadline passed before the handler started"
            )
            return False
        func = item.handler
        if func is None:
            what = (
                f"no exposed function {item.payload['name'][:100]!r}"
                if command
                else (f"no handler for {type_name(msg.msg_type)}")
            )
            await self._refused(item, Refusal.NO_HANDLER, ErrorCode.NO_HANDLER, what)
            return False
        if command:
            call = item.payload
            args, kwargs = call.get("args", []), call.get("kwargs", {})
            try:
                inspect.signature(func).bind(*args, **kwargs)
            except TypeError as exc:
                await self._refused(item, Refusal.BAD_CALL, ErrorCode.BAD_REQUEST, f"bad arguments: {exc}")
                return False
            except ValueError:  # no signature (builtins): let the call decide
                pass
            invoke: Callable[[], Any] = functools.partial(func, *args, **kwargs)
        else:
            ctx = self._make_context(msg, item.payload, bool(deadline), item.conn.peer.agent_id)
            invoke = functools.partial(func, ctx)
        observed = self._observers.handling(item.key[0], msg) if self._observers.items else _UNOBSERVED
        mode = item.mode
        if mode == _RUN_STREAM:
            with observed:
                await self._produce(item, func, invoke)
            return False
        try:
            with observed:
                if mode == _RUN_ASYNC:
                    result = await self._scoped(item, invoke())
                elif mode == _RUN_THREAD:
                    call = self.speeds.timed(func, invoke) if self.config.adaptive_sync else invoke
                    result = await self._scoped(item, self.threads.run(item.key[0], call))
                else:
                    if self.config.sync_in_thread:  # a quick one: is it still?
                        t0 = time.perf_counter()
                        result = contextvars.copy_context().run(invoke)
                        self.speeds.ran_inline(func, time.perf_counter() - t0)
                    else:
                        result = contextvars.copy_context().run(invoke)
                    # What ``await`` takes (inspect.isawaitable, without the ABC check for a plain
                    # value; a JSON value's own type, the usual result, needs no call at all).
                    if type(result) not in _JSON_TYPES and (
                        hasattr(type(result), "__await__")
                        or (type(result) is GeneratorType and inspect.isawaitable(result))
                    ):
                        if inline:  # its answer has to wait: go on in a task of its own
                            self._tasks.spawn(self._finish_later(item, result))
                            return True
                        result = await self._scoped(item, result)
        except Exception as exc:
            await self._failed(item, exc)
            return False
        await self._complete(item, result)
        return False

    async def _scoped(self, item: Item, aw: Awaitable[Any]) -> Any:
        """Await a handler in an ``asyncio.timeout`` scope that its deadline and a CANCEL end."""
        when: float | None = None
        loop = asyncio.get_running_loop()
        deadline = item.deadline
        if self.config.enforce_deadline and deadline:
            when = loop.time() + max(0.0, (deadline - self._clock.now_us()) / 1e6)
        if item.flags & FLAG_STREAM:  # whatever deadline the consumer asked, a stream is bounded
            cap = loop.time() + self.config.max_stream_time
            when = cap if when is None else min(when, cap)
        key = item.key
        if key in self._cancelled:
            when = loop.time()
        try:
            async with asyncio.timeout_at(when) as scope:
                if key in self._active:
                    self._active[key] = scope
                return await aw
        finally:
            if self._active.get(key) is not None:  # the scope is over: nothing can end it now
                self._active[key] = None

    async def _failed(self, item: Item, exc: Exception) -> None:
        if isinstance(exc, HandlerError):
            await self._outcome(item, exc.code, exc.message)
        elif isinstance(exc, TimeoutError):
            if item.key in self._cancelled:
                self._c.cancelled += 1
                await self._outcome(item, ErrorCode.CANCELLED, "cancelled by the caller")
            else:
                await self._outcome(item, ErrorCode.TIMEOUT, "deadline passed while the handler ran")
        else:
            log.exception("handler for %s failed", type_name(item.msg.msg_type), exc_info=exc,
                          extra={"peer": item.key[0][:16], "msg_type": type_name(item.msg.msg_type),
                                 "msg_id": item.msg.msg_id, "reason": "internal"})  # fmt: skip
            await self._outcome(item, ErrorCode.INTERNAL, "the handler failed")

    async def _complete(self, item: Item, result: Any) -> None:
        self._ended(item)
        self._c.handled += 1
        self.commit(item)
        wants = item.wants
        if wants == WANTS_REPLY:
            try:
                text = dumps(result)
            except (TypeError, ValueError):
                await self._answers.error(item, ErrorCode.INTERNAL, "the handler's result is not JSON")
                return
            await self._answers.answer(item, _REPLY, text)
        elif wants == WANTS_ACK:
            await self._answers.ack(item.conn, item.msg)

    def _ended(self, item: Item) -> None:
        """The handler finished (or never ran): a CANCEL from now on is too late."""
        self._active.pop(item.key, None)
        if self._cancelled:
            self._cancelled.discard(item.key)

    async def _refused(self, item: Item, reason: Refusal, code: ErrorCode, text: str) -> None:
        self._ended(item)
        self._c.refused[reason.value] += 1
        log.info("refused %s from %s…: %s", reason.value, item.key[0][:16], text,
                 extra={"peer": item.key[0][:16], "transport": item.conn.peer.transport,
                        "reason": reason.value, "msg_type": type_name(item.msg.msg_type),
                        "msg_id": item.msg.msg_id})  # fmt: skip
        self.commit(item)
        await self._answers.error(item, code, text)

    async def _outcome(self, item: Item, code: str, text: str) -> None:
        self._ended(item)
        self._c.handled += 1
        self.commit(item)
        await self._answers.error(item, code, text)

    def commit(self, item: Item) -> None:
        """Its id is done, stamped with its batch's time (the store only keeps its clock's
        high-water mark from it)."""
        self._store.commit_item(item, item.received)

    def release(self, item: Item) -> None:
        """The item was not handled (refused as busy, or cancelled by the node closing)."""
        self._store.release_item(item, self._clock.now_us())

    def _quick(self, func: Callable[..., Any] | None) -> bool:
        """A plain function that proved quick enough to run on the loop (``adaptive_sync``)."""
        return func is not None and self.config.adaptive_sync and self.speeds.inline(func)

    def _kind(self, func: Callable[..., Any]) -> int:
        """:data:`_PLAIN`, :data:`_ASYNC` or :data:`_ASYNC_GEN`, remembered per handler."""
        try:
            return self._kinds[func]
        except KeyError:
            pass
        except TypeError:  # unhashable callable
            return _kind_of(func)
        kind = self._kinds[func] = _kind_of(func)
        if len(self._kinds) > 4096:
            self._kinds.clear()
        return kind


_PLAIN, _ASYNC, _ASYNC_GEN = 0, 1, 2
#: The types of JSON values (exactly these: a subclass may be awaitable).
_JSON_TYPES = frozenset((dict, list, str, int, float, bool, type(None)))
#: How an admitted message's handler runs (``Item.mode``): a plain function on the loop (right in
#: the read loop when a slot is free), a plain function on the handler threads, a coroutine
#: function in a task, an async generator or STREAM request in a task that produces its parts.
_RUN_LOOP, _RUN_THREAD, _RUN_ASYNC, _RUN_STREAM = 0, 1, 2, 3


def _kind_of(func: Callable[..., Any]) -> int:
    if inspect.isasyncgenfunction(func):
        return _ASYNC_GEN
    return _ASYNC if inspect.iscoroutinefunction(func) else _PLAIN


__all__ = ["ContextFactory", "Dispatcher", "Handler", "Slots"]
