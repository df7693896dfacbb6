"""A connection's reader: batches of received frames handed to the application in order, run
right in the transport's receive callback when they can finish there.

:meth:`Connection.serve <iac.transport.base.Connection.serve>` hands every received MESSAGE and
FORWARD frame, in batches, to an application coroutine (``handle(batch) -> bool``), one batch at a
time and in order, until ``handle`` returns False or the connection closes. A plain reader would
wait in a task for the receive queue (:class:`~iac.transport.queues.Inbox`) and, once the
adapter queued frames, wake up a loop turn later: at one request in flight that is one turn per
frame on each end. :class:`Reader` saves it, as Python 3.12's eager tasks do, written for 3.11:

* Its task (the one that called ``serve``) waits while the queue is empty. When the adapter has
  judged frames into the queue (:meth:`Reader.deliver`, at the end of its receive callback) and no
  task is running (the callback came from the loop, not from inside a task), the batch's
  coroutine starts right there, *as* that task (``current_task()`` is the reader's task while it
  runs, so ``asyncio.timeout`` and task-counting code behave as in the task). A batch that
  finishes there costs no task wake-up; its answers are flushed at once.
* A batch that has to wait (a worker, a full send queue, a throttle) is handed to the reader's
  task, which resumes it when what it awaits is done, and goes on with the frames behind it: a
  batch never overtakes an earlier one, and never runs while another is unfinished.
* After a batch, frames still waiting are left to the task (it runs them a loop turn later), so
  that every connection with frames waiting gets its turn, as a reader that yields between
  batches would (one peer's flood does not hold the others up). The budget the batch's frames
  were counted against goes back when the batch is done.
* Nothing runs eagerly from inside a task (the adapter's callbacks can be called from one, as
  when a connection is set up) or inside an eager batch (a handler that closes or writes to its
  connection): then the reader's task is woken as a plain reader's would be.
"""

from __future__ import annotations

import asyncio
import asyncio.tasks
import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from iac.transport.base import BatchHandler
from iac.transport.queues import Inbox

#: The hooks Python's own eager tasks use to make a task current while it runs outside the loop's
#: scheduling (present since 3.7; where they are not, every batch runs in the reader's task).
_enter_task: Callable[[asyncio.AbstractEventLoop, asyncio.Task[Any]], None] | None = getattr(
    asyncio.tasks, "_enter_task", None
)
_leave_task: Callable[[asyncio.AbstractEventLoop, asyncio.Task[Any]], None] | None = getattr(
    asyncio.tasks, "_leave_task", None
)


class _Resume:
    """A batch coroutine started eagerly that suspended on ``waiting`` (a future, or None for a
    bare yield): awaiting this finishes it in the awaiting task. ``throw``: an exception that
    reached the task before it could resume the coroutine (a cancel), thrown into it first."""

    __slots__ = ("coro", "throw", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, bool], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting
        self.throw: BaseException | None = None

    def __await__(self) -> Generator[Any, Any, bool]:
        coro = self.coro
        waiting = self.waiting
        try:
            if self.throw is not None:
                waiting = coro.throw(self.throw)
            elif waiting is None or waiting.done():  # its turn is this one: go on now
                waiting = coro.send(None)
            while True:
                try:
                    sent = yield waiting
                except BaseException as exc:  # a cancel, delivered at the future it awaits
                    waiting = coro.throw(exc)
                else:
                    waiting = coro.send(sent)
        except StopIteration as stop:
            return bool(stop.value)


