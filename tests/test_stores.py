"""Replay stores: one behavioural suite for memory, SQLite and Redis, then what each adds.

The Redis tests start their own ``redis-server`` on a free loopback port (no
persistence) for the session; CI installs the binary (``.ci/run``). Without it
they fail, they do not skip.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis_server import free_port as _free_port
from redis_server import start_redis

from iac.errors import ConfigError, MessageRejected, StoreUnavailable, TransportError
from iac.protocol.replay import (
    DEFAULT_RESERVATION_LEASE_US,
    ReplayConfig,
    ReplayGuard,
    ReplayStore,
    Verdict,
    require_new,
)
from iac.stores.memory import MemoryReplayStore
from iac.stores.redis import RedisReplayStore
from iac.stores.sqlite import SqliteReplayStore
from iac.testing import eventually_sync

T0 = 1_700_000_000_000_000
SKEW = 60_000_000
A = "a" * 64
B = "b" * 64
U64 = 2**64
ROOT = Path(__file__).resolve().parent.parent

StoreFactory = Callable[..., ReplayStore]


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[object]:
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


# --- one factory per kind of store ----------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_store(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """``make_store(**ReplayConfig fields)``: a fresh, empty store of this kind on each call."""
    made: list[SqliteReplayStore | RedisReplayStore] = []
    counter = itertools.count()
    url = request.getfixturevalue("redis_url") if kind == "redis" else ""

    def factory(**kw: int) -> ReplayStore:
        config = ReplayConfig(**kw)
        if kind == "memory":
            return MemoryReplayStore(started_at_us=T0, config=config)
        if kind == "sqlite":
            s: SqliteReplayStore | RedisReplayStore = SqliteReplayStore(
                tmp_path / f"replay-{next(counter)}.db", config, synchronous="NORMAL"
            )
        else:
            s = RedisReplayStore(url, config, key_prefix=f"test:{uuid.uuid4().hex}", started_at_us=T0)
        made.append(s)
        return s

    yield factory
    for s in made:
        s.close()


def count(s: ReplayStore) -> int:
    return len(s)  # type: ignore[arg-type]


# === the shared behavioural suite ==============================================================


def test_is_a_replay_store(make_store):
    assert isinstance(make_store(), ReplayStore)


def test_out_of_range_ids_refused(make_store):
    s = make_store()
    for sid, mid in ((1, -1), (1, U64), (U64, 1), (-1, 1)):
        with pytest.raises(ConfigError):
            s.check_and_mark(A, sid, mid, T0)
        with pytest.raises(ConfigError):
            s.reserve(A, sid, mid, T0)
    with pytest.raises(ConfigError):
        s.commit(A, 1, U64, T0)
    with pytest.raises(ConfigError):
        s.release(A, 1, -1, T0)


def test_duplicate_refused(make_store):
    s = make_store()
    assert s.check_and_mark(A, 7, 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 7, 1, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 8, 1, T0) is Verdict.NEW
    assert s.check_and_mark(B, 7, 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, U64 - 1, 1, T0) is Verdict.NEW  # largest session id
    assert s.check_and_mark(A, U64 - 1, 1, T0) is Verdict.DUPLICATE


def test_out_of_order_within_window_accepted_once(make_store):
    s = make_store()
    for i in (5, 3, 4, 1, 2):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.NEW
    for i in range(1, 6):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 6, T0) is Verdict.NEW


def test_window_edge(make_store):
    n = 1024
    s = make_store(window_size=n)
    top = 5000
    assert s.check_and_mark(A, 1, top, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, top - (n - 1), T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, top - (n - 1), T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, top - n, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, 0, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, top + 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, top - (n - 1), T0) is Verdict.TOO_OLD


def test_window_not_a_power_of_two(make_store):
    n = 1500  # Redis rounds its ring up to 2048 bits; the window stays 1500
    s = make_store(window_size=n)
    assert s.check_and_mark(A, 1, 10_000, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10_000 - (n - 1), T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10_000 - n, T0) is Verdict.TOO_OLD
    for step in range(1, 700):  # slide by odd amounts: marks survive, old ids leave
        assert s.check_and_mark(A, 1, 10_000 + 3 * step, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10_000 + 3 * 699 - 3, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 10_000 + 3 * 699 - 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10_000 + 3 * 699 - n, T0) is Verdict.TOO_OLD


def test_sliding_clears_what_the_window_left_behind(make_store):
    """Ids that leave the window free their bitmap slots (Redis reuses them: slot = id mod ring size)."""
    s = make_store()
    for i in range(1, 1025):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 1124, T0) is Verdict.NEW  # slides by 100 (whole bytes and edges)
    for i in (1, 100):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.TOO_OLD
    for i in (101, 500, 1024):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.DUPLICATE
    for i in range(1025, 1124):  # their slots held ids 1..99: cleared, so these are new
        assert s.check_and_mark(A, 1, i, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 1124 + 1023, T0) is Verdict.NEW  # slide by 1023, across the ring's end
    assert s.check_and_mark(A, 1, 1124, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 1123, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, 1125, T0) is Verdict.NEW


def test_larger_window(make_store):
    s = make_store(window_size=4096)
    assert s.check_and_mark(A, 1, 5000, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 5000 - 4095, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 5000 - 4096, T0) is Verdict.TOO_OLD


def test_big_jump_clears_bitmap(make_store):
    s = make_store()
    assert s.check_and_mark(A, 1, 10, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10 + 10_000, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10 + 10_000 - 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10 + 10_000 - 1024, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, 10, T0) is Verdict.TOO_OLD
    # a jump of exactly the ring size (1024 here) keeps nothing of the old window
    assert s.check_and_mark(A, 2, 0, T0) is Verdict.NEW
    assert s.check_and_mark(A, 2, 1024, T0) is Verdict.NEW
    assert s.check_and_mark(A, 2, 1024 - 1023, T0) is Verdict.NEW


def test_wraparound_at_2_64(make_store):
    s = make_store()
    ids = [U64 - 3, U64 - 2, U64 - 1, 0, 1, 2]
    for i in ids:
        assert s.check_and_mark(A, 1, i, T0) is Verdict.NEW
    for i in ids:
        assert s.check_and_mark(A, 1, i, T0) is Verdict.DUPLICATE
    s2 = make_store()
    assert s2.check_and_mark(A, 1, 1, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 1, U64 - 1, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 1, 0, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 1, U64 - 1024, T0) is Verdict.TOO_OLD  # 1025 behind 1
    assert s2.check_and_mark(A, 1, U64 - 1022, T0) is Verdict.NEW  # 1023 behind 1
    # across the 32-bit boundary too (Redis splits ids into halves)
    assert s2.check_and_mark(A, 2, 2**32 - 1, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 2, 2**32 + 5, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 2, 2**32 - 1, T0) is Verdict.DUPLICATE
    assert s2.check_and_mark(A, 2, 2**32 - 2, T0) is Verdict.NEW


def test_half_space_away_is_too_old(make_store):
    s = make_store()
    assert s.check_and_mark(A, 1, 0, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 2**63, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, 2**63 - 1, T0) is Verdict.NEW


def test_window_matches_reference_model(make_store, kind):
    """Against a set-based model on unwrapped ids: new iff unseen and within N of the highest
    accepted. The in-memory store gets many more examples (each one is cheap there)."""
    n = 1024
    examples, longest = (300, 200) if kind == "memory" else (25, 80)

    @settings(max_examples=examples, deadline=None)
    @given(
        base=st.sampled_from([0, 1, U64 - 700, U64 - 1, 2**63 - 50, 2**32 - 3]),
        offsets=st.lists(st.integers(0, 3000), min_size=1, max_size=longest),
    )
    def check(base, offsets):
        s = make_store(window_size=n)
        seen: set[int] = set()
        highest: int | None = None
        for x in offsets:
            v = s.check_and_mark(A, 1, (base + x) % U64, T0)
            if highest is not None and x <= highest - n:
                expected = Verdict.TOO_OLD
            elif x in seen:
                expected = Verdict.DUPLICATE
            else:
                expected = Verdict.NEW
            assert v is expected, (x, highest)
            if v is Verdict.NEW:
                seen.add(x)
                highest = x if highest is None else max(highest, x)

    check()


# --- expiry (explicit now_us) ---------------------------------------------------------------


def test_expiry_after_twice_max_skew(make_store):
    s = make_store()
    for k in range(20):
        s.check_and_mark(A, k, 1, T0)
    s.check_and_mark(B, 1, 1, T0 + 1_000_000)
    assert count(s) == 21
    assert s.expire(T0 + 2 * SKEW) == 0  # kept at exactly 2 x max_skew
    assert count(s) == 21
    assert s.expire(T0 + 2 * SKEW + 1) == 20
    assert count(s) == 1
    assert s.expire(T0 + 1_000_000 + 2 * SKEW + 1) == 1
    assert count(s) == 0
    # the window is gone: the same ids start a fresh window
    assert s.check_and_mark(A, 0, 1, T0 + 3 * SKEW) is Verdict.NEW


def test_expiry_is_by_newest_arrival_and_runs_inside_checks(make_store):
    s = make_store()
    s.check_and_mark(A, 1, 1, T0)
    s.check_and_mark(B, 1, 1, T0)
    s.check_and_mark(A, 1, 2, T0 + 100 * 1_000_000)  # A's session refreshed
    s.check_and_mark(B, 2, 1, T0 + 2 * SKEW + 1)  # a check alone drops B's first window
    assert count(s) == 2
    assert s.check_and_mark(A, 1, 2, T0 + 2 * SKEW + 1) is Verdict.DUPLICATE
    assert s.check_and_mark(B, 1, 1, T0 + 2 * SKEW + 1) is Verdict.NEW  # B/1 was forgotten


def test_expired_window_cannot_reopen_a_replay(make_store):
    guard = ReplayGuard(make_store())
    ts = T0 + SKEW
    assert guard.check_and_mark(A, 1, 1, ts, T0) is Verdict.NEW
    assert guard.check_and_mark(A, 1, 1, ts, T0 + 2 * SKEW) is Verdict.DUPLICATE
    with pytest.raises(MessageRejected) as exc_info:
        guard.check_and_mark(A, 1, 1, ts, T0 + 3 * SKEW + 1)
    assert exc_info.value.reason == "stale_message"


def test_clock_stepping_back_never_expires_early(make_store):
    s = make_store()
    s.check_and_mark(A, 1, 1, T0 + 10 * SKEW)
    s.check_and_mark(B, 1, 1, T0)  # clock went back; B counts as seen at the high-water mark
    assert s.expire(T0 + 12 * SKEW) == 0
    assert count(s) == 2
    assert s.check_and_mark(B, 1, 1, T0 + 12 * SKEW) is Verdict.DUPLICATE


def test_session_cap_refuses_new_sessions_without_evicting(make_store):
    s = make_store(max_sessions=3, sessions_per_tenant=3)
    for k in range(3):
        s.check_and_mark(A, k, 1, T0)
    with pytest.raises(MessageRejected) as ei:
        s.check_and_mark(A, 99, 1, T0 + 1)
    assert ei.value.reason == "replay_store_full"
    assert isinstance(ei.value, MessageRejected)
    assert ei.value.reason == "replay_store_full"
    with pytest.raises(MessageRejected) as exc_info:
        s.reserve(A, 99, 1, T0 + 1)
    assert exc_info.value.reason == "replay_store_full"
    assert s.check_and_mark(A, 0, 1, T0 + 1) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 0, 2, T0 + 1) is Verdict.NEW
    assert s.check_and_mark(A, 99, 1, T0 + 2 * SKEW + 1) is Verdict.NEW
    assert count(s) == 2


def test_one_tenant_holds_at_most_its_share_of_the_sessions(make_store):
    """1 % of max_sessions per sender and per neighbour (``via``): over it, the tenant's own new
    session is refused while every other tenant's first session is admitted."""
    s = make_store(max_sessions=1000)  # the default share: 1 %, 10 sessions
    for k in range(10):
        assert s.reserve(A, k, 1, T0) is Verdict.NEW
    with pytest.raises(
        MessageRejected, match=r"sender aaaa.* holds 10 sessions.*sessions_per_tenant 10"
    ) as exc_info:
        s.reserve(A, 10, 1, T0)
    assert exc_info.value.reason == "replay_store_full"
    assert s.check_and_mark(A, 3, 2, T0) is Verdict.NEW  # its live sessions go on
    assert s.reserve(B, 0, 1, T0) is Verdict.NEW  # another sender's first session
    # a neighbour's FORWARDs: sessions of many senders count toward the relay that brought them
    relay, others = "r" * 64, [f"{i:064x}" for i in range(1, 13)]
    for sender in others[:10]:
        assert s.check_and_mark(sender, 0, 1, T0, via=relay) is Verdict.NEW
    with pytest.raises(MessageRejected, match=r"neighbour rrrr.* brought in 10 sessions") as exc_info:
        s.check_and_mark(others[10], 0, 1, T0, via=relay)
    assert exc_info.value.reason == "replay_store_full"
    assert s.check_and_mark(others[11], 0, 1, T0) is Verdict.NEW  # the same sender, directly
    assert count(s) == 22
    # sessions kept alive keep counting (also when a message of one comes by another path) ...
    for k in range(10):
        assert s.check_and_mark(A, k, 5, T0 + SKEW) is Verdict.NEW
    for sender in others[:10]:
        assert s.check_and_mark(sender, 0, 5, T0 + SKEW) is Verdict.NEW
    with pytest.raises(MessageRejected) as exc_info:
        s.reserve(A, 10, 1, T0 + 2 * SKEW + 1)
    assert exc_info.value.reason == "replay_store_full"
    with pytest.raises(MessageRejected) as exc_info:
        s.reserve(others[10], 0, 1, T0 + 2 * SKEW + 1, via=relay)
    assert exc_info.value.reason == "replay_store_full"
    # ... and leave the share once they expired
    assert s.reserve(A, 10, 1, T0 + 4 * SKEW + 2) is Verdict.NEW
    assert s.reserve(others[10], 0, 1, T0 + 4 * SKEW + 2, via=relay) is Verdict.NEW
    assert count(s) == 2


