"""The one timer structure of a loop (iac/transport/timers.py): the sans-IO wheel with an explicit
clock, its asyncio driver, and the connections that use it (one loop timer for many connections)."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import run

from iac.bench.scenarios.scale import open_peer
from iac.node.config import NodeConfig
from iac.node.node import Context, Node
from iac.transport.base import TransportConfig
from iac.transport.core import ConnectionCore, TimerEvent
from iac.transport.session import SessionLogic
from iac.transport.timers import LoopTimers, TimerWheel, loop_clock, loop_timers, rounded
from iac.wire.enums import MessageType

# --- the wheel, with an explicit clock --------------------------------------------------------


def test_rounded_never_early_and_on_the_coarsest_grid_within_the_slack() -> None:
    assert rounded(10.03, 0.0) == 10.03  # exact
    assert rounded(10.03, 0.0005) == 10.03  # below the finest grid: exact
    assert rounded(10.03, 1.0) == 11.0
    assert rounded(10.03, 0.5) == pytest.approx(10.1)
    assert rounded(10.0, 1.0) == 10.0  # on the grid already
    for at in (0.1 * k + 0.0001 * k for k in range(500)):
        for slack in (0.001, 0.01, 0.1, 1.0, 3.0):
            r = rounded(at, slack)
            assert at <= r <= at + min(slack, 1.0) + 1e-9


def test_wheel_fires_in_deadline_order_and_only_when_due() -> None:
    w: TimerWheel[str] = TimerWheel()
    w.set("b", 2.0)
    w.set("a", 1.0)
    w.set("c", 3.0)
    assert w.next_deadline() == 1.0 and len(w) == 3
    assert w.due(0.999) == []
    assert w.due(2.5) == ["a", "b"]
    assert "a" not in w and "c" in w and w.next_deadline() == 3.0
    assert w.due(10.0) == ["c"] and w.next_deadline() is None and len(w) == 0


def test_wheel_keeps_one_deadline_per_owner() -> None:
    w: TimerWheel[str] = TimerWheel()
    w.set("a", 1.0)
    w.set("a", 5.0)  # moved later: the old entry is stale
    assert w.deadline("a") == 5.0 and w.next_deadline() == 5.0
    assert w.due(2.0) == []  # the stale entry fires nothing
    w.set("a", 0.5)  # moved earlier
    assert w.due(1.0) == ["a"] and w.due(6.0) == []  # fired once, the later entry stale too
    w.set("b", 1.0)
    w.set("b", None)  # cleared
    assert "b" not in w and w.next_deadline() is None and w.due(9.0) == []


def test_wheel_rounds_coarse_deadlines_onto_shared_instants() -> None:
    w: TimerWheel[int] = TimerWheel()
    for k in range(1000):  # a thousand keep-alives spread over one second, 1 s of slack each
        w.set(k, 10.0 + k / 1000, slack=1.0)
    w.set(-1, 10.5)  # one exact deadline among them
    assert w.next_deadline() == 10.0  # k=0 is on the grid
    assert w.due(10.0) == [0]
    assert w.due(10.5) == [-1]  # the exact one fires on time
    assert w.due(10.99) == []  # nothing coarse fires early
    assert sorted(w.due(11.0)) == list(range(1, 1000))  # the rest: one instant


def test_a_replaced_or_cleared_deadline_keeps_nothing_alive() -> None:
    """The heap's stale entries do not refer to their owner: a connection whose timer was
    cancelled is collected at once, with what it holds (asyncio's cancel() drops its callback)."""
    import gc
    import weakref

    class Owner:
        pass

    w: TimerWheel[Owner] = TimerWheel()
    a, b = Owner(), Owner()
    w.set(a, 5.0)
    w.set(a, 6.0)  # replaced: one stale entry
    w.set(b, 7.0)
    w.set(b, None)  # cleared
    refs = weakref.ref(a), weakref.ref(b)
    w.set(a, None)
    del a, b
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert w.next_deadline() is None and w.due(100.0) == []


def test_wheel_heap_stays_bounded_by_the_live_deadlines() -> None:
    w: TimerWheel[int] = TimerWheel()
    for step in range(200):  # 100 owners, each moved 200 times (an ACK timer moves per packet)
        for k in range(100):
            w.set(k, 1000.0 + step + k / 100)
    assert len(w) == 100
    assert w.heap_size <= 2 * len(w) + 65
    assert w.due(2000.0) == list(range(100))


# --- the core's wake-up instant ---------------------------------------------------------------


def test_core_wakes_no_earlier_than_its_deadline_and_within_its_slack() -> None:
    c = ConnectionCore(now=0.0, idle_timeout=30.0, linger=1.0, keepalive=10.0)
    c.open(SessionLogic("a" * 64))
    c.start_keepalive(0.3)
    assert c.next_timer() == pytest.approx(10.3)
    assert c.next_wake() == 11.0  # a tenth of 10 s: 1 s grid
    c.waiting = True  # a probe of a quiet peer is due at last_heard + 0.5 s: 0.05 s slack
    c.last_heard = 0.33
    assert c.next_timer() == pytest.approx(0.83)
    assert c.next_wake() == pytest.approx(0.83)  # 0.01 s grid: 0.83 is on it
    c.last_heard = 0.334
    assert 0.834 <= c.next_wake() <= 0.84 + 1e-9  # type: ignore[operator]


def test_keepalive_waits_for_a_quiet_interval_after_the_last_packet() -> None:
    """The keep-alive PING is due ``keepalive`` after the last PING and after the last packet
    from the peer: a peer heard within the interval (its own PING, an ACK) kept the path open
    both ways, so only one side of a quiet connection pings per interval."""
    c = ConnectionCore(now=0.0, idle_timeout=None, linger=1.0, keepalive=10.0)
    c.start_keepalive(0.0)
    c.last_packet = 4.0  # the peer's PING arrived at 4 s
    assert c.next_timer() == 14.0
    assert c.handle_timer(10.0) is TimerEvent.NONE  # heard 6 s ago: no PING
    assert c.handle_timer(14.0) is TimerEvent.PING
    assert c.next_timer() == 24.0  # nothing heard since: every 10 s, as before
    assert c.handle_timer(24.0) is TimerEvent.PING


# --- the asyncio driver -----------------------------------------------------------------------


def test_one_loop_timer_serves_many_owners_in_order() -> None:
    run(_many_owners())


async def _many_owners() -> None:
    loop = asyncio.get_running_loop()
    drv = LoopTimers(loop)
    fired: list[int] = []
    done = asyncio.Event()
    now = loop.time()
    timers = []
    for k in (3, 1, 2, 0):
        t = drv.timer(lambda k=k: fired.append(k))
        t.at(now + 0.01 + k * 0.002)
        timers.append(t)
    last = drv.timer(done.set)
    last.at(now + 0.02)
    cancelled = drv.call_at(now + 0.001, fired.append, 99)
    cancelled.cancel()
    assert cancelled.cancelled() and timers[0].when == pytest.approx(now + 0.016)
    async with asyncio.timeout(5):
        await done.wait()
    assert fired == [0, 1, 2, 3]
    assert drv.fired == 5 and drv.wakes <= 6
    assert len(drv.wheel) == 0


def test_after_the_earliest_deadline_is_cleared_the_next_one_still_fires() -> None:
    run(_earliest_cleared())


async def _earliest_cleared() -> None:
    loop = asyncio.get_running_loop()
    drv = LoopTimers(loop)
    ran: list[str] = []
    done = asyncio.Event()
    now = loop.time()
    first = drv.call_at(now + 0.005, ran.append, "first")
    drv.call_at(now + 0.02, ran.append, "second")
    first.cancel()  # the loop timer armed for it stays, finds nothing due, re-arms for the next
    drv.call_at(now + 0.03, done.set)
    async with asyncio.timeout(5):
        await done.wait()
    assert ran == ["second"]
    assert len(drv.wheel) == 0


class _ShiftedLoop(asyncio.SelectorEventLoop):
    """A loop with a clock of its own (an hour ahead of time.monotonic)."""

    def time(self) -> float:
        return time.monotonic() + 3600.0


def test_loop_clock_is_the_loops_own_time() -> None:
    loop = asyncio.new_event_loop()
    shifted = _ShiftedLoop()
    try:
        assert loop_clock(loop) is time.monotonic  # asyncio's loop.time() is just that
        clock = loop_clock(shifted)
        assert clock != time.monotonic and clock() - time.monotonic() > 3500.0
    finally:
        loop.close()
        shifted.close()


def test_a_timer_cancelled_or_moved_by_an_earlier_callback_of_the_same_wake_up_does_not_run() -> None:
    run(_cancelled_meanwhile())


async def _cancelled_meanwhile() -> None:
    loop = asyncio.get_running_loop()
    drv = LoopTimers(loop)
    ran: list[str] = []
    done = asyncio.Event()
    at = loop.time() - 1.0  # all three already due: the first wake-up takes them together
    b = drv.timer(lambda: ran.append("b"))
    c = drv.timer(lambda: ran.append("c"))

    def first() -> None:  # due in the same wake-up as b and c, and runs before them
        ran.append("a")
        b.cancel()
        c.at(loop.time() + 0.01)  # moved: runs later, once

    drv.call_at(at - 0.001, first)
    b.at(at)
    c.at(at)
    drv.call_at(loop.time() + 0.05, done.set)
    async with asyncio.timeout(5):
        await done.wait()
    assert ran == ["a", "c"]


def test_a_closed_loop_and_its_timers_are_collected() -> None:
    import gc
    import weakref

    loop = asyncio.new_event_loop()
    drv = loop_timers(loop)
    kept = drv.timer(lambda: None)
    kept.at(loop.time() + 60.0)
    assert loop_timers(loop) is drv  # one driver per loop while it is in use
    ref = weakref.ref(loop)
    loop.close()
    del loop, drv, kept
    gc.collect()
    assert ref() is None  # the registry of drivers does not keep a loop alive


def test_a_failing_callback_does_not_stop_the_others() -> None:
    run(_failing_callback())


async def _failing_callback() -> None:
    loop = asyncio.get_running_loop()
    drv = LoopTimers(loop)
    errors: list[object] = []
    loop.set_exception_handler(lambda _loop, ctx: errors.append(ctx.get("exception")))
    done = asyncio.Event()

    def boom() -> None:
        raise ValueError("boom")

    at = loop.time() + 0.005
    drv.call_at(at, boom)
    drv.call_at(at, done.set)
    try:
        async with asyncio.timeout(5):
            await done.wait()
    finally:
        loop.set_exception_handler(None)
    assert len(errors) == 1 and isinstance(errors[0], ValueError)


@pytest.mark.parametrize("transport", ["quic", "tls"])
def test_connections_share_the_loop_timer(transport: str) -> None:
    """Open connections hold no event-loop timer each: their keep-alive and idle deadlines and
    the QUIC library's timers are entries of the loop's one wheel, served by one loop timer."""
    run(_shared(transport))


async def _shared(transport: str) -> None:
    loop = asyncio.get_running_loop()
    config = NodeConfig(transport=TransportConfig())  # the shipped defaults: idle 30 s
    async with Node(listen=[f"{transport}://127.0.0.1:0"], config=config) as node:

        @node.on(MessageType.RUN)
        async def echo(ctx: Context) -> object:
            return ctx.payload

        url = next(a for a in node.addresses if a.startswith(f"{transport}://"))
        before = len(loop_timers(loop).wheel)
        cfg = TransportConfig()
        peers = await asyncio.gather(*(open_peer(url, node.agent_id, cfg) for _ in range(20)))
        try:
            # 20 connections, both ends in this loop: each end's idle or keep-alive deadline
            assert len(loop_timers(loop).wheel) - before >= 40
            handles = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
            assert len(handles) < 20  # not one per connection (the node's own timers remain)
        finally:
            await asyncio.gather(*(p[0].close() for p in peers))
