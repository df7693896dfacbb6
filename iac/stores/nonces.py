"""HELLO nonce caches that several processes (SQLite) or hosts (Redis) share.

Both implement :class:`~iac.protocol.nonces.NonceStore` with the in-memory
cache's semantics: a nonce is recorded until ``now + 2 × max_skew`` in one atomic
check-and-set, a nonce already recorded is ``replayed_hello``,
and a store full of unexpired nonces refuses new ones (``busy``) rather than
forget one early. Servers of a 0-RTT cluster (one identity, shared session
tickets) must use one such store, or a replayed early flight sent to a second
server would be accepted there (docs/PROTOCOL.md, "0-RTT and tickets").

The interface is synchronous and thread-safe; the handshake calls a shared
store through ``asyncio.to_thread``. A store that fails raises
:class:`~iac.errors.StoreUnavailable`, and the handshake is then refused.
"""

from __future__ import annotations

import math
import os
import sqlite3
from typing import TYPE_CHECKING

from iac.errors import ConfigError, HandshakeError
from iac.protocol.nonces import DEFAULT_MAX_SKEW_US, DEFAULT_NONCE_CACHE_SIZE, nonce_busy
from iac.stores.common import RedisBacked, SqliteFile

if TYPE_CHECKING:
    import redis as redis_lib

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS iac_hello_nonce (nonce BLOB PRIMARY KEY, expires_us INTEGER NOT NULL)"
    " WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS iac_hello_nonce_expiry ON iac_hello_nonce (expires_us)"
)


def _check(max_skew_us: int, max_entries: int) -> None:
    if max_skew_us <= 0 or max_entries < 1:
        raise ConfigError("a nonce store needs a positive max_skew_us and max_entries")


class SqliteNonceCache:
    """HELLO nonces in one SQLite file (WAL), shared by the processes of a host.

    Each call is one ``BEGIN IMMEDIATE`` transaction: expired nonces are deleted,
    then the nonce is looked up, counted against ``max_entries`` and inserted.
    """

    shared = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_skew_us: int = DEFAULT_MAX_SKEW_US,
        max_entries: int = DEFAULT_NONCE_CACHE_SIZE,
        busy_timeout_s: float = 5.0,
    ) -> None:
        _check(max_skew_us, max_entries)
        self.max_skew_us = max_skew_us
        self.max_entries = max_entries
        self._file = SqliteFile(path, "nonce store", timeout_s=busy_timeout_s, schema=_SCHEMA)

    def check_and_add(self, nonce: bytes, now_us: int, *, max_skew_us: int | None = None) -> None:
        skew = self.max_skew_us if max_skew_us is None else max(self.max_skew_us, max_skew_us)

        def check(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM iac_hello_nonce WHERE expires_us <= ?", (now_us,))
            if db.execute("SELECT 1 FROM iac_hello_nonce WHERE nonce = ?", (nonce,)).fetchone():
                raise HandshakeError(
                    "HELLO nonce was already used within the freshness window", reason="replayed_hello"
                )
            (count,) = db.execute("SELECT count(*) FROM iac_hello_nonce").fetchone()
            if count >= self.max_entries:
                raise nonce_busy(self.max_entries)
            db.execute("INSERT INTO iac_hello_nonce VALUES (?, ?)", (nonce, now_us + 2 * skew))

        self._file.transaction(check)

    def __len__(self) -> int:
        return int(self._file.one("SELECT count(*) FROM iac_hello_nonce")[0])

    def close(self) -> None:
        self._file.close()

    def __repr__(self) -> str:
        return f"SqliteNonceCache({self._file.path!r})"


# KEYS[1]: the sorted set of nonces scored by expiry. ARGV: nonce, now, expiry, max, ttl_ms.
_LUA = r"""
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 2 end
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 0
"""


class RedisNonceCache(RedisBacked):
    """HELLO nonces in Redis, shared by every server that uses the same key.

    One sorted set, ``<key_prefix>:nonces``, holds the nonces scored by expiry
    (callers' clocks, µs); each call is one Lua script (atomic in Redis) that drops
    the expired ones, looks the nonce up, counts and adds it. The key's TTL is
    ``2 × max_skew``, refreshed on every add. A Redis that restarts without
    persistence forgets the nonces (as the in-memory cache does on a restart); the
    single-use session tickets, which a cluster keeps in the same Redis, are gone
    with them, so a replayed early flight still finds no ticket to resume.

    Args:
        redis: a ``redis://`` URL or a ``redis.Redis`` client (synchronous); a client
            made from a URL is closed by :meth:`close`.
        key_prefix: servers that share it share the cache (Redis Cluster: use braces).
        timeout_s: socket timeouts of a client made from a URL.
    """

    shared = True

    def __init__(
        self,
        redis: str | redis_lib.Redis,
        *,
        key_prefix: str = "iac:hello",
        max_skew_us: int = DEFAULT_MAX_SKEW_US,
        max_entries: int = DEFAULT_NONCE_CACHE_SIZE,
        timeout_s: float = 2.0,
    ) -> None:
        _check(max_skew_us, max_entries)
        if not key_prefix:
            raise ConfigError("key_prefix must not be empty")
        super().__init__(redis, "RedisNonceCache", "nonce store", timeout_s=timeout_s)
        self.max_skew_us = max_skew_us
        self.max_entries = max_entries
        self._key = f"{key_prefix}:nonces"
        self._script = self._client.register_script(_LUA)

    def check_and_add(self, nonce: bytes, now_us: int, *, max_skew_us: int | None = None) -> None:
        skew = self.max_skew_us if max_skew_us is None else max(self.max_skew_us, max_skew_us)
        args = [
            nonce,
            str(now_us),
            str(now_us + 2 * skew),
            str(self.max_entries),
            str(math.ceil(2 * skew / 1000)),
        ]
        code = int(self._call(self._script, [self._key], args))
        if code == 1:
            raise HandshakeError(
                "HELLO nonce was already used within the freshness window", reason="replayed_hello"
            )
        if code == 2:
            raise nonce_busy(self.max_entries)

    def __len__(self) -> int:
        return int(self._call(self._client.zcard, self._key))

    def __repr__(self) -> str:
        return f"RedisNonceCache(key={self._key!r})"


__all__ = ["RedisNonceCache", "SqliteNonceCache"]
