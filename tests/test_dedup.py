"""Anti-replay: freshness, the per-session window, expiry and two-phase check-and-set."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from iac.errors import ConfigError, MessageRejected, ReplayedMessage, ReplayStoreFull, StaleMessage
from iac.protocol.replay import (
    ReplayConfig,
    ReplayGuard,
    ReplayStore,
    Verdict,
    check_freshness,
    require_new,
    serial_add,
    serial_diff,
)
from iac.stores.memory import MemoryReplayStore

T0 = 1_700_000_000_000_000  # a fixed "now" in microseconds
SKEW = 60_000_000
A = "a" * 64
B = "b" * 64
U64 = 2**64


def store(**kw: int) -> MemoryReplayStore:
    return MemoryReplayStore(started_at_us=T0, config=ReplayConfig(**kw))


# --- serial arithmetic ----------------------------------------------------------------------


def test_serial_diff_wraps():
    assert serial_diff(0, U64 - 1) == 1
    assert serial_diff(U64 - 1, 0) == -1
    assert serial_diff(5, 5) == 0
    assert serial_diff(2**63 - 1, 0) == 2**63 - 1
    # exactly half way is undefined in RFC 1982; we call it "older"
    assert serial_diff(2**63, 0) == -(2**63)
    assert serial_diff(0, 2**63) == -(2**63)
    assert serial_add(U64 - 1, 2) == 1


@given(st.integers(0, U64 - 1), st.integers(-(2**63) + 1, 2**63 - 1))
def test_serial_add_diff_roundtrip(a, n):
    assert serial_diff(serial_add(a, n), a) == n


# --- config ----------------------------------------------------------------------------------


def test_config_defaults_and_validation():
    c = ReplayConfig()
    assert (c.window_size, c.max_skew_us, c.max_sessions) == (1024, 60_000_000, 100_000)
    assert c.retention_us == 120_000_000
    with pytest.raises(ConfigError):
        ReplayConfig(window_size=1023)
    with pytest.raises(ConfigError):
        ReplayConfig(max_skew_us=0)
    with pytest.raises(ConfigError):
        ReplayConfig(max_sessions=0)


def test_memory_store_is_a_replay_store():
    assert isinstance(store(), ReplayStore)


def test_out_of_range_ids_refused():
    s = store()
    with pytest.raises(ConfigError):
        s.check_and_mark(A, 1, -1, T0)
    with pytest.raises(ConfigError):
        s.check_and_mark(A, 1, U64, T0)
    with pytest.raises(ConfigError):
        s.check_and_mark(A, U64, 1, T0)


# --- freshness -------------------------------------------------------------------------------


def test_freshness_edges():
    check_freshness(T0 - SKEW, T0, SKEW)
    check_freshness(T0 + SKEW, T0, SKEW)
    with pytest.raises(StaleMessage, match="past"):
        check_freshness(T0 - SKEW - 1, T0, SKEW)
    with pytest.raises(StaleMessage, match="future"):
        check_freshness(T0 + SKEW + 1, T0, SKEW)


def test_history_less_store_refuses_timestamps_before_its_start():
    s = store()
    guard = ReplayGuard(s)
    now = T0 + 10_000_000
    with pytest.raises(StaleMessage, match="before the replay store started"):
        guard.check_and_mark(A, 1, 1, T0 - 1, now)  # fresh by skew, but before the start
    assert len(s) == 0  # the refusal did not create a window
    assert guard.check_and_mark(A, 1, 1, T0, now) is Verdict.NEW
    assert guard.store is s


def test_guard_refuses_stale_and_future_without_touching_store():
    s = store()
    guard = ReplayGuard(s)
    now = T0 + 100 * SKEW
    with pytest.raises(StaleMessage):
        guard.check_and_mark(A, 1, 1, now - SKEW - 1, now)
    with pytest.raises(StaleMessage):
        guard.reserve(A, 1, 1, now + SKEW + 1, now)
    assert len(s) == 0
    assert guard.check_and_mark(A, 1, 1, now + SKEW, now) is Verdict.NEW


# --- window ----------------------------------------------------------------------------------


def test_duplicate_refused():
    s = store()
    assert s.check_and_mark(A, 7, 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 7, 1, T0) is Verdict.DUPLICATE
    # other session, other sender: independent
    assert s.check_and_mark(A, 8, 1, T0) is Verdict.NEW
    assert s.check_and_mark(B, 7, 1, T0) is Verdict.NEW


def test_out_of_order_within_window_accepted_once():
    s = store()
    for i in (5, 3, 4, 1, 2):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.NEW
    for i in range(1, 6):
        assert s.check_and_mark(A, 1, i, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 6, T0) is Verdict.NEW


def test_window_edge():
    """The window is the N ids ending at the highest: highest - (N-1) is in it, highest - N is not."""
    n = 1024
    s = store(window_size=n)
    top = 5000
    assert s.check_and_mark(A, 1, top, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, top - (n - 1), T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, top - (n - 1), T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, top - n, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, 0, T0) is Verdict.TOO_OLD
    # advancing by one pushes the old edge out
    assert s.check_and_mark(A, 1, top + 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, top - (n - 1), T0) is Verdict.TOO_OLD


def test_larger_window():
    s = store(window_size=4096)
    assert s.check_and_mark(A, 1, 5000, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 5000 - 4095, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 5000 - 4096, T0) is Verdict.TOO_OLD


def test_big_jump_clears_bitmap():
    s = store()
    assert s.check_and_mark(A, 1, 10, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10 + 10_000, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10 + 10_000 - 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 10, T0) is Verdict.TOO_OLD


def test_wraparound_at_2_64():
    s = store()
    ids = [U64 - 3, U64 - 2, U64 - 1, 0, 1, 2]
    for i in ids:
        assert s.check_and_mark(A, 1, i, T0) is Verdict.NEW
    for i in ids:
        assert s.check_and_mark(A, 1, i, T0) is Verdict.DUPLICATE
    # after the wrap, 0 is newer than U64 - 1: out of order across the wrap works too
    s2 = store()
    assert s2.check_and_mark(A, 1, 1, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 1, U64 - 1, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 1, 0, T0) is Verdict.NEW
    assert s2.check_and_mark(A, 1, U64 - 1024, T0) is Verdict.TOO_OLD  # 1025 behind 1
    assert s2.check_and_mark(A, 1, U64 - 1022, T0) is Verdict.NEW  # 1023 behind 1


def test_half_space_away_is_too_old():
    s = store()
    assert s.check_and_mark(A, 1, 0, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 2**63, T0) is Verdict.TOO_OLD
    assert s.check_and_mark(A, 1, 2**63 - 1, T0) is Verdict.NEW  # just under half: newer


@settings(max_examples=300)
@given(
    base=st.sampled_from([0, 1, U64 - 700, U64 - 1, 2**63 - 50]),
    offsets=st.lists(st.integers(0, 3000), min_size=1, max_size=200),
)
def test_window_matches_reference_model(base, offsets):
    """Against a set-based model on unwrapped ids: new iff unseen and within N of the highest accepted."""
    n = 1024
    s = store(window_size=n)
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


# --- expiry ----------------------------------------------------------------------------------


def test_expiry_after_twice_max_skew_frees_memory():
    s = store()
    for k in range(50):
        s.check_and_mark(A, k, 1, T0)
    s.check_and_mark(B, 1, 1, T0 + 1_000_000)
    assert len(s) == 51
    assert s.expire(T0 + 2 * SKEW) == 0  # kept at exactly 2 x max_skew
    assert len(s) == 51
    assert s.expire(T0 + 2 * SKEW + 1) == 50
    assert len(s) == 1
    assert s.expire(T0 + 1_000_000 + 2 * SKEW + 1) == 1
    assert len(s) == 0


def test_expiry_is_by_newest_arrival_and_amortized_in_checks():
    s = store()
    s.check_and_mark(A, 1, 1, T0)
    s.check_and_mark(B, 1, 1, T0)
    s.check_and_mark(A, 1, 2, T0 + 100 * 1_000_000)  # A's session refreshed
    # a check alone (no expire() call) drops B's window
    s.check_and_mark(B, 2, 1, T0 + 2 * SKEW + 1)
    assert len(s) == 2
    assert s.check_and_mark(A, 1, 2, T0 + 2 * SKEW + 1) is Verdict.DUPLICATE


def test_expired_window_cannot_reopen_a_replay():
    """After expiry, a replay is stale: the guard refuses it before the store forgets anything."""
    guard = ReplayGuard(store())
    ts = T0 + SKEW  # sender's clock a full skew ahead: the worst case
    assert guard.check_and_mark(A, 1, 1, ts, T0) is Verdict.NEW
    # at exactly 2 x max_skew the window is still there
    assert guard.check_and_mark(A, 1, 1, ts, T0 + 2 * SKEW) is Verdict.DUPLICATE
    # one microsecond later the window may be gone, and the replay is stale
    with pytest.raises(StaleMessage):
        guard.check_and_mark(A, 1, 1, ts, T0 + 3 * SKEW + 1)


def test_clock_stepping_back_never_expires_early():
    s = store()
    s.check_and_mark(A, 1, 1, T0 + 10 * SKEW)
    s.check_and_mark(B, 1, 1, T0)  # clock went back; B is treated as seen at the high-water mark
    assert s.expire(T0 + 12 * SKEW) == 0
    assert len(s) == 2


def test_session_cap_refuses_new_sessions_without_evicting():
    s = store(max_sessions=3)
    for k in range(3):
        s.check_and_mark(A, k, 1, T0)
    with pytest.raises(ReplayStoreFull) as ei:
        s.check_and_mark(A, 99, 1, T0 + 1)
    assert isinstance(ei.value, MessageRejected)
    assert ei.value.name == "replay_store_full"
    # live sessions are still protected and still usable
    assert s.check_and_mark(A, 0, 1, T0 + 1) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 0, 2, T0 + 1) is Verdict.NEW
    # once the others expire, a new session fits
    assert s.check_and_mark(A, 99, 1, T0 + 2 * SKEW + 1) is Verdict.NEW
    assert len(s) == 2  # sessions 0 (refreshed at T0 + 1) and 99


# --- two phase -------------------------------------------------------------------------------


def test_reserve_commit():
    s = store()
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    assert s.reserve(A, 1, 1, T0) is Verdict.IN_PROGRESS
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.IN_PROGRESS
    assert s.pending_count == 1
    s.commit(A, 1, 1, T0)
    assert s.pending_count == 0
    assert s.reserve(A, 1, 1, T0) is Verdict.DUPLICATE
    assert s.check_and_mark(A, 1, 1, T0) is Verdict.DUPLICATE


def test_reserve_release_lets_a_retransmission_through():
    s = store()
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    s.release(A, 1, 1, T0)
    assert s.reserve(A, 1, 1, T0 + 5) is Verdict.NEW  # the retransmission is handled
    s.commit(A, 1, 1, T0 + 6)
    assert s.reserve(A, 1, 1, T0 + 7) is Verdict.DUPLICATE


def test_reservations_out_of_order_and_interleaved():
    s = store()
    assert s.reserve(A, 1, 3, T0) is Verdict.NEW
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    assert s.check_and_mark(A, 1, 2, T0) is Verdict.NEW
    s.release(A, 1, 3, T0)
    s.commit(A, 1, 1, T0)
    assert s.reserve(A, 1, 1, T0) is Verdict.DUPLICATE
    assert s.reserve(A, 1, 2, T0) is Verdict.DUPLICATE
    assert s.reserve(A, 1, 3, T0) is Verdict.NEW


def test_reservations_are_bounded_by_the_window():
    s = store()
    for i in range(1, 3001):
        assert s.reserve(A, 1, i, T0) is Verdict.NEW
    assert s.pending_count == 1024  # reservations that left the window were dropped
    s.commit(A, 1, 1, T0)  # long gone: harmless
    s.release(A, 1, 2, T0)
    assert s.reserve(A, 1, 2, T0) is Verdict.TOO_OLD
    assert s.reserve(A, 1, 3000 - 1023, T0) is Verdict.IN_PROGRESS


def test_commit_or_release_after_expiry_is_a_noop():
    s = store()
    assert s.reserve(A, 1, 1, T0) is Verdict.NEW
    s.commit(A, 1, 1, T0 + 2 * SKEW + 1)
    s.release(A, 1, 1, T0 + 2 * SKEW + 1)
    assert len(s) == 0


def test_guard_two_phase_and_require_new():
    guard = ReplayGuard(store())
    assert guard.reserve(A, 1, 1, T0, T0) is Verdict.NEW
    v = guard.reserve(A, 1, 1, T0, T0)
    with pytest.raises(ReplayedMessage, match="being handled"):
        require_new(v, A, 1, 1)
    guard.commit(A, 1, 1, T0)
    with pytest.raises(ReplayedMessage, match="already accepted"):
        require_new(guard.check_and_mark(A, 1, 1, T0, T0))
    guard.release(A, 1, 1, T0)  # releasing a committed id does not un-commit it
    assert guard.check_and_mark(A, 1, 1, T0, T0) is Verdict.DUPLICATE
    require_new(guard.check_and_mark(A, 1, 5000, T0, T0))
    with pytest.raises(ReplayedMessage, match="older than the replay window"):
        require_new(guard.check_and_mark(A, 1, 2, T0, T0))
    assert guard.expire(T0 + 2 * SKEW + 1) == 1
