"""Reorder buffer: ordered delivery, adaptive gap hold, overflow, skip, reliable mode."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iac.errors import ConfigError
from iac.protocol.reorder import (
    Delivered,
    Duplicate,
    GapReason,
    GapSkipped,
    Late,
    ReorderBuffer,
    ReorderConfig,
    ReorderEvent,
)

U64 = 2**64
T0 = 1_700_000_000_000_000
MS = 1000


def delivered(events: list[ReorderEvent[str]]) -> list[int]:
    return [e.msg_id for e in events if isinstance(e, Delivered)]


def gaps(events: list[ReorderEvent[str]]) -> list[tuple[int, int]]:
    return [(e.first_missing, e.last_missing) for e in events if isinstance(e, GapSkipped)]


def test_config_defaults_and_validation():
    c = ReorderConfig()
    assert c.max_buffered == 1024
    assert c.jitter_multiplier == 4.0
    assert (c.min_hold_us, c.max_hold_us) == (20_000, 2_000_000)
    assert not c.reliable
    assert c.retransmit_deadline_us == 60_000_000
    for bad in (
        {"max_buffered": 0},
        {"jitter_multiplier": 0.0},
        {"min_hold_us": -1},
        {"min_hold_us": 10, "max_hold_us": 5},
        {"retransmit_deadline_us": -1},
    ):
        with pytest.raises(ConfigError):
            ReorderConfig(**bad)
    with pytest.raises(ConfigError):
        ReorderBuffer[str](first_id=U64)
    with pytest.raises(ConfigError):
        ReorderBuffer[str](first_id=1).push(-1, "x", T0)


def test_in_order_is_released_immediately():
    rb = ReorderBuffer[str](first_id=1)
    for i in range(1, 6):
        assert rb.push(i, f"m{i}", T0) == [Delivered(i, f"m{i}")]
    assert len(rb) == 0
    assert rb.next_deadline() is None
    assert rb.next_expected == 6


def test_out_of_order_is_reordered():
    rb = ReorderBuffer[str](first_id=1)
    assert rb.push(2, "m2", T0) == []
    assert rb.push(3, "m3", T0) == []
    assert len(rb) == 2
    assert rb.next_deadline() == T0 + rb.config.min_hold_us
    assert rb.push(1, "m1", T0 + MS) == [Delivered(1, "m1"), Delivered(2, "m2"), Delivered(3, "m3")]
    assert rb.next_deadline() is None


def test_gap_released_after_deadline_with_report():
    rb = ReorderBuffer[str](first_id=1)
    rb.push(1, "m1", T0)
    assert rb.push(4, "m4", T0) == []
    assert rb.push(5, "m5", T0 + 5 * MS) == []
    deadline = rb.next_deadline()
    assert deadline == T0 + 20 * MS
    assert rb.poll(deadline - 1) == []
    ev = rb.poll(deadline)
    assert ev == [
        GapSkipped(2, 3, 2, GapReason.DEADLINE),
        Delivered(4, "m4"),
        Delivered(5, "m5"),
    ]
    # the gap arrives after all: reported as late, not delivered
    assert rb.push(2, "m2", deadline + 1) == [Late(2, "m2")]
    assert rb.push(6, "m6", deadline + 2) == [Delivered(6, "m6")]


def test_push_also_releases_overdue_items():
    rb = ReorderBuffer[str](first_id=1)
    rb.push(3, "m3", T0)
    ev = rb.push(7, "m7", T0 + 50 * MS)  # m3 is overdue; m7 opens a new gap
    assert ev == [GapSkipped(1, 2, 2, GapReason.DEADLINE), Delivered(3, "m3")]
    assert rb.next_expected == 4
    assert len(rb) == 1


def test_second_gap_uses_its_own_deadline():
    rb = ReorderBuffer[str](first_id=1)
    rb.push(3, "m3", T0)
    rb.push(6, "m6", T0 + 10 * MS)
    ev = rb.poll(T0 + 20 * MS)
    assert ev == [GapSkipped(1, 2, 2, GapReason.DEADLINE), Delivered(3, "m3")]
    assert rb.next_deadline() == T0 + 30 * MS
    assert rb.push(4, "m4", T0 + 25 * MS) == [Delivered(4, "m4")]
    assert rb.poll(T0 + 30 * MS) == [GapSkipped(5, 5, 1, GapReason.DEADLINE), Delivered(6, "m6")]


def test_duplicates_are_reported_not_redelivered():
    rb = ReorderBuffer[str](first_id=1)
    assert rb.push(1, "a", T0) == [Delivered(1, "a")]
    assert rb.push(1, "b", T0) == [Late(1, "b")]
    assert rb.push(3, "c", T0) == []
    assert rb.push(3, "d", T0) == [Duplicate(3, "d")]
    assert rb.push(2, "e", T0) == [Delivered(2, "e"), Delivered(3, "c")]


def test_skip_advances_the_buffer():
    rb = ReorderBuffer[str](first_id=1)
    rb.push(2, "m2", T0)
    rb.push(3, "m3", T0)
    # message 1 was refused by a later check: it still advances the buffer
    assert rb.skip(1, T0 + MS) == [Delivered(2, "m2"), Delivered(3, "m3")]
    # a skip ahead of the delivery point is consumed in order, silently
    assert rb.skip(5, T0 + MS) == []
    assert rb.push(4, "m4", T0 + MS) == [Delivered(4, "m4")]
    assert rb.next_expected == 6
    assert rb.push(6, "m6", T0 + MS) == [Delivered(6, "m6")]
    # skipping something already behind, or twice, does nothing
    assert rb.skip(2, T0 + MS) == []
    rb.skip(9, T0 + MS)
    assert rb.skip(9, T0 + MS) == []


def test_skip_behind_a_gap_is_released_with_the_gap():
    rb = ReorderBuffer[str](first_id=1)
    rb.skip(3, T0)
    rb.push(4, "m4", T0)
    assert rb.poll(T0 + 20 * MS) == [GapSkipped(1, 2, 2, GapReason.DEADLINE), Delivered(4, "m4")]


def test_overflow_releases_in_order_never_drops():
    rb = ReorderBuffer[str](ReorderConfig(max_buffered=3), first_id=1)
    for i in (3, 4, 6):
        assert rb.push(i, f"m{i}", T0) == []
    ev = rb.push(7, "m7", T0)
    assert ev == [GapSkipped(1, 2, 2, GapReason.OVERFLOW), Delivered(3, "m3"), Delivered(4, "m4")]
    assert len(rb) == 2
    ev = rb.push(9, "m9", T0)
    assert ev == []
    ev = rb.push(10, "m10", T0)
    assert ev == [GapSkipped(5, 5, 1, GapReason.OVERFLOW), Delivered(6, "m6"), Delivered(7, "m7")]
    assert rb.flush() == [
        GapSkipped(8, 8, 1, GapReason.FLUSH),
        Delivered(9, "m9"),
        Delivered(10, "m10"),
    ]
    assert len(rb) == 0


def test_wraparound_at_2_64():
    rb = ReorderBuffer[str](first_id=U64 - 2)
    assert delivered(rb.push(0, "c", T0)) == []
    assert delivered(rb.push(U64 - 1, "b", T0)) == []
    assert delivered(rb.push(U64 - 2, "a", T0)) == [U64 - 2, U64 - 1, 0]
    rb.push(3, "e", T0)
    ev = rb.poll(T0 + 20 * MS)
    assert gaps(ev) == [(1, 2)]
    assert delivered(ev) == [3]
    # a gap that wraps
    rb2 = ReorderBuffer[str](first_id=U64 - 1)
    rb2.push(1, "x", T0)
    ev = rb2.poll(T0 + 20 * MS)
    assert ev == [GapSkipped(U64 - 1, 0, 2, GapReason.DEADLINE), Delivered(1, "x")]


def test_unknown_start_holds_first_arrival_and_picks_lowest():
    rb = ReorderBuffer[str]()
    assert rb.next_expected is None
    assert rb.push(5, "m5", T0) == []
    assert rb.push(4, "m4", T0 + MS) == []
    assert rb.push(7, "m7", T0 + 2 * MS) == []
    ev = rb.poll(T0 + 20 * MS)
    # the start is the lowest id that arrived: no gap before it; the gap at 6 is still held
    assert ev == [Delivered(4, "m4"), Delivered(5, "m5")]
    assert rb.next_expected == 6
    assert rb.poll(T0 + 22 * MS) == [GapSkipped(6, 6, 1, GapReason.DEADLINE), Delivered(7, "m7")]


def test_unknown_start_near_the_wrap():
    rb = ReorderBuffer[str]()
    rb.push(1, "c", T0)
    rb.push(U64 - 1, "a", T0)
    rb.push(0, "b", T0)
    assert delivered(rb.poll(T0 + 20 * MS)) == [U64 - 1, 0, 1]


def test_unknown_start_overflow():
    rb = ReorderBuffer[str](ReorderConfig(max_buffered=2))
    rb.push(10, "a", T0)
    rb.push(12, "c", T0)
    ev = rb.push(11, "b", T0)
    assert ev == [Delivered(10, "a"), Delivered(11, "b"), Delivered(12, "c")]


def test_jitter_adaptation_changes_the_hold():
    cfg = ReorderConfig(min_hold_us=1 * MS, max_hold_us=500 * MS)
    steady = ReorderBuffer[str](cfg, first_id=1)
    jittery = ReorderBuffer[str](cfg, first_id=1)
    for i in range(1, 101):
        sent = T0 + i * 10 * MS
        steady.push(i, "x", sent + 2 * MS, sent_us=sent)  # constant transit: no jitter
        transit = 2 * MS if i % 2 else 42 * MS  # transit swings by 40 ms
        jittery.push(i, "x", sent + transit, sent_us=sent)
    assert steady.jitter_us == 0
    assert steady.hold_us == 1 * MS  # clamped to min_hold
    assert 30 * MS < jittery.jitter_us <= 40 * MS
    assert jittery.hold_us == int(4 * jittery.jitter_us)
    # the hold in force decides when a gap is given up
    now = T0 + 10_000 * MS
    steady.push(200, "y", now)
    jittery.push(200, "y", now)
    assert steady.next_deadline() == now + 1 * MS
    assert jittery.next_deadline() == now + jittery.hold_us
    assert delivered(steady.poll(now + 2 * MS)) == [200]
    assert delivered(jittery.poll(now + 2 * MS)) == []
    # the hold is clamped above as well
    wild = ReorderBuffer[str](cfg, first_id=1)
    for i in range(1, 60):
        sent = T0 + i * 10 * MS
        wild.push(i, "x", sent + (0 if i % 2 else 10_000 * MS), sent_us=sent)
    assert wild.hold_us == 500 * MS


def test_reliable_mode_holds_until_retransmission_deadline():
    cfg = ReorderConfig(reliable=True, retransmit_deadline_us=60_000 * MS)
    rb = ReorderBuffer[str](cfg, first_id=1)
    rb.push(2, "m2", T0)
    assert rb.hold_us == 60_000 * MS
    assert rb.poll(T0 + 59_999 * MS) == []
    # the sender retransmits 1 and delivery stays in order
    assert delivered(rb.push(1, "m1", T0 + 30_000 * MS)) == [1, 2]
    rb.push(4, "m4", T0 + 31_000 * MS)
    assert rb.poll(T0 + 91_000 * MS - 1) == []
    assert rb.poll(T0 + 91_000 * MS) == [GapSkipped(3, 3, 1, GapReason.DEADLINE), Delivered(4, "m4")]


def test_memory_stays_bounded_when_gaps_keep_filling():
    """Each round holds a message and then fills its gap, so everything is delivered and nothing
    stays held; what the buffer keeps per round (a deadline of a message no longer held) must not
    pile up. Measured: the memory the buffer holds does not grow with the number of rounds."""
    rb = ReorderBuffer[str](ReorderConfig(max_buffered=8), first_id=0)
    next_id = 0

    def rounds(n: int) -> None:
        nonlocal next_id
        for _ in range(n):
            assert rb.push(next_id + 1, "b", T0) == []  # held: its predecessor is missing
            assert delivered(rb.push(next_id, "a", T0)) == [next_id, next_id + 1]
            next_id += 2

    rounds(2_000)  # warm up: any per-buffer structure reaches its steady size
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rounds(20_000)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(rb) == 0 and rb.next_expected == next_id
    # A stale entry per round kept for good would be ~20,000 × (tuple + ints) ≈ 2 MB.
    assert grown < 64 * 1024, f"the buffer grew by {grown} bytes over 20,000 delivered rounds"


# --- properties ------------------------------------------------------------------------------


def check_stream(
    events: list[ReorderEvent[str]], start: int, skips: frozenset[int] = frozenset()
) -> tuple[list[int], set[int], list[int]]:
    """Delivered, gap and skipped ids must tile a contiguous range from ``start`` in order."""
    pos = 0  # unwrapped position relative to start
    got: list[int] = []
    gap_ids: set[int] = set()
    late: list[int] = []
    for e in events:
        if isinstance(e, (Delivered, GapSkipped)):
            first = e.msg_id if isinstance(e, Delivered) else e.first_missing
            while first != (start + pos) % U64 and pos in skips:
                pos += 1  # consumed silently by skip()
        if isinstance(e, Delivered):
            assert e.msg_id == (start + pos) % U64, "delivered out of order"
            assert e.item == f"m{e.msg_id}"
            got.append(pos)
            pos += 1
        elif isinstance(e, GapSkipped):
            assert e.first_missing == (start + pos) % U64
            assert e.count >= 1
            assert e.last_missing == (start + pos + e.count - 1) % U64
            gap_ids.update(range(pos, pos + e.count))
            pos += e.count
        elif isinstance(e, (Late, Duplicate)):
            late.append((e.msg_id - start) % U64)
    return got, gap_ids, late


@settings(max_examples=300)
@given(
    start=st.sampled_from([1, 0, U64 - 5, 2**63]),
    n=st.integers(1, 40),
    data=st.data(),
)
def test_any_arrival_order_without_deadlines(start, n, data):
    """Permuted, duplicated, partly missing: every arrived id delivered once, in order; gaps = missing."""
    present = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    arrivals = [i for i in range(n) if present[i]]
    arrivals += data.draw(st.lists(st.sampled_from(arrivals), max_size=10)) if arrivals else []
    arrivals = data.draw(st.permutations(arrivals))
    rb = ReorderBuffer[str](ReorderConfig(max_buffered=10_000), first_id=start)
    events: list[ReorderEvent[str]] = []
    for i in arrivals:
        mid = (start + i) % U64
        events += rb.push(mid, f"m{mid}", T0)  # same instant: no deadline fires
    events += rb.flush()
    got, gap_ids, late = check_stream(events, start)
    arrived = set(arrivals)
    assert got == sorted(arrived)
    top = max(arrived, default=-1)
    assert gap_ids == {i for i in range(top + 1) if i not in arrived}
    assert len(late) == len(arrivals) - len(arrived)  # every extra copy reported, none delivered
    assert len(rb) == 0


@settings(max_examples=300)
@given(
    start=st.sampled_from([1, U64 - 3]),
    data=st.data(),
)
def test_any_arrival_with_deadlines_and_overflow_never_loses_or_reorders(start, data):
    """With time passing and a small cap, each arrived id is delivered once or reported late."""
    n = data.draw(st.integers(1, 50))
    arrivals = data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=80))
    skips = data.draw(st.sets(st.integers(0, n - 1), max_size=5))
    cap = data.draw(st.integers(1, 8))
    rb = ReorderBuffer[str](ReorderConfig(max_buffered=cap, min_hold_us=5 * MS), first_id=start)
    events: list[ReorderEvent[str]] = []
    now = T0
    for step, i in enumerate(arrivals):
        now += data.draw(st.integers(0, 8 * MS), label=f"dt{step}")
        mid = (start + i) % U64
        if i in skips:
            events += rb.skip(mid, now)
        else:
            events += rb.push(mid, f"m{mid}", now)
        assert len(rb) <= cap
        deadline = rb.next_deadline()
        assert deadline is None or deadline > now  # nothing overdue is left behind
    events += rb.poll(now + 10**9)
    assert len(rb) == 0
    got, gap_ids, late = check_stream(events, start, frozenset(skips))
    assert len(got) == len(set(got))
    pushed = {i for i in arrivals if i not in skips}
    # every pushed id was delivered exactly once or reported late (arrived after its gap was given up)
    for i in pushed:
        assert i in got or i in late
    # a late id was behind the delivery point: delivered earlier, in a reported gap, or skipped
    for i in late:
        assert i in got or i in gap_ids or i in skips
    assert set(got) <= pushed
