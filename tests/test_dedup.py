"""Anti-replay, store-independent: serial arithmetic, the replay configuration, freshness, and the
guard's checks before it asks a store.

The per-session window, expiry and two-phase check-and-set are one suite in test_stores.py, run
once on each store (the in-memory one included)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from iac.errors import ConfigError, MessageRejected
from iac.protocol.replay import (
    ReplayConfig,
    ReplayGuard,
    Verdict,
    check_freshness,
    serial_add,
    serial_diff,
)
from iac.stores.memory import MemoryReplayStore

T0 = 1_700_000_000_000_000  # a fixed "now" in microseconds
SKEW = 60_000_000
A = "a" * 64
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


# --- freshness -------------------------------------------------------------------------------


def test_freshness_edges():
    check_freshness(T0 - SKEW, T0, SKEW)
    check_freshness(T0 + SKEW, T0, SKEW)
    with pytest.raises(MessageRejected, match="past") as exc_info:
        check_freshness(T0 - SKEW - 1, T0, SKEW)
    assert exc_info.value.reason == "stale_message"
    with pytest.raises(MessageRejected, match="future") as exc_info:
        check_freshness(T0 + SKEW + 1, T0, SKEW)
    assert exc_info.value.reason == "stale_message"


def test_history_less_store_refuses_timestamps_before_its_start():
    s = store()
    guard = ReplayGuard(s)
    now = T0 + 10_000_000
    with pytest.raises(MessageRejected, match="before the replay store started") as exc_info:
        guard.check_and_mark(A, 1, 1, T0 - 1, now)  # fresh by skew, but before the start
    assert exc_info.value.reason == "stale_message"
    assert len(s) == 0  # the refusal did not create a window
    assert guard.check_and_mark(A, 1, 1, T0, now) is Verdict.NEW
    assert guard.store is s


def test_guard_refuses_stale_and_future_without_touching_store():
    s = store()
    guard = ReplayGuard(s)
    now = T0 + 100 * SKEW
    with pytest.raises(MessageRejected) as exc_info:
        guard.check_and_mark(A, 1, 1, now - SKEW - 1, now)
    assert exc_info.value.reason == "stale_message"
    with pytest.raises(MessageRejected) as exc_info:
        guard.reserve(A, 1, 1, now + SKEW + 1, now)
    assert exc_info.value.reason == "stale_message"
    assert len(s) == 0
    assert guard.check_and_mark(A, 1, 1, now + SKEW, now) is Verdict.NEW
