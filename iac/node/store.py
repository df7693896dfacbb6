"""The replay step's store calls, off the event loop when the store blocks.

An in-memory store answers in microseconds and runs on the loop. A SQLite store (an fsync per
transaction with ``synchronous=FULL``) or a Redis store (a network round trip) would stall every
peer if called on the loop for each message: their calls go to one worker thread, in order, a
batch of checks at a time. A store that fails (:class:`~iac.errors.StoreUnavailable`) fails only
the calls that hit it; the node counts and answers them, and the next call tries the store again.

The runner also knows which ids this node holds (reserved, neither committed nor released): it
renews their leases (:meth:`StoreRunner.renew`, every third of the store's lease) so that a
shared store lets them lapse only when this node died, and it answers IN_PROGRESS for a copy of
one whose lease lapsed all the same (the store stalled), so this node never handles an id twice
at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from iac.errors import IacError, LocalError, StoreUnavailable
from iac.node.types import Item, Key
from iac.protocol.clock import Clock
from iac.protocol.replay import ReplayGuard, ReplayStore, Verdict
from iac.stores.memory import MemoryReplayStore

log = logging.getLogger("iac.node")


class Check(NamedTuple):
    """One replay check: ``mark`` (a response: single-phase) or reserve (two-phase). A plain
    tuple of the same three fields is a check too (the pipeline makes one per message)."""

    key: Key
    mark: bool
    #: The neighbour that delivered it (a FORWARD's relay), when not its sender: its share counts
    #: the session too.
    via: str | None = None


#: What :meth:`StoreRunner.check` takes: ``(key, mark, via)``.
CheckTuple = tuple[Key, bool, "str | None"]


class StoreRunner:
    """Runs a node's replay-store calls: on the loop for a memory store, else on one thread.

    Made with the node; ``guard`` (the store) is given by :meth:`open` when the node starts."""

    def __init__(self, guard: ReplayGuard | None = None) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: Store calls that failed (commits and releases included).
        self.failures = 0
        #: Ids this node reserved and has neither committed nor released, by session: when each
        #: was reserved.
        self._held: dict[tuple[str, int], dict[int, int]] = {}
        self._guard: ReplayGuard | None = None
        #: The guard's store once open (read on every call).
        self._replay: ReplayStore | None = None
        self.blocking = False
        self.lease_us: int | None = None
        self._retention_us = 0
        #: ``(max_skew_us, history_start_us)`` when they never change (the in-memory store): the
        #: pipeline checks freshness with them inline; None: ask the guard for each message.
        self.freshness: tuple[int, int] | None = None
        if guard is not None:
            self.open(guard)

    def open(self, guard: ReplayGuard) -> None:
        """Run the calls of ``guard``'s store from now on."""
        self._guard = guard
        store = self._replay = guard.store
        self.blocking = not isinstance(store, MemoryReplayStore) and getattr(store, "blocking", True)
        #: How long the store's reservations last unless renewed (None: they never lapse).
        self.lease_us = store.reservation_lease_us
        self._retention_us = 2 * store.max_skew_us
        start = store.history_start_us
        if isinstance(store, MemoryReplayStore) and start is not None:
            self.freshness = (store.max_skew_us, start)

    @property
    def started(self) -> bool:
        return self._guard is not None

    @property
    def guard(self) -> ReplayGuard:
        """The replay guard over the store (:class:`~iac.errors.LocalError` before :meth:`open`)."""
        if self._guard is None:
            raise LocalError("the node is not started")
        return self._guard

    async def check(self, checks: Sequence[CheckTuple], now: int) -> list[Verdict | IacError]:
        """The verdict of each check, in order; a failed call gives its typed error in its place."""
        if not self.blocking:
            return self.check_now(checks, now)
        return self._hold(checks, await self._run(self._check_all, checks, now), now)

    def check_now(self, checks: Sequence[CheckTuple], now: int) -> list[Verdict | IacError]:
        """:meth:`check` for a store that does not block (``blocking`` is False): right here,
        with no await (the receive pipeline calls it so for every batch)."""
        verdicts = self._check_all(checks, now)
        return verdicts if self.lease_us is None else self._hold(checks, verdicts, now)

    def _hold(
        self, checks: Sequence[CheckTuple], verdicts: list[Verdict | IacError], now: int
    ) -> list[Verdict | IacError]:
        """Note the ids reserved now as held (their leases are renewed), or answer IN_PROGRESS
        for one already held."""
        if self.lease_us is None:  # reservations that never lapse need no renewal
            return verdicts
        held = self._held
        for i, (key, mark, _) in enumerate(checks):
            if mark or verdicts[i] is not Verdict.NEW:
                continue
            sender, session_id, msg_id = key
            ids = held.setdefault((sender, session_id), {})
            if msg_id in ids:  # its lease lapsed while this node holds it: still in progress here
                verdicts[i] = Verdict.IN_PROGRESS
            else:
                ids[msg_id] = now
        return verdicts

    def commit_item(self, item: Item, now: int) -> None:
        """A delivered message was handled (or refused after delivery): its id is done."""
        if not item.committed:
            item.committed = True
            self.commit(item.key, now)

    def release_item(self, item: Item, now: int) -> None:
        """A delivered message was not handled (busy, closing): a retransmission may try again.
        Nothing once committed."""
        if not item.committed:
            item.committed = True
            self.release(item.key, now)

    def commit(self, key: Key, now: int) -> None:
        if self._held:
            self._unhold(key)
        store = self._replay
        if store is None:
            raise LocalError("the node is not started")
        if self.blocking:
            self._call(store.commit, *key, now)
            return
        try:  # _call's first case, written out (a commit per handled message)
            store.commit(*key, now)
        except StoreUnavailable as exc:
            self._failed(exc)

    def release(self, key: Key, now: int) -> None:
        self._unhold(key)
        self._call(self._open().release, *key, now)

    @property
    def held(self) -> int:
        """How many ids this node holds (reserved, not yet committed or released)."""
        return sum(len(ids) for ids in self._held.values())

    def renew(self, now: int) -> None:
        """Renew the leases of the ids this node holds. One held longer than 2 × max_skew is
        forgotten (every copy of its message is stale by now: nothing to guard)."""
        if not self._held:
            return
        old = now - self._retention_us
        keys: list[Key] = []
        for session, ids in list(self._held.items()):
            for msg_id in [m for m, at in ids.items() if at < old]:
                del ids[msg_id]
            if not ids:
                del self._held[session]
            keys.extend((session[0], session[1], m) for m in ids)
        if keys:
            self._call(self.guard.store.renew, keys, now)

    async def renew_forever(self, clock: Clock) -> None:
        """Renew every third of the store's lease, for as long as the node runs."""
        if self.lease_us is None:
            return
        every = max(self.lease_us / 3e6, 0.001)
        while True:
            await asyncio.sleep(every)
            self.renew(clock.now_us())

    def frontier(self, sender: str, session_id: int, now: int) -> asyncio.Future[int | None]:
        """Where the store says a session stands (:meth:`~iac.protocol.replay.ReplayStore.frontier`,
        this node's reservations aside), asked at once, in order with every store call made
        before; None if the store fails."""
        loop = asyncio.get_running_loop()
        # This node's own reservations in the session (the messages now waiting for the answer).
        mine = frozenset(self._held.get((sender, session_id), ()))
        if self.blocking:
            with contextlib.suppress(RuntimeError, concurrent.futures.BrokenExecutor):
                return loop.run_in_executor(
                    self._pool_or_new(), self._frontier, sender, session_id, now, mine
                )
        fut: asyncio.Future[int | None] = loop.create_future()
        fut.set_result(None if self.blocking else self._frontier(sender, session_id, now, mine))
        return fut

    def expire(self, now: int) -> None:
        self._call(self.guard.expire, now)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # --- internals --------------------------------------------------------------------------------

    def _check_all(self, checks: Sequence[CheckTuple], now: int) -> list[Verdict | IacError]:
        out: list[Verdict | IacError] = []
        store = self._replay
        if store is None:
            raise LocalError("the node is not started")
        for c in checks:
            (sender, session_id, msg_id), mark, via = c
            call = store.check_and_mark if mark else store.reserve
            try:
                if via is None or via == sender:
                    verdict = call(sender, session_id, msg_id, now)
                else:
                    verdict = call(sender, session_id, msg_id, now, via=via)
            except IacError as exc:  # StoreUnavailable, replay_store_full: typed by the store
                if isinstance(exc, StoreUnavailable):
                    self.failures += 1
                out.append(exc)
                continue
            out.append(verdict)
        return out

    def _open(self) -> ReplayStore:
        store = self._replay
        if store is None:
            raise LocalError("the node is not started")
        return store

    def _unhold(self, key: Key) -> None:
        sender, session_id, msg_id = key
        ids = self._held.get((sender, session_id))
        if ids is not None and ids.pop(msg_id, None) is not None and not ids:
            del self._held[(sender, session_id)]

    def _frontier(self, sender: str, session_id: int, now: int, mine: frozenset[int]) -> int | None:
        try:
            return self.guard.store.frontier(sender, session_id, now, mine)
        except IacError as exc:
            if isinstance(exc, StoreUnavailable):
                self._failed(exc)
            return None

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
            raise LocalError(
                f"the replay-store worker cannot take work: {exc}", reason="worker_failed"
            ) from exc
        return await job


__all__ = ["Check", "CheckTuple", "StoreRunner"]