def test_tenant_share_config():
    assert ReplayConfig().tenant_sessions == 1000
    assert ReplayConfig(max_sessions=50).tenant_sessions == 1
    assert ReplayConfig(max_sessions=50, sessions_per_tenant=50).tenant_sessions == 50
    for bad in (0, 51):
        with pytest.raises(ConfigError, match="sessions_per_tenant"):
            ReplayConfig(max_sessions=50, sessions_per_tenant=bad)


# --- two phase -------------------------------------------------------------------------------


def test_reserve_commit(make_store):
    s = make_store()
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    assert s.reserve(A, 1, 1, T0) is Verdict.IN_PROGRESS
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.IN_PROGRESS
    assert s.pending_count == 1  # type: ignore[attr-defined]
    s.commit(A, 1, 1, T0)
    assert s.pending_count == 0  # type: ignore[attr-defined]
    assert s.reserve(A, 1, 1, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.DUPLICATE


def test_reserve_release_lets_a_retransmission_through(make_store):
    s = make_store()
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    s.release(A, 1, 1, T0)
    assert s.reserve(A, 1, 1, T0 + 5) is Verdict.NEW
    s.commit(A, 1, 1, T0 + 6)
    assert s.reserve(A, 1, 1, T0 + 7) is Verdict.DUPLICATE
    s.release(A, 1, 1, T0 + 8)  # releasing a committed id does not un-commit it
    assert s.check_and_mark(A, 1, 1, T0 + 9) is Verdict.DUPLICATE


def test_reservations_out_of_order_and_interleaved(make_store):
    s = make_store()
    assert s.reserve(A, 1, 3, T0) is Verdict.NEW
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 2, T0) is Verdict.NEW
    s.release(A, 1, 3, T0)
    s.commit(A, 1, 1, T0)
    assert s.reserve(A, 1, 1, T0) is Verdict.DUPLICATE
    assert s.reserve(A, 1, 2, T0) is Verdict.DUPLICATE
    assert s.reserve(A, 1, 3, T0) is Verdict.NEW


