"""The registry's rows in a SQLite file, shared by the processes of a host.

Three tables: ``registry_keys`` (one row per key, its lists as JSON text),
``registry_aliases`` (alias -> key) and ``registry_capabilities`` (capability,
key). Every transaction is one ``BEGIN IMMEDIATE`` (``BEGIN`` for reads) on a
WAL database, so several registries on one file decide one after the other.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from iac.protocol.record_store import AgentRow, KeyState, RecordStoreTx, index_changes
from iac.stores.common import SqliteFile, json_list, str_tuple

_T = TypeVar("_T")

_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS registry_keys (
    agent_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    successor TEXT NOT NULL,
    ended_us INTEGER NOT NULL,
    next_key_digest TEXT NOT NULL,
    expires_us INTEGER NOT NULL,
    record BLOB NOT NULL,
    signature BLOB NOT NULL,
    proof TEXT NOT NULL,
    aliases TEXT NOT NULL,
    capabilities TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS registry_keys_expiry ON registry_keys (expires_us);
CREATE TABLE IF NOT EXISTS registry_aliases (
    alias TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS registry_capabilities (
    capability TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    PRIMARY KEY (capability, agent_id)
) WITHOUT ROWID;
"""

# The queries are written out (no string building): every value is a bound parameter.
_SELECT_ROW = (
    "SELECT agent_id, seq, state, successor, ended_us, next_key_digest, expires_us, record, signature, "
    "proof, aliases, capabilities FROM registry_keys"
)
_SELECT_BY_ID = _SELECT_ROW + " WHERE agent_id = ?"
_SELECT_PURGEABLE = _SELECT_ROW + " WHERE expires_us > 0 AND expires_us < ? ORDER BY expires_us LIMIT ?"
_SELECT_BY_CAPABILITY = (
    "SELECT k.agent_id, k.seq, k.state, k.successor, k.ended_us, k.next_key_digest, k.expires_us, k.record, "
    "k.signature, k.proof, k.aliases, k.capabilities FROM registry_capabilities c "
    "JOIN registry_keys k ON k.agent_id = c.agent_id "
    "WHERE c.capability = ? AND k.expires_us > ? ORDER BY k.agent_id LIMIT ?"
)
_UPSERT_ROW = (
    "INSERT OR REPLACE INTO registry_keys (agent_id, seq, state, successor, ended_us, next_key_digest, "
    "expires_us, record, signature, proof, aliases, capabilities) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def _sqlite_row(r: tuple[Any, ...]) -> AgentRow:
    return AgentRow(
        agent_id=r[0],
        seq=r[1],
        state=KeyState(r[2]),
        successor=r[3],
        ended_us=r[4],
        next_key_digest=r[5],
        expires_us=r[6],
        record=bytes(r[7]),
        signature=bytes(r[8]),
        proof=tuple(p.encode("ascii") for p in str_tuple(r[9])),
        aliases=str_tuple(r[10]),
        capabilities=str_tuple(r[11]),
    )


class SqliteRecordStore:
    """Rows in a SQLite file; several processes may share it (WAL, ``BEGIN IMMEDIATE``).

    One connection per store object, guarded by a lock (so an asyncio registry
    may call it through ``asyncio.to_thread``).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 5.0) -> None:
        self._file = SqliteFile(
            path,
            "registry store",
            timeout_s=timeout_s,
            pragmas=("PRAGMA synchronous=NORMAL",),
            schema=_SQLITE_SCHEMA,
        )

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        return self._file.transaction(lambda db: fn(_SqliteTx(db)), write=write)

    def close(self) -> None:
        self._file.close()


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._c = conn

    def get(self, agent_id: str) -> AgentRow | None:
        r = self._c.execute(_SELECT_BY_ID, (agent_id,)).fetchone()
        return None if r is None else _sqlite_row(r)

    def alias_owner(self, alias: str) -> str | None:
        r = self._c.execute("SELECT agent_id FROM registry_aliases WHERE alias = ?", (alias,)).fetchone()
        return None if r is None else str(r[0])

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        rows = self._c.execute(
            _SELECT_BY_CAPABILITY,
            (capability, now_us, limit),
        ).fetchall()
        return [_sqlite_row(r) for r in rows]

    def count(self) -> int:
        return int(self._c.execute("SELECT COUNT(*) FROM registry_keys").fetchone()[0])

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        rows = self._c.execute(
            _SELECT_PURGEABLE,
            (before_us, limit),
        ).fetchall()
        return [_sqlite_row(r) for r in rows]

    def put(self, row: AgentRow) -> None:
        self._index(row.agent_id, self.get(row.agent_id), row)
        self._c.execute(
            _UPSERT_ROW,
            (
                row.agent_id,
                row.seq,
                row.state.value,
                row.successor,
                row.ended_us,
                row.next_key_digest,
                row.expires_us,
                row.record,
                row.signature,
                json_list(p.decode("ascii") for p in row.proof),
                json_list(row.aliases),
                json_list(row.capabilities),
            ),
        )

    def delete(self, agent_id: str) -> None:
        self._index(agent_id, self.get(agent_id), None)
        self._c.execute("DELETE FROM registry_keys WHERE agent_id = ?", (agent_id,))

    def _index(self, agent_id: str, old: AgentRow | None, new: AgentRow | None) -> None:
        unbind, bind, cap_rm, cap_add = index_changes(old, new)
        for alias in unbind:
            self._c.execute(
                "DELETE FROM registry_aliases WHERE alias = ? AND agent_id = ?", (alias, agent_id)
            )
        for alias in bind:
            self._c.execute("INSERT OR REPLACE INTO registry_aliases VALUES (?, ?)", (alias, agent_id))
        for cap in cap_rm:
            self._c.execute(
                "DELETE FROM registry_capabilities WHERE capability = ? AND agent_id = ?", (cap, agent_id)
            )
        for cap in cap_add:
            self._c.execute("INSERT OR IGNORE INTO registry_capabilities VALUES (?, ?)", (cap, agent_id))
