"""Server session-ticket stores that several processes (SQLite) or hosts (Redis) share.

Both implement :class:`~iac.protocol.tickets.TicketStore`: a QUIC server puts the
state of each ticket it issued under the ticket's label, and the lookup that
resumes a session *takes* it, atomically, so a ticket resumes at most one
session in the whole cluster (a captured early flight replayed to another
server finds nothing). Use them through
``TransportConfig(ticket_store=...)``; servers that share tickets must also
share the replay store and the HELLO nonce cache
(:func:`~iac.protocol.tickets.check_cluster_stores`).

The blobs hold TLS resumption secrets: keep the file (mode 0600) or the Redis
database as private as the node's key. The QUIC library asks for a ticket in the
middle of a handshake, on the event loop, so each call should be quick: a local
SQLite file, a near Redis with a short timeout. A store that fails raises
:class:`~iac.errors.StoreUnavailable` (the server then does a full handshake).
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import struct
from typing import TYPE_CHECKING

from iac.errors import ConfigError
from iac.protocol.tickets import DEFAULT_MAX_TICKETS
from iac.stores.common import RedisBacked, SqliteFile

if TYPE_CHECKING:
    import redis as redis_lib

_EXPIRY = struct.Struct(">q")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS iac_session_ticket (label BLOB PRIMARY KEY, blob BLOB NOT NULL,"
    " expires_us INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE INDEX IF NOT EXISTS iac_session_ticket_expiry ON iac_session_ticket (expires_us)"
)


class SqliteTicketStore:
    """Session tickets in one SQLite file (WAL, mode 0600), shared by the processes of a host.

    ``take`` is one ``DELETE … RETURNING`` statement: of two processes taking the same
    label, one gets the blob. ``put`` drops expired tickets and, beyond ``max_entries``,
    the ones that expire first.
    """

    shared = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_entries: int = DEFAULT_MAX_TICKETS,
        busy_timeout_s: float = 2.0,
    ) -> None:
        if max_entries < 1:
            raise ConfigError("max_entries must be positive")
        self.max_entries = max_entries
        if os.fspath(path) != ":memory:":
            with contextlib.suppress(FileExistsError):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._file = SqliteFile(path, "ticket store", timeout_s=busy_timeout_s, schema=_SCHEMA)

    def put(self, label: bytes, blob: bytes, expires_at_us: int, now_us: int) -> None:
        def put(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM iac_session_ticket WHERE expires_us <= ?", (now_us,))
            db.execute(
                "INSERT OR REPLACE INTO iac_session_ticket VALUES (?, ?, ?)", (label, blob, expires_at_us)
            )
            (count,) = db.execute("SELECT count(*) FROM iac_session_ticket").fetchone()
            if count > self.max_entries:
                db.execute(
                    "DELETE FROM iac_session_ticket WHERE label IN (SELECT label FROM "
                    "iac_session_ticket ORDER BY expires_us LIMIT ?)",
                    (count - self.max_entries,),
                )

        self._file.transaction(put)

    def take(self, label: bytes, now_us: int) -> bytes | None:
        row = self._file.one(
            "DELETE FROM iac_session_ticket WHERE label = ? RETURNING blob, expires_us", (label,)
        )
        if row is None or int(row[1]) <= now_us:
            return None
        return bytes(row[0])

    def __len__(self) -> int:
        return int(self._file.one("SELECT count(*) FROM iac_session_ticket")[0])

    def close(self) -> None:
        self._file.close()

    def __repr__(self) -> str:
        return f"SqliteTicketStore({self._file.path!r})"


class RedisTicketStore(RedisBacked):
    """Session tickets in Redis, shared by every server that uses the same key prefix.

    One string key per ticket, ``<key_prefix>:<label hex>``: the expiry (8 bytes, µs) and
    the blob, with a TTL until the ticket expires; ``take`` is ``GETDEL`` (Redis 6.2 and
    later), atomic. Redis bounds
    the number of tickets by their lifetime (aioquic: one day) and ``maxmemory``.

    Args:
        redis: a ``redis://`` URL or a ``redis.Redis`` client (synchronous); a client
            made from a URL is closed by :meth:`close`.
        key_prefix: servers that share it share the tickets.
        timeout_s: socket timeouts of a client made from a URL (short: the call blocks
            the server's event loop).
    """

    shared = True

    def __init__(
        self, redis: str | redis_lib.Redis, *, key_prefix: str = "iac:ticket", timeout_s: float = 0.5
    ) -> None:
        if not key_prefix:
            raise ConfigError("key_prefix must not be empty")
        super().__init__(redis, "RedisTicketStore", "ticket store", timeout_s=timeout_s)
        self._prefix = key_prefix

    def _key(self, label: bytes) -> str:
        return f"{self._prefix}:{label.hex()}"

    def put(self, label: bytes, blob: bytes, expires_at_us: int, now_us: int) -> None:
        ttl_ms = math.ceil((expires_at_us - now_us) / 1000)
        if ttl_ms <= 0:
            return
        key = self._key(label)
        value = _EXPIRY.pack(expires_at_us) + blob
        self._call(lambda: self._client.set(key, value, px=ttl_ms))

    def take(self, label: bytes, now_us: int) -> bytes | None:
        value = self._call(self._client.getdel, self._key(label))
        if value is None or len(value) < _EXPIRY.size or _EXPIRY.unpack_from(value)[0] <= now_us:
            return None
        return bytes(value[_EXPIRY.size :])

    def __repr__(self) -> str:
        return f"RedisTicketStore(key_prefix={self._prefix!r})"


__all__ = ["RedisTicketStore", "SqliteTicketStore"]