def test_commit_without_reserve_ahead_of_the_window(make_store):
    s = make_store()
    assert s.check_and_mark(A, 1, 10, T0) is Verdict.NEW
    s.commit(A, 1, 20, T0)  # advances the window to 20 and marks it
    assert s.check_and_mark(A, 1, 20, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 15, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10, T0) is Verdict.DUPLICATE


def test_reservations_leave_with_the_window(make_store):
    s = make_store()
    for i in range(1, 1301):
        assert s.reserve(A, 1, i, T0) is Verdict.NEW
    assert s.pending_count == 1024  # type: ignore[attr-defined]  # reservations that left were dropped
    s.commit(A, 1, 1, T0)  # long gone: harmless
    s.release(A, 1, 2, T0)
    assert s.reserve(A, 1, 2, T0) is Verdict.TOO_OLD
    assert s.reserve(A, 1, 1300 - 1023, T0) is Verdict.IN_PROGRESS
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.TOO_OLD


def test_commit_or_release_after_expiry_is_a_noop(make_store):
    s = make_store()
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    s.commit(A, 1, 1, T0 + 2 * SKEW + 1)
    s.release(A, 1, 1, T0 + 2 * SKEW + 1)
    assert count(s) == 0


def test_guard_two_phase_and_require_new(make_store):
    guard = ReplayGuard(make_store())
    assert guard.reserve(A, 1, 1, T0, T0) is Verdict.NEW
    with pytest.raises(MessageRejected, match="being handled") as exc_info:
        require_new(guard.reserve(A, 1, 1, T0, T0), A, 1, 1)
    assert exc_info.value.reason == "replayed_message"
    guard.commit(A, 1, 1, T0)
    with pytest.raises(MessageRejected, match="already accepted") as exc_info:
        require_new(guard.check_and_mark(A, 1, 1, T0, T0))
    assert exc_info.value.reason == "replayed_message"
    require_new(guard.check_and_mark(A, 1, 5000, T0, T0))
    with pytest.raises(MessageRejected, match="older than the replay window") as exc_info:
        require_new(guard.check_and_mark(A, 1, 2, T0, T0))
    assert exc_info.value.reason == "replayed_message"
    assert guard.expire(T0 + 2 * SKEW + 1) == 1


