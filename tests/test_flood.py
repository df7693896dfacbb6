"""Flood: many messages to a deliberately slow handler. Memory stays bounded (the node's queue
depths never pass their configured bounds) and every message is either handled or refused
with ``busy`` — nothing is lost unseen. 100,000 messages with IAC_SLOW=1; fewer by default."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import pytest
from conftest import run

from iac.errors import RemoteError
from iac.node.config import NodeConfig
from iac.node.fair import FairThreads, LoopShare, Slots
from iac.node.node import Context, Node
from iac.testing import eventually
from iac.wire._pb.iac_pb2 import Message, MessageType

SLOW = os.environ.get("IAC_SLOW") == "1"
N_FULL = 100_000
N = N_FULL if SLOW else 10_000

BOB = NodeConfig(max_handlers=4, max_backlog=64, max_per_peer=N_FULL, sync_in_thread=False)


def _flood_one_way(n: int) -> None:
    async def main() -> None:
        async with Node(listen=["tls://127.0.0.1:0"], config=BOB) as bob, Node() as alice:
            handled = 0
            refusals: list[str] = []  # the code of every ERROR alice's on_error callback saw
            done = asyncio.Event()
            peak_depth = 0

            def check() -> None:
                if handled + len(refusals) == n:
                    done.set()

            @bob.on(MessageType.RUN)
            async def slow(ctx: Context) -> None:
                nonlocal handled, peak_depth
                st = bob.stats()
                peak_depth = max(peak_depth, st.backlog + st.running)
                await asyncio.sleep(0.002)  # the slow handler is the behaviour under test
                handled += 1
                check()

            def on_error(peer: str, msg: Message, code: str, text: str) -> None:
                refusals.append(code)  # no assert here: the node swallows a callback's exceptions
                check()

            alice.on_error(on_error)
            alice.add_peer(bob.agent_id, *bob.addresses)
            for i in range(n):
                await alice.send(bob.agent_id, MessageType.RUN, {"i": i})
            await asyncio.wait_for(done.wait(), 60 if n <= 10_000 else 600)
            busy = len(refusals)
            assert set(refusals) == {"busy"}, f"every refusal is busy, got {sorted(set(refusals))}"
            st = bob.stats()
            assert handled + busy == n
            assert handled > 0 and busy > 0
            assert st.handled == handled
            assert st.refused == {"busy": busy}
            # bounded: never more waiting or running than configured
            assert st.backlog_peak <= BOB.max_backlog
            assert st.running_peak <= BOB.max_handlers
            assert peak_depth <= BOB.max_backlog + BOB.max_handlers
            assert alice.stats().errors_received == {"busy": busy}

    run(main(), timeout=900)


@pytest.mark.slow  # reduced count by default; IAC_SLOW=1 runs the full one
def test_flood_one_way_is_handled_or_refused_busy() -> None:
    _flood_one_way(N)


def test_flood_acknowledged_each_acked_or_busy() -> None:
    """With ACK_REQUESTED the sender waits for its window (max_in_flight) and learns each outcome."""

    async def main() -> None:
        n = 1_000
        cfg = NodeConfig(max_handlers=2, max_backlog=8, sync_in_thread=False)
        async with Node(listen=["tls://127.0.0.1:0"], config=cfg) as bob, Node() as alice:
            bob.on(MessageType.RUN)(_sleepy)
            alice.add_peer(bob.agent_id, *bob.addresses)
            sent = [await alice.send(bob.agent_id, MessageType.RUN, {"i": i}, ack=True) for i in range(n)]
            results = await asyncio.gather(*(s.wait() for s in sent), return_exceptions=True)
            acked = sum(r is None for r in results)
            busy = sum(isinstance(r, RemoteError) and r.code == "busy" for r in results)
            assert acked + busy == n and acked > 0
            assert bob.stats().handled == acked
            assert bob.stats().backlog_peak <= 8 and alice.stats().unacked == 0

    run(main(), timeout=120)


async def _sleepy(ctx: Context) -> None:
    await asyncio.sleep(0.001)


def test_per_peer_quota_is_busy() -> None:
    async def main() -> None:
        cfg = NodeConfig(max_per_peer=2, sync_in_thread=False)
        gate = asyncio.Event()
        async with Node(listen=["tls://127.0.0.1:0"], config=cfg) as bob, Node() as alice:

            @bob.on(MessageType.RUN)
            async def wait(ctx: Context) -> None:
                await gate.wait()

            alice.add_peer(bob.agent_id, *bob.addresses)
            first = [
                asyncio.ensure_future(alice.request(bob.agent_id, MessageType.RUN, timeout=5))
                for _ in range(2)
            ]
            await eventually(lambda: bob.stats().running == 2)
            with pytest.raises(RemoteError) as e:
                await alice.request(bob.agent_id, MessageType.RUN, timeout=5)
            assert e.value.code == "busy"
            gate.set()
            await asyncio.gather(*first)
            assert bob.stats().refused == {"busy": 1}

    run(main())


# --- sync handlers share their threads fairly ---------------------------------------------------


def test_fair_threads_serve_the_waiting_peers_in_turn() -> None:
    """One thread; peer A queues five calls, then B one: B's call runs second, not sixth. A
    failure reaches its caller; a call cancelled before it started never runs."""

    async def main() -> None:
        threads = FairThreads(1)
        gate, order = threading.Event(), []

        def call(name: str) -> str:
            order.append(name)
            if name == "a0":
                assert gate.wait(5)
            if name == "boom":
                raise ValueError("boom")
            return name

        futs = [threads.run("A", lambda i=i: call(f"a{i}")) for i in range(5)]
        await eventually(lambda: order == ["a0"])
        b = threads.run("B", lambda: call("b0"))
        gone = threads.run("C", lambda: call("never"))
        gone.cancel()
        boom = threads.run("B", lambda: call("boom"))
        gate.set()
        assert await asyncio.gather(*futs, b) == ["a0", "a1", "a2", "a3", "a4", "b0"]
        with pytest.raises(ValueError, match="boom"):
            await boom
        assert order == ["a0", "b0", "a1", "boom", "a2", "a3", "a4"]
        assert threads.running == 0 and threads.waiting == 0
        threads.close()

    run(main())


def test_one_peers_flood_of_slow_sync_handlers_does_not_queue_ahead_of_another_peer() -> None:
    """Two handler threads, both held by A's calls, and twenty more of A's waiting: B's request
    is the next to get a thread, and is answered while A's calls still wait."""

    async def main() -> None:
        gate = threading.Event()
        started: list[str] = []

        def handler(ctx: Context) -> str:
            started.append(ctx.payload["who"])
            if ctx.payload["who"] == "a":
                assert gate.wait(10)
            return "ok"

        cfg = NodeConfig(handler_threads=2)
        async with (
            Node(listen=["tls://127.0.0.1:0"], config=cfg) as node,
            Node() as a,
            Node() as b,
        ):
            node.on(MessageType.RUN)(handler)
            for peer in (a, b):
                peer.add_peer(node.agent_id, *node.addresses)
            for _ in range(22):
                await a.send(node.agent_id, MessageType.RUN, {"who": "a"})
            await eventually(lambda: node.stats().running == 22)  # admitted: 2 on threads, 20 waiting
            ask = asyncio.ensure_future(b.request(node.agent_id, MessageType.RUN, {"who": "b"}, timeout=10))
            await eventually(lambda: node.stats().running == 23 and len(started) == 2)  # B's waits too
            gate.set()  # A's two calls return; B's is the next to start
            assert (await ask).payload == "ok"
            assert started[:3] == ["a", "a", "b"]
            await eventually(lambda: len(started) == 23)

    run(main())


