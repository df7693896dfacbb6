"""The background tasks of one node: spawned, tracked until done, cancelled on close."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

log = logging.getLogger("iac.node")


class TaskSet:
    """Tasks a node started and must not lose: each is kept until it is done (asyncio holds only
    weak references to tasks) and :meth:`cancel_all` ends them on close."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def spawn_logged(self, aw: Awaitable[Any], what: str) -> None:
        """Run a user callback's awaitable; log (never raise) what it raises."""
        self.spawn(_logged(aw, what))

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel_all(self) -> list[asyncio.Task[Any]]:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks


async def _logged(aw: Awaitable[Any], what: str) -> None:
    try:
        await aw
    except Exception:
        log.exception("%s failed", what)


__all__ = ["TaskSet"]