# --- where a session stands, and leases ------------------------------------------------------


def test_frontier_is_the_highest_id_done(make_store):
    s = make_store()
    assert s.frontier(A, 1, T0) is None  # no window
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    assert s.frontier(A, 1, T0, exclude={1}) is None  # reserved by the caller: nothing done yet
    s.commit(A, 1, 1, T0)
    assert s.frontier(A, 1, T0) == 1
    assert s.check_and_mark(A, 1, 3, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 2, T0) is Verdict.NEW
    assert s.reserve(A, 1, 5, T0) is Verdict.NEW
    assert s.reserve(A, 1, 4, T0) is Verdict.NEW
    assert s.frontier(A, 1, T0, exclude={4, 5}) == 3
    s.release(A, 1, 5, T0)
    s.commit(A, 1, 4, T0)
    assert s.frontier(A, 1, T0) == 4
    assert s.frontier(B, 1, T0) is None
    assert s.frontier(A, 2, T0) is None
    assert s.frontier(A, 1, T0 + 2 * SKEW + 1) is None  # the window expired


def test_frontier_across_the_wrap_and_far_behind(make_store):
    s = make_store()
    assert s.check_and_mark(A, 7, U64 - 2, T0) is Verdict.NEW
    assert s.reserve(A, 7, 1, T0) is Verdict.NEW
    assert s.frontier(A, 7, T0, exclude={1}) == U64 - 2
    assert s.reserve(A, 7, 5000, T0) is Verdict.NEW  # the done id left the window
    assert s.frontier(A, 7, T0, exclude={1, 5000}) is None
    assert s.check_and_mark(A, 7, 4990, T0) is Verdict.NEW
    assert s.frontier(A, 7, T0, exclude={1, 5000}) == 4990