class Reader:
    """Runs ``handle`` on batches of up to ``limit`` frames from ``inbox`` (see the module
    docstring); ``flush`` writes what a batch queued to send. :meth:`run` is the reader's task;
    the adapter calls :meth:`deliver` once it has judged frames into the inbox."""

    def __init__(self, inbox: Inbox, handle: BatchHandler, limit: int, flush: Callable[[], None]) -> None:
        self.inbox = inbox
        self.handle = handle
        self.limit = limit
        self.flush = flush
        #: A batch runs in the adapter's callback right now: what it sends waits for the
        #: ``flush`` when it stops (read by the adapter's ``send``; kept by the reader).
        self.running = False
        #: A batch is under way (in the callback, handed over, or in the task): what others
        #: send meanwhile is written at the end of the loop turn, as before there was a reader.
        self.busy = False
        self._idle: asyncio.Future[None] | None = None  # the task waits for frames on it
        self._handoff: _Resume | None = None  # an eager batch for the task to finish
        self._stop = False  # an eager batch returned False
        self._raised: BaseException | None = None  # ... or raised this
        self._task: asyncio.Task[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context = contextvars.copy_context()

    async def run(self) -> None:
        """The reader's task: batches until ``handle`` returns False; raises what a batch raises,
        or the close error once the connection closed and every frame was handed out."""
        inbox, handle, limit = self.inbox, self.handle, self.limit
        queue = inbox.queue
        self._loop = loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._context = contextvars.copy_context()
        inbox.reader = self
        try:
            while True:
                if queue or inbox.closed:
                    self.busy = True
                    ok = await handle(inbox.take(limit))  # take raises the close error at the end
                else:
                    self._idle = idle = loop.create_future()
                    try:
                        await idle
                    except BaseException as exc:
                        resume = self._handoff
                        if resume is None:
                            raise
                        resume.throw = exc  # the task was cancelled before it could go on
                    finally:
                        self._idle = None
                    resume, raised = self._handoff, self._raised
                    self._handoff = self._raised = None
                    if raised is not None:
                        raise raised
                    if self._stop:
                        return
                    if resume is None:  # frames (or the close) for this task, or an eager batch done
                        continue
                    ok = await resume
                if not ok:
                    return
                self.flush()  # the batch is done: its answers go, its frames' budget comes back
                inbox.give_back()
                self.busy = False
                if queue:
                    await asyncio.sleep(0)  # let every other connection with frames have its turn
        finally:
            inbox.reader = None
            self.busy = False
            self._idle = self._handoff = self._raised = None

    def wake(self) -> None:
        """Wake the task (frames for it, or the connection closed); not inside an eager batch,
        which looks at the inbox again when it ends."""
        idle = self._idle
        if idle is not None and not self.running and not idle.done():
            idle.set_result(None)

    def deliver(self) -> None:
        """The adapter judged frames into the inbox: run a batch now if the task is idle and no
        task is running (else wake the task); hand it to the task if it has to wait."""
        idle = self._idle
        inbox = self.inbox
        if idle is None or self.running or not inbox.queue or idle.done():
            return
        loop, task = self._loop, self._task
        if _enter_task is None or _leave_task is None or loop is None or task is None:
            idle.set_result(None)  # pragma: no cover - every CPython the project supports has them
            return
        try:
            _enter_task(loop, task)
        except RuntimeError:  # called from inside a task: the reader's own task takes the frames
            idle.set_result(None)
            return
        self.running = self.busy = True
        handed = None
        try:
            coro = self.handle(inbox.take(self.limit))
            handed = _Resume(coro, self._context.run(coro.send, None))
        except StopIteration as stop:
            self._stop = not stop.value
        except BaseException as exc:
            self._raised = exc
        finally:
            _leave_task(loop, task)
            self.running = False
        self.flush()  # what it sent goes now that it stopped (done, or waiting for something)
        if handed is not None:  # it waits: the task finishes it, then takes what is behind it
            self._handoff = handed
        elif self._raised is None and not self._stop:
            inbox.give_back()
            self.busy = False
            if not inbox.queue and not inbox.closed:
                return  # done; the task goes on waiting
        else:
            self.busy = False
        if not idle.done():  # (a cancel of the task cancelled it: the task knows)
            idle.set_result(None)
        if isinstance(self._raised, (KeyboardInterrupt, SystemExit)):
            raise self._raised


__all__ = ["Reader"]