def test_a_freed_handler_slot_goes_to_the_peer_served_least_recently() -> None:
    """One slot, held; A queues four waiters, then B one: they take turns (A, B, then A's rest),
    B does not wait behind all of A's."""

    async def main() -> None:
        slots = Slots(1)
        assert slots.try_take()
        order: list[str] = []

        async def want(peer: str) -> None:
            await slots.take(peer)
            order.append(peer)

        waiting = [asyncio.ensure_future(want("A")) for _ in range(4)]
        await asyncio.sleep(0)  # they queue, in this order
        waiting.append(asyncio.ensure_future(want("B")))
        await asyncio.sleep(0)
        for _ in range(5):
            slots.give()
            await asyncio.sleep(0)
        await asyncio.gather(*waiting)
        assert order == ["A", "B", "A", "A", "A"]

    run(main())


def test_a_quick_plain_handler_moves_to_the_loop_and_a_blocking_one_back_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """sync_in_thread with adaptive_sync: after 64 quick calls on a thread the handler runs on the
    loop's thread; a call there that blocks 20 ms sends it back to a thread, logged as a WARNING
    naming the handler. With adaptive_sync off it never leaves the threads."""

    async def main(adaptive: bool) -> list[bool]:
        on_loop: list[bool] = []
        loop_thread = threading.get_ident()

        def quick(ctx: Context) -> None:
            on_loop.append(threading.get_ident() == loop_thread)
            if ctx.payload.get("block"):
                time.sleep(0.02)

        cfg = NodeConfig(adaptive_sync=adaptive)
        async with Node(listen=["tls://127.0.0.1:0"], config=cfg) as node, Node() as peer:
            node.on(MessageType.RUN)(quick)
            peer.add_peer(node.agent_id, *node.addresses)
            for i in range(70):
                await peer.request(node.agent_id, MessageType.RUN, {"block": i == 66}, timeout=10)
        return on_loop

    with caplog.at_level(logging.WARNING, logger="iac.node"):
        where = run(main(True))
    assert not any(where[:64]) and all(where[64:67]) and not any(where[67:])
    (warning,) = [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert "quick" in warning.getMessage()
    assert not any(run(main(False)))


def test_loop_share_holds_only_a_dominant_peer_while_the_loop_is_saturated() -> None:
    """Sans-IO: a saturated loop cuts the peer that sent far more than anyone else to 0.7x what it
    sent; a peer alone, a loop with time to spare, or peers of like size are never held; an idle
    loop lets the rate grow until it is lifted."""
    share = LoopShare(period=0.02, busy_lag=0.0005, idle_lag=0.0002, ceiling=1_000.0)
    share.report(0.005, {"flood": 200}, 0.02)  # alone: nobody to be fair to
    share.report(0.0001, {"flood": 200, "honest": 2}, 0.02)  # the loop keeps up
    share.report(0.005, {"a": 100, "b": 60}, 0.02)  # nobody stands out
    share.report(0.005, {"honest": 3, "other": 0}, 0.02)  # too few to matter
    assert share.rates == {} and share.cuts == 0
    share.report(0.005, {"flood": 200, "honest": 2}, 0.02)
    assert share.rates == {"flood": pytest.approx(0.7 * 200 / 0.02)} and share.cuts == 1
    share.report(0.005, {"flood": 100, "honest": 2}, 0.02)  # still saturated: cut again
    assert share.rates["flood"] == pytest.approx(0.7 * 100 / 0.02)
    share.report(0.0003, {"flood": 60, "honest": 2}, 0.02)  # between the marks: kept
    assert share.rates["flood"] == pytest.approx(0.7 * 100 / 0.02)
    for _ in range(5):  # idle: grows 1.25x a period until past the ceiling, then lifted
        share.report(0.0, {"flood": 10, "honest": 2}, 0.02)
    assert share.rates == {}