def test_renew_reports_what_is_still_held(make_store, kind):
    s = make_store()
    assert s.reservation_lease_us == (None if kind == "memory" else DEFAULT_RESERVATION_LEASE_US)
    assert s.renew([], T0) == 0
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    assert s.reserve(A, 1, 2, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 3, T0) is Verdict.NEW
    # held, held, done (not reserved), unknown id, unknown session
    assert s.renew([(A, 1, 1), (A, 1, 2), (A, 1, 3), (A, 1, 9), (B, 1, 1)], T0 + 1) == 2
    s.commit(A, 1, 1, T0 + 2)
    s.release(A, 1, 2, T0 + 2)
    assert s.renew([(A, 1, 1), (A, 1, 2)], T0 + 3) == 0
    # renewing never reserves: a copy of a released id is new
    assert s.reserve(A, 1, 2, T0 + 4) is Verdict.NEW


# === what the persistent stores add ============================================================


@pytest.fixture(params=["sqlite", "redis"])
def persistent(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., ReplayStore]]:
    """``open_store(**options)``: open (again) the same persistent store, as after a restart."""
    made: list[SqliteReplayStore | RedisReplayStore] = []
    path = tmp_path / "replay.db"
    prefix = f"test:{uuid.uuid4().hex}"
    url = request.getfixturevalue("redis_url") if request.param == "redis" else ""

    def open_store(config: ReplayConfig | None = None, **kw: int) -> ReplayStore:
        if request.param == "sqlite":
            s: SqliteReplayStore | RedisReplayStore = SqliteReplayStore(
                path, config, synchronous="NORMAL", **kw
            )
        else:
            s = RedisReplayStore(url, config, key_prefix=prefix, started_at_us=T0, **kw)
        made.append(s)
        return s

    yield open_store
    for s in made:
        s.close()


def test_reopened_store_refuses_what_it_saw_before(persistent):
    """A node restarts; a message captured before the restart is refused after it."""
    first = persistent()
    guard = ReplayGuard(first)
    assert guard.reserve(A, 9, 41, T0, T0) is Verdict.NEW
    guard.commit(A, 9, 41, T0)
    assert guard.check_and_mark(A, 9, 42, T0, T0) is Verdict.NEW
    first.close()  # type: ignore[attr-defined]
    again = ReplayGuard(persistent())
    with pytest.raises(MessageRejected) as exc_info:
        require_new(again.check_and_mark(A, 9, 41, T0, T0 + 1_000_000))
    assert exc_info.value.reason == "replayed_message"
    with pytest.raises(MessageRejected) as exc_info:
        require_new(again.check_and_mark(A, 9, 42, T0, T0 + 1_000_000))
    assert exc_info.value.reason == "replayed_message"
    assert again.check_and_mark(A, 9, 43, T0, T0 + 1_000_000) is Verdict.NEW


def test_reservation_lapses_when_its_holder_never_finishes(persistent):
    first = persistent(reservation_lease_us=10_000_000)
    assert first.reserve(A, 1, 7, T0) is Verdict.NEW
    # the holder "crashes"; a second process sees the reservation until it lapses
    second = persistent(reservation_lease_us=10_000_000)
    assert second.reserve(A, 1, 7, T0 + 10_000_000) is Verdict.IN_PROGRESS
    assert second.reserve(A, 1, 7, T0 + 10_000_001) is Verdict.NEW
    second.commit(A, 1, 7, T0 + 10_000_002)
    assert first.check_and_mark(A, 1, 7, T0 + 10_000_003) is Verdict.DUPLICATE
    # a commit after a lapse still marks the id done
    assert first.reserve(A, 1, 8, T0 + 10_000_003) is Verdict.NEW
    first.commit(A, 1, 8, T0 + 30_000_000)
    assert second.check_and_mark(A, 1, 8, T0 + 30_000_001) is Verdict.DUPLICATE


