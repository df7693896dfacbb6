"""The gateway's sharing cores without HTTP: fair shares of the calls toward the agent (a freed slot
goes to the waiting principal with the fewest in flight; a wait ends in Throttled naming the
principal), the repeated-messageId cache (window, entries and bytes per principal, time as an
argument), and the refusal log (one line per interval, with the count)."""

from __future__ import annotations

import asyncio
import logging

import pytest

pytest.importorskip("a2a")

from conftest import run

from iac.errors import ConfigError
from iac.integrations.a2a.tenants import FairShares, GatewayLimits, ReplayCache, Throttled
from iac.integrations.slots import AddressSlots, ByteBudget, RefusalLog


def test_a_freed_slot_goes_to_the_waiting_principal_with_the_fewest_in_flight() -> None:
    async def main() -> None:
        shares = FairShares(total=3, per_principal=2, max_queued=10)
        for p in ("alice", "alice", "bob"):
            await shares.acquire(p, 1)
        assert shares.running == 3 and dict(shares.in_flight) == {"alice": 2, "bob": 1}
        waiting = [asyncio.create_task(shares.acquire(p, 5)) for p in ("alice", "carol")]
        await asyncio.sleep(0)  # both queue: no slot is free
        assert shares.queued == 2
        shares.release("alice")  # alice has 1, carol 0: carol's call gets the slot
        await waiting[1]
        assert not waiting[0].done() and dict(shares.in_flight) == {"alice": 1, "bob": 1, "carol": 1}
        shares.release("bob")
        await waiting[0]
        assert dict(shares.in_flight) == {"alice": 2, "carol": 1} and shares.queued == 0

    run(main())


def test_a_principal_at_its_share_waits_then_is_throttled_by_name() -> None:
    async def main() -> None:
        shares = FairShares(total=10, per_principal=2, max_queued=1)
        await shares.acquire("alice", 1)
        await shares.acquire("alice", 1)
        with pytest.raises(
            Throttled, match=r"principal 'alice' has 2 calls in flight .*its share is 2"
        ) as exc:
            await shares.acquire("alice", 0.01)
        assert (exc.value.principal, exc.value.in_flight) == ("alice", 2)
        await shares.acquire("bob", 0.01)  # another principal is not held up
        blocked = asyncio.create_task(shares.acquire("alice", 5))
        await asyncio.sleep(0)
        with pytest.raises(Throttled):  # the queue is full: refused at once
            await shares.acquire("alice", 5)
        blocked.cancel()  # a cancelled wait leaves the queue
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert shares.queued == 0 and dict(shares.throttled) == {"alice": 2}

    run(main())


def test_the_replay_cache_keeps_answers_per_principal_within_its_window_and_bounds() -> None:
    async def main() -> None:
        cache = ReplayCache(window=600, entries=2, max_bytes=10)
        assert cache.begin("alice", "m1", now=0) is None
        pending = cache.begin("alice", "m1", now=1)  # a repeat while the first runs: it waits
        assert pending is not None and not pending.done.is_set()
        cache.finish("alice", "m1", (200, [], b"first"))
        assert pending.done.is_set() and pending.answer == (200, [], b"first")
        assert cache.begin("bob", "m1", now=2) is None  # per principal
        got = cache.begin("alice", "m1", now=599)
        assert got is not None and got.answer == (200, [], b"first")
        assert cache.begin("alice", "m1", now=601) is None  # the window passed: a new call
        cache.finish("alice", "m1", None)  # it did not run: a repeat may run
        assert cache.begin("alice", "m1", now=602) is None
        cache.finish("alice", "m1", (200, [], b"12345678"))
        assert cache.begin("alice", "m2", now=603) is None
        cache.finish("alice", "m2", (200, [], b"12345"))  # 13 bytes > 10: the oldest goes
        assert cache.begin("alice", "m1", now=604) is None
        assert cache.begin("alice", "m3", now=605) is None  # 3 entries > 2: the oldest goes
        assert cache.begin("alice", "m2", now=606) is None
        cache.finish("alice", "m2", (200, [], None))  # too large to keep: a repeat is told so
        kept = cache.begin("alice", "m2", now=607)
        assert kept is not None and kept.answer == (200, [], None)

    run(main())


def test_slot_and_byte_bounds_and_the_refusal_log(caplog: pytest.LogCaptureFixture) -> None:
    slots = AddressSlots(total=3, per_address=2)
    assert [slots.take("a"), slots.take("a"), slots.take("a"), slots.take("b"), slots.take("c")] == [
        None, None, "per_address", None, "total",
    ]  # fmt: skip
    slots.give("a")
    assert slots.take("c") is None and dict(slots.refused) == {"per_address": 1, "total": 1}
    budget = ByteBudget(total=10, per_client=6)
    assert budget.take("a", 6) is None and budget.take("a", 1) == "per_client"
    assert budget.take("b", 5) == "total" and budget.take("b", 4) is None
    budget.give("a", 6)
    assert budget.in_use == 4
    log = logging.getLogger("iac.test.refusals")
    refusals = RefusalLog(log, "endpoint", interval=10)
    with caplog.at_level(logging.WARNING, logger="iac.test.refusals"):
        assert refusals.refused("total", now=0) is None  # logged now
        assert refusals.refused("total", now=1) == 10  # the next line is due at 10
        for t in range(2, 9):
            assert refusals.refused("per_address", now=t) is None
        refusals.flush(now=10)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "1 total" in lines[0] and "7 per_address, 1 total" in lines[1]
    with pytest.raises(ConfigError, match="max_calls_per_principal"):
        GatewayLimits(max_calls=4, max_calls_per_principal=5)
    with pytest.raises(ConfigError, match="queue_wait must be more than 0"):
        GatewayLimits(queue_wait=0)
