"""Stores a cluster of servers shares for its handshakes: HELLO nonce caches and server session
tickets, in SQLite and in Redis. Two store objects on the same file or key stand for two servers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from iac.errors import HandshakeError
from iac.protocol.nonces import NonceCache, NonceStore
from iac.protocol.tickets import MemoryTicketStore, TicketStore, check_cluster_stores
from iac.stores.memory import MemoryReplayStore
from iac.stores.nonces import RedisNonceCache, SqliteNonceCache
from iac.stores.redis import RedisReplayStore
from iac.stores.sqlite import SqliteReplayStore
from iac.stores.tickets import RedisTicketStore, SqliteTicketStore

T0 = 1_700_000_000_000_000
SKEW = 1_000_000

Pair = Callable[..., tuple[Any, Any]]


@pytest.fixture(params=["sqlite", "redis"])
def nonce_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    """Two nonce caches on one store, as two servers of a cluster would open them."""
    made: list[Any] = []

    def make(**kw: Any) -> tuple[Any, Any]:
        if request.param == "sqlite":
            path = tmp_path / f"nonces-{uuid.uuid4().hex}.db"
            a, b = SqliteNonceCache(path, **kw), SqliteNonceCache(path, **kw)
        else:
            url = request.getfixturevalue("redis_url")
            prefix = f"t:{uuid.uuid4().hex}"
            a, b = (
                RedisNonceCache(url, key_prefix=prefix, **kw),
                RedisNonceCache(url, key_prefix=prefix, **kw),
            )
        made.extend((a, b))
        return a, b

    yield make
    for store in made:
        store.close()


@pytest.fixture(params=["sqlite", "redis"])
def ticket_pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pair]:
    made: list[Any] = []

    def make(**kw: Any) -> tuple[Any, Any]:
        if request.param == "sqlite":
            path = tmp_path / f"tickets-{uuid.uuid4().hex}.db"
            a, b = SqliteTicketStore(path, **kw), SqliteTicketStore(path, **kw)
            assert path.stat().st_mode & 0o077 == 0  # the blobs are secrets
        else:
            url = request.getfixturevalue("redis_url")
            prefix = f"t:{uuid.uuid4().hex}"
            a, b = RedisTicketStore(url, key_prefix=prefix), RedisTicketStore(url, key_prefix=prefix)
        made.extend((a, b))
        return a, b

    yield make
    for store in made:
        store.close()


def test_a_nonce_seen_by_one_server_is_a_replay_at_the_other(nonce_pair: Pair) -> None:
    a, b = nonce_pair(max_skew_us=SKEW)
    assert a.shared and isinstance(a, NonceStore)
    a.check_and_add(b"n" * 16, T0)
    with pytest.raises(HandshakeError) as exc_info:
        b.check_and_add(b"n" * 16, T0 + 1)
    assert exc_info.value.reason == "replayed_hello"
    b.check_and_add(b"m" * 16, T0 + 1)
    with pytest.raises(HandshakeError) as exc_info:
        a.check_and_add(b"m" * 16, T0 + 2)
    assert exc_info.value.reason == "replayed_hello"


def test_shared_nonce_cache_expires_after_twice_the_skew_and_is_bounded(nonce_pair: Pair) -> None:
    a, b = nonce_pair(max_skew_us=SKEW, max_entries=2)
    a.check_and_add(b"1" * 16, T0)
    b.check_and_add(b"2" * 16, T0)
    with pytest.raises(HandshakeError, match="busy"):  # full: refuses rather than forget early
        a.check_and_add(b"3" * 16, T0 + 2 * SKEW - 1)
    with pytest.raises(HandshakeError) as exc_info:
        b.check_and_add(b"1" * 16, T0 + 2 * SKEW - 1)
    assert exc_info.value.reason == "replayed_hello"
    a.check_and_add(b"3" * 16, T0 + 2 * SKEW)  # the first two expired
    b.check_and_add(b"1" * 16, T0 + 2 * SKEW)
    assert len(a) == 2


def test_concurrent_check_and_add_lets_one_through(nonce_pair: Pair) -> None:
    a, b = nonce_pair(max_skew_us=SKEW)
    outcomes: list[str] = []

    def attempt(store: Any) -> None:
        try:
            store.check_and_add(b"x" * 16, T0)
            outcomes.append("new")
        except HandshakeError as exc:
            assert exc.reason == "replayed_hello"
            outcomes.append("replay")

    threads = [threading.Thread(target=attempt, args=(s,)) for s in (a, b) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["new"] + ["replay"] * 7


def test_a_ticket_is_taken_once_across_the_cluster(ticket_pair: Pair) -> None:
    a, b = ticket_pair()
    assert a.shared and isinstance(a, TicketStore)
    a.put(b"label", b"secret state", T0 + 60_000_000, T0)
    taken: list[bytes | None] = []
    threads = [threading.Thread(target=lambda s=s: taken.append(s.take(b"label", T0))) for s in (a, b) * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken, key=lambda v: v is None) == [b"secret state"] + [None] * 7
    assert a.take(b"unknown", T0) is None


def test_an_expired_ticket_is_not_taken(ticket_pair: Pair) -> None:
    a, b = ticket_pair()
    a.put(b"old", b"x", T0 + 1_000, T0)
    assert b.take(b"old", T0 + 1_000) is None


def test_the_sqlite_ticket_store_is_bounded(tmp_path: Path) -> None:
    store = SqliteTicketStore(tmp_path / "t.db", max_entries=3)
    for i in range(5):
        store.put(bytes([i]), b"x", T0 + 1_000_000 + i, T0)
    assert len(store) == 3
    assert store.take(bytes([0]), T0) is None  # the ones that expire first went
    assert store.take(bytes([4]), T0) == b"x"
    store.close()


def test_replay_stores_say_whether_they_are_shared(tmp_path: Path, redis_url: str) -> None:
    memory = MemoryReplayStore(T0)
    sqlite = SqliteReplayStore(tmp_path / "replay.db")
    redis = RedisReplayStore(redis_url, key_prefix=f"t:{uuid.uuid4().hex}")
    try:
        assert not memory.shared and sqlite.shared and redis.shared
        shared_tickets = SqliteTicketStore(tmp_path / "tickets.db")
        nonces = SqliteNonceCache(tmp_path / "nonces.db")
        check_cluster_stores(shared_tickets, redis, nonces)
        check_cluster_stores(MemoryTicketStore(), memory, NonceCache())
        with pytest.raises(Exception, match="replay store is not"):
            check_cluster_stores(shared_tickets, memory, nonces)
        shared_tickets.close()
        nonces.close()
    finally:
        sqlite.close()
        redis.close()