def test_a_renewed_reservation_outlives_its_lease(persistent):
    """The holder renews every third of the lease; a reservation it stopped renewing (it died)
    lapses a lease after the last renewal, and is never renewed again."""
    s = persistent(reservation_lease_us=1_000_000)
    other = persistent(reservation_lease_us=1_000_000)  # another process on the same store
    assert s.reservation_lease_us == 1_000_000
    assert s.reserve(A, 1, 7, T0) is Verdict.NEW
    assert s.renew([(A, 1, 7)], T0 + 900_000) == 1
    assert other.reserve(A, 1, 7, T0 + 1_800_000) is Verdict.IN_PROGRESS  # lapses at T0 + 1.9 s now
    assert s.renew([(A, 1, 7), (A, 1, 8), (B, 1, 7)], T0 + 1_900_000) == 1
    assert other.reserve(A, 1, 7, T0 + 2_900_000) is Verdict.IN_PROGRESS
    # the holder fell silent: lapsed a lease after its last renewal, and no renewal brings it back
    assert s.renew([(A, 1, 7)], T0 + 2_900_001) == 0
    assert other.reserve(A, 1, 7, T0 + 2_900_002) is Verdict.NEW
    other.commit(A, 1, 7, T0 + 2_900_003)
    assert s.renew([(A, 1, 7)], T0 + 2_900_004) == 0
    assert s.check_and_mark(A, 1, 7, T0 + 2_900_005) is Verdict.DUPLICATE


def test_frontier_counts_what_another_holder_reserved(persistent):
    """A process killed between its answer and its commit leaves its ids reserved: they count
    (their senders may never send them again) until their lease lapses."""
    first = persistent(reservation_lease_us=1_000_000)
    for i in (1, 2, 3):
        assert first.check_and_mark(A, 1, i, T0) is Verdict.NEW
    assert first.reserve(A, 1, 4, T0) is Verdict.NEW
    assert first.reserve(A, 1, 5, T0) is Verdict.NEW
    first.close()  # type: ignore[attr-defined]
    second = persistent(reservation_lease_us=1_000_000)
    assert second.reserve(A, 1, 6, T0 + 1) is Verdict.NEW
    assert second.frontier(A, 1, T0 + 2, exclude={6}) == 5
    assert second.frontier(A, 1, T0 + 2) == 6  # without the caller's own
    assert second.frontier(A, 1, T0 + 1_000_001, exclude={6}) == 3  # 4 and 5 lapsed


def test_pending_is_bounded(persistent):
    s = persistent()
    for i in range(1, 2101):
        assert s.reserve(A, 1, i, T0) is Verdict.NEW
    assert 1024 <= s.pending_count <= 1025  # type: ignore[attr-defined]


def test_window_size_grown_between_runs_is_conservative(persistent):
    s = persistent()
    assert s.check_and_mark(A, 1, 5000, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 4000, T0) is Verdict.NEW
    bigger = persistent(ReplayConfig(window_size=2048))
    # which ids the smaller window saw is partly unknown: refused, never accepted twice
    assert bigger.check_and_mark(A, 1, 4000, T0) is not Verdict.NEW
    assert bigger.check_and_mark(A, 1, 5000, T0) is not Verdict.NEW
    assert bigger.check_and_mark(A, 1, 5001, T0) is Verdict.NEW


def test_store_window_is_capped():
    with pytest.raises(ConfigError):
        SqliteReplayStore(":memory:", ReplayConfig(window_size=(1 << 16) + 1))
    with pytest.raises(ConfigError):
        SqliteReplayStore(":memory:", reservation_lease_us=0)


# --- SQLite ----------------------------------------------------------------------------------

_CHILD_SQLITE = textwrap.dedent(
    """
    import sys
    from iac.stores.sqlite import SqliteReplayStore
    path, first, last, now = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = SqliteReplayStore(path, synchronous="NORMAL")
    print("ready", flush=True)
    sys.stdin.readline()  # start together with the other process
    print(",".join(s.check_and_mark("a" * 64, 5, i, now).value for i in range(first, last)))
    s.close()
    """
)

_CHILD_REDIS = textwrap.dedent(
    """
    import sys
    from iac.stores.redis import RedisReplayStore
    url, prefix = sys.argv[1], sys.argv[2]
    first, last, now = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    s = RedisReplayStore(url, key_prefix=prefix, started_at_us=now)
    print("ready", flush=True)
    sys.stdin.readline()  # start together with the other process
    print(",".join(s.check_and_mark("a" * 64, 5, i, now).value for i in range(first, last)))
    s.close()
    """
)


