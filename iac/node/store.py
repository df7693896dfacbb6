"""The replay step's store calls, off the event loop when the store blocks.

An in-memory store answers in microseconds and runs on the loop. A SQLite store (an fsync per
transaction with ``synchronous=FULL``) or a Redis store (a network round trip) would stall every
peer if called on the loop for each message: their calls go to one worker thread, in order, a
batch of checks at a time. A store that fails (:class:`~iac.errors.StoreUnavailable`) fails only
the calls that hit it; the node counts and answers them, and the next call tries the store again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from iac.errors import IacError, StoreUnavailable, WorkerFailed
from iac.node.types import Key
from iac.protocol.replay import ReplayGuard, Verdict
from iac.stores.memory import MemoryReplayStore

log = logging.getLogger("iac.node")


@dataclass(frozen=True, slots=True)
class Check:
    """One replay check: ``mark`` (a response: single-phase) or reserve (two-phase)."""

    key: Key
    mark: bool


class StoreRunner:
    """Runs a node's replay-store calls: on the loop for a memory store, else on one thread."""

    def __init__(self, guard: ReplayGuard) -> None:
        self.guard = guard
        store = guard.store
        self.blocking = not isinstance(store, MemoryReplayStore) and getattr(store, "blocking", True)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Store calls that failed (commits and releases included).
        self.failures = 0

    async def check(self, checks: Sequence[Check], now: int) -> list[Verdict | IacError]:
        """The verdict of each check, in order; a failed call gives its typed error in its place."""
        if not self.blocking:
            return self._check_all(checks, now)
        verdicts: list[Verdict | IacError] = await self._run(self._check_all, checks, now)
        return verdicts

    def commit(self, key: Key, now: int) -> None:
        self._call(self.guard.store.commit, *key, now)

    def release(self, key: Key, now: int) -> None:
        self._call(self.guard.store.release, *key, now)

    def expire(self, now: int) -> None:
        self._call(self.guard.expire, now)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # --- internals --------------------------------------------------------------------------------

    def _check_all(self, checks: Sequence[Check], now: int) -> list[Verdict | IacError]:
        out: list[Verdict | IacError] = []
        store = self.guard.store
        for c in checks:
            sender, session_id, msg_id = c.key
            try:
                verdict = (store.check_and_mark if c.mark else store.reserve)(sender, session_id, msg_id, now)
            except IacError as exc:  # StoreUnavailable, ReplayStoreFull: typed by the store
                if isinstance(exc, StoreUnavailable):
                    self.failures += 1
                out.append(exc)
                continue
            out.append(verdict)
        return out

    def _call(self, fn: Any, *args: Any) -> None:
        """A call whose result nobody waits for (commit, release, expire), in order."""
        if not self.blocking:
            try:
                fn(*args)
            except StoreUnavailable as exc:
                self._failed(exc)
            return
        with contextlib.suppress(RuntimeError):  # closed: nothing more reaches the store
            self._pool_or_new().submit(self._quietly, fn, *args)

    def _quietly(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except StoreUnavailable as exc:
            self._failed(exc)

    def _failed(self, exc: StoreUnavailable) -> None:
        self.failures += 1
        log.warning("replay store: %s", exc)

    def _pool_or_new(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="iac-store")
        return self._pool

    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            job = asyncio.get_running_loop().run_in_executor(self._pool_or_new(), fn, *args)
        except (RuntimeError, concurrent.futures.BrokenExecutor) as exc:
            raise WorkerFailed(f"the replay-store worker cannot take work: {exc}") from exc
        return await job


__all__ = ["Check", "StoreRunner"]
