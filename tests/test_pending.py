"""The pending table's request timeouts (one loop timer for every request) and in-flight permits
(iac/node/pending.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref

from conftest import run

from iac.node.pending import Deadlines, Permits


def test_deadlines_fail_only_the_requests_whose_time_passed() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        d = Deadlines()
        now = loop.time()
        late, soon, ended = loop.create_future(), loop.create_future(), loop.create_future()
        d.add(loop, now + 30.0, late)
        d.remove(d.add(loop, now + 0.01, ended))  # answered before its deadline
        d.add(loop, now + 0.02, soon)
        await asyncio.wait([soon], timeout=5.0)
        assert isinstance(soon.exception(), TimeoutError)
        assert loop.time() >= now + 0.02  # never early
        assert not ended.done()  # removed: never failed
        assert not late.done() and len(d) == 1
        # The loop timer waits for the earliest one left: one handle, not one per request.
        handles = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
        assert [h.when() for h in handles].count(now + 30.0) == 1

    run(main())


def test_deadlines_heap_stays_bounded_and_holds_no_future() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        d = Deadlines()
        at = loop.time() + 60.0
        kept = [loop.create_future() for _ in range(10)]
        for f in kept:
            d.add(loop, at, f)
        for i in range(5000):  # answered requests: their entries wait in the heap until compacted
            f = loop.create_future()
            ref = weakref.ref(f)
            d.remove(d.add(loop, at + i * 1e-3, f))
            del f
            assert d.heap_size <= 2 * len(d) + 65
        gc.collect()
        assert ref() is None  # an ended request's future is not held by its heap entry
        assert len(d) == 10 and not any(f.done() for f in kept)

    run(main())


def test_deadlines_timer_does_not_keep_the_table_alive() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        d = Deadlines()
        d.add(loop, loop.time() + 60.0, loop.create_future())
        ref = weakref.ref(d)
        del d
        gc.collect()
        assert ref() is None

    run(main())


def test_permits_are_taken_in_turn_and_a_cancelled_waiter_passes_its_permit_on() -> None:
    async def main() -> None:
        p = Permits(1)
        assert p.try_take() and p.locked() and not p.try_take()
        order: list[str] = []

        async def wait(name: str) -> None:
            await p.acquire()
            order.append(name)

        first = asyncio.create_task(wait("first"))
        gone = asyncio.create_task(wait("gone"))
        last = asyncio.create_task(wait("last"))
        await asyncio.sleep(0)  # all three wait (no permit is free)
        assert order == [] and p.locked()
        p.release()  # to "first"
        gone.cancel()  # waits, then is cancelled: it takes nothing
        await first
        p.release()  # skips "gone", to "last"
        await last
        assert order == ["first", "last"]
        assert gone.cancelled() and p.locked()
        p.release()
        assert not p.locked() and p.try_take()

        # Handed a permit in the same turn as it is cancelled: the permit goes back, not lost.
        waiter = asyncio.create_task(p.acquire())
        await asyncio.sleep(0)
        p.release()
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        assert not p.locked() and p.try_take()

        # A lone waiter that gave up (a request's wait_for timed out) leaves no trace behind.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(p.acquire(), 0.001)
        p.release()
        assert not p.locked() and p.try_take()

    run(main())


def test_deadlines_go_on_in_a_new_event_loop() -> None:
    """A node used from one event loop and then another (asyncio.run twice): a request left on
    the closed loop is dropped, and the new loop's requests still time out."""
    d = Deadlines()

    async def abandoned() -> None:
        loop = asyncio.get_running_loop()
        d.add(loop, loop.time() + 0.01, loop.create_future())  # its loop closes before it is due

    async def next_loop() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0.02)  # the abandoned deadline has passed
        f = loop.create_future()
        d.add(loop, loop.time() + 0.01, f)
        await asyncio.wait([f], timeout=5.0)
        assert isinstance(f.exception(), TimeoutError)
        assert len(d) == 0

    run(abandoned())
    run(next_loop())