def _children(code: str, n: int, *args: object) -> list[subprocess.Popen[str]]:
    """Start ``n`` processes running ``code``; release them together once all have opened their store."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready", p.stderr.read() if p.stderr else ""
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs


def _verdicts(proc: subprocess.Popen[str]) -> list[str]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out.strip().split(",")


def test_sqlite_restart_in_a_real_process(tmp_path):
    """A process accepts messages and exits; the next process on the same file refuses them."""
    path = tmp_path / "replay.db"
    assert _verdicts(_children(_CHILD_SQLITE, 1, path, 1, 4, T0)[0]) == ["new"] * 3
    with SqliteReplayStore(path) as s:
        assert s.history_start_us is None
        for i in (1, 2, 3):
            assert s.check_and_mark(A, 5, i, T0 + 1) is Verdict.DUPLICATE
        assert s.check_and_mark(A, 5, 4, T0 + 1) is Verdict.NEW


def test_sqlite_two_processes_race_each_id_new_once(tmp_path):
    path = tmp_path / "replay.db"
    SqliteReplayStore(path).close()  # create the schema first
    procs = _children(_CHILD_SQLITE, 2, path, 1, 1501, T0)  # long enough for the two to interleave
    results = [_verdicts(p) for p in procs]
    for i in range(1500):  # exactly one process accepted each id; the other refused it
        verdicts = [r[i] for r in results]
        assert verdicts.count("new") == 1, (i, verdicts)
        assert set(verdicts) - {"new"} <= {"duplicate", "too_old"}, (i, verdicts)


def test_sqlite_records_a_start_only_when_it_creates_the_file(tmp_path):
    path = tmp_path / "replay.db"
    with SqliteReplayStore(path, started_at_us=T0) as s:
        assert s.history_start_us == T0
    with SqliteReplayStore(path, started_at_us=T0 + 99) as s:
        assert s.history_start_us == T0  # the recorded start stays
    with pytest.raises(MessageRejected, match="before the replay store started") as exc_info:
        ReplayGuard(SqliteReplayStore(tmp_path / "other.db", started_at_us=T0)).check_fresh(T0 - 1, T0)
    assert exc_info.value.reason == "stale_message"


def test_sqlite_file_from_before_the_tenant_shares_is_kept(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    with SqliteReplayStore(path) as s:
        assert s.check_and_mark(A, 1, 7, T0) is Verdict.NEW
    db = sqlite3.connect(path)
    db.execute("DROP INDEX iac_replay_window_via")
    db.execute("ALTER TABLE iac_replay_window DROP COLUMN via")  # as the file was written before
    db.commit()
    db.close()
    with SqliteReplayStore(path) as s:
        assert s.check_and_mark(A, 1, 7, T0 + 1) is Verdict.DUPLICATE
        assert s.check_and_mark(A, 2, 1, T0 + 1, via=B) is Verdict.NEW


def test_sqlite_unusable_file_is_a_typed_error(tmp_path):
    with pytest.raises(StoreUnavailable) as ei:
        SqliteReplayStore(tmp_path)  # a directory
    assert isinstance(ei.value, TransportError)
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    with pytest.raises(StoreUnavailable):
        SqliteReplayStore(tmp_path / "junk.db")


def test_sqlite_busy_beyond_its_timeout_is_a_typed_error(tmp_path):
    import sqlite3

    path = tmp_path / "replay.db"
    s = SqliteReplayStore(path, busy_timeout_s=0.05)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(StoreUnavailable, match="locked"):
            s.check_and_mark(A, 1, 1, T0)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.NEW
    s.close()


# --- Redis -----------------------------------------------------------------------------------


def test_redis_two_stores_share_one_server(redis_url):
    prefix = f"test:{uuid.uuid4().hex}"
    with (
        RedisReplayStore(redis_url, key_prefix=prefix, started_at_us=T0) as one,
        RedisReplayStore(redis_url, key_prefix=prefix, started_at_us=T0 + 5) as two,
    ):
        assert two.history_start_us == T0  # the prefix's history began with the first
        assert one.check_and_mark(A, 1, 1, T0) is Verdict.NEW
        assert two.check_and_mark(A, 1, 1, T0) is Verdict.DUPLICATE
        assert two.reserve(A, 1, 2, T0) is Verdict.NEW
        assert one.reserve(A, 1, 2, T0) is Verdict.IN_PROGRESS
        two.commit(A, 1, 2, T0)
        assert one.reserve(A, 1, 2, T0) is Verdict.DUPLICATE


def test_redis_another_process_accepted_it_first(redis_url):
    """Two nodes (processes) share one Redis: what one accepted, the other refuses."""
    prefix = f"test:{uuid.uuid4().hex}"
    assert _verdicts(_children(_CHILD_REDIS, 1, redis_url, prefix, 1, 4, T0)[0]) == ["new"] * 3
    with RedisReplayStore(redis_url, key_prefix=prefix) as s:
        guard = ReplayGuard(s)
        for i in (1, 2, 3):
            with pytest.raises(MessageRejected) as exc_info:
                require_new(guard.check_and_mark(A, 5, i, T0, T0 + 1))
            assert exc_info.value.reason == "replayed_message"
        assert s.check_and_mark(A, 5, 4, T0 + 1) is Verdict.NEW


def test_redis_two_processes_race_each_id_new_once(redis_url):
    prefix = f"test:{uuid.uuid4().hex}"
    RedisReplayStore(redis_url, key_prefix=prefix, started_at_us=T0).close()
    procs = _children(_CHILD_REDIS, 2, redis_url, prefix, 1, 301, T0)
    results = [_verdicts(p) for p in procs]
    for i in range(300):
        assert sorted(r[i] for r in results) == ["duplicate", "new"], i


def test_redis_keys_have_a_ttl_of_twice_max_skew(redis_url, redis_client):
    skew_us = 30_000_000
    with RedisReplayStore(
        redis_url, ReplayConfig(max_skew_us=skew_us), key_prefix=f"t:{uuid.uuid4().hex}"
    ) as s:
        assert s.reserve(A, 3, 1, T0) is Verdict.NEW
        assert s.check_and_mark(A, 3, 2, T0) is Verdict.NEW
        keys = [s.session_key(k, A, 3) for k in ("w", "b", "p")]
        keys += [f"{s.key_prefix}:clock", f"{s.key_prefix}:sessions"]
        for key in keys:
            ttl = redis_client.pttl(key)
            assert 2 * skew_us // 1000 - 5_000 < ttl <= 2 * skew_us // 1000, (key, ttl)
        assert redis_client.pttl(f"{s.key_prefix}:epoch") == -1  # the epoch never expires


def test_redis_keys_expire_by_redis_clock(redis_url, redis_client):
    """With a 100 ms retention, Redis itself deletes the session's keys (polled, with a deadline)."""
    with RedisReplayStore(
        redis_url, ReplayConfig(max_skew_us=50_000), key_prefix=f"t:{uuid.uuid4().hex}"
    ) as s:
        assert s.check_and_mark(A, 4, 1, T0) is Verdict.NEW
        key = s.session_key("w", A, 4)
        assert redis_client.exists(key) == 1
        eventually_sync(lambda: redis_client.exists(key) == 0, 5, message=f"{key} still exists")
        assert redis_client.exists(s.session_key("b", A, 4)) == 0


def test_redis_lost_history_is_detected(redis_url, redis_client):
    """Redis restarted without persistence: the store refuses the message that notices, then starts over."""
    with RedisReplayStore(redis_url, key_prefix=f"t:{uuid.uuid4().hex}", started_at_us=T0) as s:
        assert s.history_start_us == T0
        assert s.check_and_mark(A, 1, 1, T0) is Verdict.NEW
        keys = list(redis_client.scan_iter(match=f"{s.key_prefix}:*"))
        redis_client.delete(*keys)  # what a restart without persistence does
        now = T0 + 5_000_000
        with pytest.raises(MessageRejected, match="lost its history") as exc_info:
            s.check_and_mark(A, 1, 1, now)
        assert exc_info.value.reason == "stale_message"
        assert s.history_start_us == now
        guard = ReplayGuard(s)
        with pytest.raises(MessageRejected, match="before the replay store started") as exc_info:
            guard.check_and_mark(A, 1, 1, T0, now)  # the old capture is refused as stale
        assert exc_info.value.reason == "stale_message"
        assert guard.check_and_mark(A, 1, 1, now, now) is Verdict.NEW


def test_redis_unreachable_is_a_typed_transport_error(redis_url):
    port = _free_port()  # nothing listens there
    with pytest.raises(StoreUnavailable) as ei:
        RedisReplayStore(f"redis://127.0.0.1:{port}/0", timeout_s=0.5)
    assert isinstance(ei.value, TransportError)
    assert ei.value.reason == "store_unavailable"


def test_redis_server_restart_mid_use(tmp_path):
    """The server dies (StoreUnavailable), comes back empty (lost history detected); the store recovers."""
    server = start_redis(tmp_path)
    try:
        with RedisReplayStore(server.url, key_prefix="restart", started_at_us=T0, timeout_s=0.5) as s:
            assert s.check_and_mark(A, 1, 1, T0) is Verdict.NEW
            server.stop()
            with pytest.raises(StoreUnavailable) as ei:
                s.check_and_mark(A, 1, 2, T0)
            assert isinstance(ei.value, TransportError)
            assert server.start(), "redis-server did not come back on its port"
            now = T0 + 1_000_000
            with pytest.raises(MessageRejected, match="lost its history") as exc_info:
                s.check_and_mark(A, 1, 1, now)  # the script is loaded again (EVALSHA falls back)
            assert exc_info.value.reason == "stale_message"
            guard = ReplayGuard(s)
            with pytest.raises(MessageRejected) as exc_info:
                guard.check_and_mark(A, 1, 1, T0, now)  # captured before the restart: refused
            assert exc_info.value.reason == "stale_message"
            assert guard.check_and_mark(A, 1, 1, now, now) is Verdict.NEW
    finally:
        server.stop()


def test_redis_accepts_a_caller_client_and_decoded_responses(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    s = RedisReplayStore(client, key_prefix=f"t:{uuid.uuid4().hex}", started_at_us=T0)
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.DUPLICATE
    assert s.reserve(A, 1, 3, T0) is Verdict.NEW
    assert s.renew([(A, 1, 3)], T0) == 1
    assert s.frontier(A, 1, T0) == 3
    assert s.frontier(A, 1, T0, exclude={3}) == 1
    assert s.expire(T0 + 2 * SKEW + 1) == 1
    s.close()  # not ours: the client stays open
    assert client.ping()
    client.close()
