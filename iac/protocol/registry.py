"""The registry's rules, sans-IO, over a pluggable record store.

:class:`RegistryState` takes signed records and statements with the current time
and decides; a :class:`RecordStore` keeps the rows (in memory, in a SQLite file
shared by several processes, or in Redis shared by several hosts). Every
decision reads and writes in one atomic store transaction, so two registries on
one store never both accept the same ``seq`` or hand one alias to two keys.

Rules (docs/PROTOCOL.md, "Registry"):

* **Publish.** A record is stored only if its signature verifies, it is not
  expired, its lifetime is at most ``max_ttl_us``, it is within the registry's
  limits and its ``seq`` is above the highest ``seq`` seen for that key (from a
  record or a statement). A key that was rotated or revoked publishes nothing.
  Once a key has committed to a ``next_key_digest``, every later record of that
  key must carry the same digest (otherwise a thief of the key could first
  re-commit to a key of its own, then rotate).
* **Aliases.** An alias belongs to the key that registered it first, for as long
  as that key's stored record lists it (a newer record without it releases it),
  including ``hold_us`` after the record expires and while the key is revoked
  (so nobody can grab the name of a dead key). An ``alias_policy`` hook may grant
  a taken alias to the claimant; otherwise :class:`AliasTaken`.
* **Rotation.** Signed by the old key and countersigned by the new one, ``seq``
  above the old key's, the new key matching the committed ``next_key_digest``
  (if any) and unknown to the registry. The old key's record, aliases and
  capabilities move to the successor (served with the rotation as proof); the
  old key stays valid for ``rotation_grace_us`` after ``min(issued_us, now)``,
  then is refused. A revoked key may still rotate, but only to the successor
  it committed to (so its owner recovers the aliases; a thief cannot).
* **Revocation.** Signed by the key itself, ``seq`` above the key's; ends the
  key at once (also a rotated key's grace). A revocation of a key the registry
  does not know is kept, so that key can never register later.
* **Bounds.** ``max_keys`` rows (rotated and revoked keys count and are kept),
  records of at most ``max_record_size`` bytes, ``max_aliases``,
  ``max_addresses`` and ``max_capabilities`` per record, ``max_lookup`` results.
  :meth:`RegistryState.purge` drops records ``hold_us`` after they expired (and
  runs by itself when the registry is full).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from iac.errors import (
    AliasTaken,
    BadRecord,
    CommitmentChanged,
    ConfigError,
    KeyRevoked,
    KeyRotated,
    RegistryFull,
    RotationRefused,
    StaleSeq,
    StoreUnavailable,
    UnknownAgent,
)
from iac.protocol.records import (
    AgentRecord,
    Revocation,
    RotationStatement,
    SignedRecord,
    SignedRevocation,
    SignedRotation,
    canonical_json,
    check_successor,
    decode_record,
    is_alias,
    is_capability,
    open_record,
    open_revocation,
    open_rotation,
)
from iac.wire.identity import check_agent_id, is_agent_id

if TYPE_CHECKING:
    import redis as redis_lib

_T = TypeVar("_T")

_MINUTE_US = 60_000_000
_DAY_US = 24 * 60 * _MINUTE_US


class KeyState(StrEnum):
    """What the registry knows of a key (stored)."""

    ACTIVE = "active"
    ROTATED = "rotated"
    REVOKED = "revoked"


class KeyStatus(Enum):
    """What :meth:`RegistryState.key_status` says of a key at a given time."""

    #: The registry holds nothing about this key.
    UNKNOWN = "unknown"
    #: Registered, record unexpired.
    ACTIVE = "active"
    #: Registered, but its record expired (not returned by lookups).
    EXPIRED = "expired"
    #: Rotated to a successor, still inside the grace period: still accepted.
    ROTATING = "rotating"
    #: Rotated and past the grace period: refused.
    ROTATED = "rotated"
    #: Revoked: refused.
    REVOKED = "revoked"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    status: KeyStatus
    #: highest ``seq`` seen for the key (record or statement); 0 when unknown
    seq: int = 0
    #: the successor's AgentId after a rotation, else ""
    successor: str = ""


#: ``alias_policy(alias, owner_agent_id, claimant_agent_id) -> bool``: True grants the
#: alias, held by ``owner``, to ``claimant`` (the owner loses it).
AliasPolicy = Callable[[str, str, str], bool]


@dataclass(frozen=True, slots=True)
class RegistryConfig:
    """Limits and periods of a registry. Times in microseconds."""

    max_keys: int = 100_000
    max_record_size: int = 8 * 1024
    max_aliases: int = 16
    max_addresses: int = 16
    max_capabilities: int = 64
    #: longest accepted ``expires_us - now`` of a record
    max_ttl_us: int = 7 * _DAY_US
    #: how long an expired record (and its aliases) is kept; at least ``max_ttl_us``
    hold_us: int = 7 * _DAY_US
    #: how long a rotated key stays valid after its rotation
    rotation_grace_us: int = 60 * _MINUTE_US
    #: how far in the future a statement's ``issued_us`` may be
    max_skew_us: int = _MINUTE_US
    #: most results of a capability lookup
    max_lookup: int = 100
    #: most rotations between a stored record and the key serving it
    max_rotation_chain: int = 8

    def __post_init__(self) -> None:
        for name in (
            "max_keys",
            "max_record_size",
            "max_ttl_us",
            "hold_us",
            "max_skew_us",
            "max_lookup",
            "max_rotation_chain",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive")
        for name in ("max_aliases", "max_addresses", "max_capabilities", "rotation_grace_us"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative")
        if self.hold_us < self.max_ttl_us:
            raise ConfigError(
                "hold_us must be at least max_ttl_us (a purged key's old records must be expired)"
            )


# --- rows and the store interface ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AgentRow:
    """One key as a store keeps it.

    ``record``/``signature`` is the signed record the entry comes from: the key's
    own, or after rotations the first key's, with ``proof`` the rotation
    envelopes (canonical JSON) from that key to this one. ``aliases`` and
    ``capabilities`` are what this key holds in the indexes. ``expires_us`` is 0
    when the row holds no record.
    """

    agent_id: str
    seq: int
    state: KeyState = KeyState.ACTIVE
    successor: str = ""
    ended_us: int = 0
    next_key_digest: str = ""
    expires_us: int = 0
    record: bytes = b""
    signature: bytes = b""
    proof: tuple[bytes, ...] = ()
    aliases: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()


class RecordStoreTx(Protocol):
    """Reads and writes inside one atomic store transaction.

    :meth:`put` and :meth:`delete` keep the alias and capability indexes in step
    with the rows: an alias listed in the new row is bound to its key (replacing
    any binding), an alias the row no longer lists is unbound if it was bound to
    this key; a capability is indexed for a row while the row lists it.
    """

    def get(self, agent_id: str) -> AgentRow | None: ...

    def alias_owner(self, alias: str) -> str | None: ...

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        """Rows indexed under ``capability`` with ``expires_us > now_us``, at most ``limit``."""
        ...

    def count(self) -> int: ...

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        """Rows holding a record with ``0 < expires_us < before_us``, at most ``limit``."""
        ...

    def put(self, row: AgentRow) -> None: ...

    def delete(self, agent_id: str) -> None: ...


class RecordStore(Protocol):
    """Where a registry keeps its rows; :meth:`atomic` runs one transaction."""

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        """Run ``fn`` in one transaction; commit its writes if it returns, discard them if it raises.

        A store may call ``fn`` more than once (optimistic concurrency), so ``fn``
        must not have side effects outside the transaction.
        """
        ...

    def close(self) -> None: ...


def _index_changes(
    old: AgentRow | None, new: AgentRow | None
) -> tuple[set[str], set[str], set[str], set[str]]:
    """(aliases unbound, aliases bound, capabilities removed, capabilities added)."""
    old_a = set(old.aliases) if old else set()
    new_a = set(new.aliases) if new else set()
    old_c = set(old.capabilities) if old else set()
    new_c = set(new.capabilities) if new else set()
    return old_a - new_a, new_a, old_c - new_c, new_c


# --- in memory -------------------------------------------------------------------------------


class MemoryRecordStore:
    """Rows in dictionaries; one lock; writes undone if the transaction raises."""

    def __init__(self) -> None:
        self._rows: dict[str, AgentRow] = {}
        self._aliases: dict[str, str] = {}
        self._caps: dict[str, set[str]] = {}
        self._lock = threading.RLock()

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        with self._lock:
            tx = _MemoryTx(self)
            try:
                return fn(tx)
            except BaseException:
                tx.rollback()
                raise

    def close(self) -> None:
        pass

    def _apply(self, agent_id: str, old: AgentRow | None, new: AgentRow | None) -> None:
        unbind, bind, cap_rm, cap_add = _index_changes(old, new)
        for alias in unbind:
            if self._aliases.get(alias) == agent_id:
                del self._aliases[alias]
        for alias in bind:
            self._aliases[alias] = agent_id
        for cap in cap_rm:
            ids = self._caps.get(cap)
            if ids is not None:
                ids.discard(agent_id)
                if not ids:
                    del self._caps[cap]
        for cap in cap_add:
            self._caps.setdefault(cap, set()).add(agent_id)
        if new is None:
            self._rows.pop(agent_id, None)
        else:
            self._rows[agent_id] = new


class _MemoryTx:
    def __init__(self, store: MemoryRecordStore) -> None:
        self._s = store
        self._undo: list[tuple[str, AgentRow | None, AgentRow | None]] = []

    def get(self, agent_id: str) -> AgentRow | None:
        return self._s._rows.get(agent_id)

    def alias_owner(self, alias: str) -> str | None:
        return self._s._aliases.get(alias)

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        out: list[AgentRow] = []
        for agent_id in sorted(self._s._caps.get(capability, ())):
            row = self._s._rows.get(agent_id)
            if row is not None and row.expires_us > now_us:
                out.append(row)
                if len(out) >= limit:
                    break
        return out

    def count(self) -> int:
        return len(self._s._rows)

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        rows = [r for r in self._s._rows.values() if 0 < r.expires_us < before_us]
        rows.sort(key=lambda r: r.expires_us)
        return rows[:limit]

    def put(self, row: AgentRow) -> None:
        old = self._s._rows.get(row.agent_id)
        self._undo.append((row.agent_id, old, row))
        self._s._apply(row.agent_id, old, row)

    def delete(self, agent_id: str) -> None:
        old = self._s._rows.get(agent_id)
        if old is not None:
            self._undo.append((agent_id, old, None))
            self._s._apply(agent_id, old, None)

    def rollback(self) -> None:
        while self._undo:
            agent_id, old, new = self._undo.pop()
            self._s._apply(agent_id, new, old)


# --- SQLite ------------------------------------------------------------------------------------

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


def _json_list(values: Iterable[str]) -> str:
    return json.dumps(list(values), separators=(",", ":"))


def _str_tuple(text: str | bytes) -> tuple[str, ...]:
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StoreUnavailable("registry store holds a malformed row")
    return tuple(value)


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
        proof=tuple(p.encode("ascii") for p in _str_tuple(r[9])),
        aliases=_str_tuple(r[10]),
        capabilities=_str_tuple(r[11]),
    )


class SqliteRecordStore:
    """Rows in a SQLite file; several processes may share it (WAL, ``BEGIN IMMEDIATE``).

    One connection per store object, guarded by a lock (so an asyncio registry
    may call it through ``asyncio.to_thread``).
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout_s: float = 5.0) -> None:
        try:
            self._conn = sqlite3.connect(
                os.fspath(path), timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SQLITE_SCHEMA)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"registry store {os.fspath(path)!r}: {exc}") from None
        self._lock = threading.Lock()

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"registry store: {exc}") from None
            try:
                result = fn(_SqliteTx(self._conn))
                self._conn.execute("COMMIT")
                return result
            except BaseException as exc:
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise StoreUnavailable(f"registry store: {exc}") from None
                raise

    def close(self) -> None:
        with self._lock:
            self._conn.close()


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
                _json_list(p.decode("ascii") for p in row.proof),
                _json_list(row.aliases),
                _json_list(row.capabilities),
            ),
        )

    def delete(self, agent_id: str) -> None:
        self._index(agent_id, self.get(agent_id), None)
        self._c.execute("DELETE FROM registry_keys WHERE agent_id = ?", (agent_id,))

    def _index(self, agent_id: str, old: AgentRow | None, new: AgentRow | None) -> None:
        unbind, bind, cap_rm, cap_add = _index_changes(old, new)
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


# --- Redis -------------------------------------------------------------------------------------


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise StoreUnavailable(f"registry store returned {type(value).__name__}")


def _as_str(value: Any) -> str:
    return _as_bytes(value).decode("utf-8")


class RedisRecordStore:
    """Rows in Redis, shared by every registry on the same server and ``key_prefix``.

    Layout: ``{prefix}:k:{agent_id}`` a hash per row, ``{prefix}:a:{alias}`` the
    owner of an alias, ``{prefix}:c:{capability}`` a sorted set of AgentIds scored
    by record expiry, ``{prefix}:keys`` every AgentId scored by record expiry.
    A transaction WATCHes every key it reads, buffers its writes and applies
    them in one MULTI/EXEC; if another registry changed a watched key meanwhile,
    the whole decision runs again (at most ``max_retries`` times).
    """

    def __init__(
        self,
        redis: str | redis_lib.Redis,
        *,
        key_prefix: str = "iac:registry",
        timeout_s: float = 2.0,
        max_retries: int = 16,
    ) -> None:
        try:
            import redis as redis_mod
        except ImportError:  # pragma: no cover - depends on the environment
            raise ConfigError("RedisRecordStore needs the redis client: pip install redis") from None
        if not key_prefix or any(c.isspace() for c in key_prefix):
            raise ConfigError("key_prefix must be a non-empty string without spaces")
        if max_retries < 1:
            raise ConfigError("max_retries must be at least 1")
        self._mod = redis_mod
        self._client: redis_lib.Redis = (
            redis_mod.Redis.from_url(redis, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
            if isinstance(redis, str)
            else redis
        )
        self._prefix = key_prefix
        self._max_retries = max_retries

    def key(self, kind: str, name: str = "") -> str:
        return f"{self._prefix}:{kind}:{name}" if name else f"{self._prefix}:{kind}"

    def atomic(self, fn: Callable[[RecordStoreTx], _T], *, write: bool = True) -> _T:
        errors = self._mod.exceptions
        for _ in range(self._max_retries):
            pipe = self._client.pipeline(transaction=True)
            tx = _RedisTx(self, pipe)
            try:
                result = fn(tx)
                tx.commit()
                return result
            except errors.WatchError:
                continue
            except (errors.ConnectionError, errors.TimeoutError) as exc:
                raise StoreUnavailable(f"registry store (redis): {exc}") from None
            except errors.RedisError as exc:
                raise StoreUnavailable(f"registry store (redis): {exc}") from None
            finally:
                pipe.reset()
        raise StoreUnavailable(
            f"registry store (redis): gave up after {self._max_retries} conflicting retries"
        )

    def close(self) -> None:
        self._client.close()


_MISSING = object()


class _RedisTx:
    def __init__(self, store: RedisRecordStore, pipe: Any) -> None:
        self._s = store
        self._pipe = pipe
        self._rows: dict[str, AgentRow | None] = {}
        self._aliases: dict[str, str | None] = {}
        self._writes: list[Callable[[Any], None]] = []
        self._count_delta = 0  # rows added minus rows deleted by the buffered writes

    def _watch(self, key: str) -> None:
        self._pipe.watch(key)  # from the first WATCH on, the pipeline runs commands at once

    def get(self, agent_id: str) -> AgentRow | None:
        cached = self._rows.get(agent_id, _MISSING)
        if cached is not _MISSING:
            return cached  # type: ignore[return-value]
        key = self._s.key("k", agent_id)
        self._watch(key)
        row = _redis_row(agent_id, self._pipe.hgetall(key))
        self._rows[agent_id] = row
        return row

    def alias_owner(self, alias: str) -> str | None:
        if alias in self._aliases:
            return self._aliases[alias]
        key = self._s.key("a", alias)
        self._watch(key)
        value = self._pipe.get(key)
        owner = None if value is None else _as_str(value)
        self._aliases[alias] = owner
        return owner

    def with_capability(self, capability: str, now_us: int, limit: int) -> list[AgentRow]:
        ids = self._s._client.zrangebyscore(
            self._s.key("c", capability), f"({now_us}", "+inf", start=0, num=limit
        )
        rows = [self.get(_as_str(i)) for i in ids]
        return [r for r in rows if r is not None and r.expires_us > now_us]

    def count(self) -> int:
        key = self._s.key("keys")
        self._watch(key)
        return int(self._pipe.zcard(key)) + self._count_delta

    def purgeable(self, before_us: int, limit: int) -> list[AgentRow]:
        ids = self._s._client.zrangebyscore(self._s.key("keys"), "(0", f"({before_us}", start=0, num=limit)
        rows = [self.get(_as_str(i)) for i in ids]
        return [r for r in rows if r is not None and 0 < r.expires_us < before_us]

    def put(self, row: AgentRow) -> None:
        self._change(row.agent_id, row)

    def delete(self, agent_id: str) -> None:
        self._change(agent_id, None)

    def _change(self, agent_id: str, new: AgentRow | None) -> None:
        old = self.get(agent_id)
        unbind, bind, cap_rm, cap_add = _index_changes(old, new)
        unbind = {a for a in unbind if self.alias_owner(a) == agent_id}
        s = self._s
        row_key = s.key("k", agent_id)

        def write(p: Any) -> None:
            p.delete(row_key)
            if new is None:
                p.zrem(s.key("keys"), agent_id)
            else:
                p.hset(row_key, mapping=_redis_fields(new))
                p.zadd(s.key("keys"), {agent_id: new.expires_us})
            for alias in unbind:
                p.delete(s.key("a", alias))
            for alias in bind:
                p.set(s.key("a", alias), agent_id)
            for cap in cap_rm:
                p.zrem(s.key("c", cap), agent_id)
            if new is not None:
                for cap in cap_add:
                    p.zadd(s.key("c", cap), {agent_id: new.expires_us})

        self._writes.append(write)
        self._count_delta += (new is not None) - (old is not None)
        self._rows[agent_id] = new
        for alias in unbind:
            self._aliases[alias] = None
        for alias in bind:
            self._aliases[alias] = agent_id

    def commit(self) -> None:
        if not self._writes:
            return
        self._pipe.multi()
        for write in self._writes:
            write(self._pipe)
        self._pipe.execute()


def _redis_fields(row: AgentRow) -> dict[str, bytes | str | int]:
    return {
        "seq": row.seq,
        "state": row.state.value,
        "successor": row.successor,
        "ended_us": row.ended_us,
        "next_key_digest": row.next_key_digest,
        "expires_us": row.expires_us,
        "record": row.record,
        "signature": row.signature,
        "proof": _json_list(p.decode("ascii") for p in row.proof),
        "aliases": _json_list(row.aliases),
        "capabilities": _json_list(row.capabilities),
    }


def _redis_row(agent_id: str, h: dict[Any, Any]) -> AgentRow | None:
    if not h:
        return None
    f = {_as_str(k): _as_bytes(v) for k, v in h.items()}
    try:
        return AgentRow(
            agent_id=agent_id,
            seq=int(f["seq"]),
            state=KeyState(f["state"].decode()),
            successor=f["successor"].decode(),
            ended_us=int(f["ended_us"]),
            next_key_digest=f["next_key_digest"].decode(),
            expires_us=int(f["expires_us"]),
            record=f["record"],
            signature=f["signature"],
            proof=tuple(p.encode("ascii") for p in _str_tuple(f["proof"])),
            aliases=_str_tuple(f["aliases"]),
            capabilities=_str_tuple(f["capabilities"]),
        )
    except (KeyError, ValueError) as exc:
        raise StoreUnavailable(f"registry store holds a malformed row for {agent_id[:16]}…: {exc}") from None


def open_record_store(spec: str) -> RecordStore:
    """A store from a CLI-style spec: ``memory``, ``sqlite:PATH`` or ``redis://HOST:PORT[/DB]``."""
    if spec == "memory":
        return MemoryRecordStore()
    if spec.startswith("sqlite:"):
        path = spec.removeprefix("sqlite:")
        if not path:
            raise ConfigError("sqlite: needs a path (sqlite:registry.db)")
        return SqliteRecordStore(path)
    if spec.startswith(("redis://", "rediss://", "unix://")):
        return RedisRecordStore(spec)
    raise ConfigError(f"{spec!r}: not a registry store (memory, sqlite:PATH, redis://HOST:PORT)")


# --- the registry ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """A lookup result.

    ``record`` is what the registry serves for ``agent_id`` (after a rotation:
    the predecessor's record re-addressed to the successor, with the rotation's
    ``seq`` and no ``next_key_digest``; its aliases are the ones the key holds).
    ``signed`` and ``rotations`` let a client check it: ``signed`` verifies by
    its own ``agent_id`` and each rotation hands over to the next key.
    """

    record: AgentRecord
    signed: SignedRecord
    rotations: tuple[SignedRotation, ...] = ()

    @property
    def agent_id(self) -> str:
        return self.record.agent_id


def verify_entry(entry: RegistryEntry, now_us: int) -> AgentRecord:
    """A client's check of a lookup result: the signed record verifies and is unexpired, each
    rotation is signed by the key before it (and countersigned), follows its ``seq`` and, for the
    first one, matches the record's ``next_key_digest``; the served record is what they prove.

    Returns ``entry.record``; raises :class:`BadRecord` (or the check's own error) otherwise.
    """
    base = open_record(entry.signed.data, entry.signed.signature, now_us)
    current, digest, seq = base.agent_id, base.next_key_digest, base.seq
    for rotation in entry.rotations:
        statement = open_rotation(rotation, now_us, next_key_digest=digest)
        if statement.old_agent_id != current or statement.seq <= seq:
            raise BadRecord("the rotations do not chain from the signed record")
        current, digest, seq = statement.new_agent_id, None, statement.seq
    served = entry.record
    expected = replace(base, agent_id=current, seq=seq, next_key_digest=digest, aliases=served.aliases)
    if served != expected or not set(served.aliases) <= set(base.aliases):
        raise BadRecord("the served record is not the one its signatures prove")
    return served


def _rotation_envelope(signed: SignedRotation) -> bytes:
    return canonical_json(signed.to_json_obj())


def _rotation_from_envelope(data: bytes) -> SignedRotation:
    return SignedRotation.from_json_obj(json.loads(data))


class RegistryState:
    """The registry's decisions, over a :class:`RecordStore` (in memory by default).

    Every method takes ``now_us`` (microseconds since the Unix epoch) and reads no
    clock. Refusals raise :class:`~iac.MessageRejected` subclasses; a failing
    store raises ``StoreUnavailable``.
    """

    def __init__(
        self,
        store: RecordStore | None = None,
        config: RegistryConfig | None = None,
        *,
        alias_policy: AliasPolicy | None = None,
    ) -> None:
        self.store: RecordStore = store if store is not None else MemoryRecordStore()
        self.config = config if config is not None else RegistryConfig()
        self._alias_policy = alias_policy

    # --- publish -------------------------------------------------------------------------------

    def publish(self, signed: SignedRecord, now_us: int) -> AgentRecord:
        """Store a signed record; return it. See the module docstring for the rules."""
        cfg = self.config
        record = open_record(signed.data, signed.signature, now_us, max_size=cfg.max_record_size)
        for name, values, limit in (
            ("aliases", record.aliases, cfg.max_aliases),
            ("addresses", record.addresses, cfg.max_addresses),
            ("capabilities", record.capabilities, cfg.max_capabilities),
        ):
            if len(values) > limit:
                raise BadRecord(f"{name}: {len(values)} entries, over this registry's limit of {limit}")
        if record.expires_us - now_us > cfg.max_ttl_us:
            raise BadRecord(f"record lifetime is over this registry's limit of {cfg.max_ttl_us} µs")
        row = AgentRow(
            agent_id=record.agent_id,
            seq=record.seq,
            next_key_digest=record.next_key_digest or "",
            expires_us=record.expires_us,
            record=bytes(signed.data),
            signature=bytes(signed.signature),
            aliases=record.aliases,
            capabilities=record.capabilities,
        )

        def txn(tx: RecordStoreTx) -> AgentRecord:
            old = tx.get(record.agent_id)
            if old is not None:
                if record.seq <= old.seq:
                    raise StaleSeq(f"seq {record.seq} is not above the stored {old.seq}")
                _refuse_ended(old)
                if old.next_key_digest and record.next_key_digest != old.next_key_digest:
                    raise CommitmentChanged("a committed next_key_digest can only be used by a rotation")
            else:
                self._make_room(tx, now_us)
            losers: dict[str, list[str]] = {}
            for alias in record.aliases:
                owner = tx.alias_owner(alias)
                if owner is None or owner == record.agent_id:
                    continue
                owner_row = tx.get(owner)
                if owner_row is None or alias not in owner_row.aliases:
                    continue  # a stale index entry: the alias is free
                if self._alias_policy is not None and self._alias_policy(alias, owner, record.agent_id):
                    losers.setdefault(owner, []).append(alias)
                    continue
                raise AliasTaken(f"alias {alias!r} belongs to {owner[:16]}…")
            for owner, lost in losers.items():
                owner_row = tx.get(owner)
                if owner_row is not None:
                    tx.put(replace(owner_row, aliases=tuple(a for a in owner_row.aliases if a not in lost)))
            tx.put(row)
            return record

        return self.store.atomic(txn)

    # --- statements ----------------------------------------------------------------------------

    def apply_rotation(self, signed: SignedRotation, now_us: int) -> RotationStatement:
        """Hand the old key's record, aliases and capabilities to its successor."""
        cfg = self.config
        # Both signatures first (nothing unsigned reaches the store); the commitment inside.
        statement = open_rotation(signed, now_us, next_key_digest=None, max_skew_us=cfg.max_skew_us)
        envelope = _rotation_envelope(signed)

        def txn(tx: RecordStoreTx) -> RotationStatement:
            old = tx.get(statement.old_agent_id)
            if old is None:
                raise UnknownAgent(f"no record of {statement.old_agent_id[:16]}…")
            if statement.seq <= old.seq:
                raise StaleSeq(f"rotation seq {statement.seq} is not above the stored {old.seq}")
            if old.state is KeyState.ROTATED:
                raise KeyRotated(f"{old.agent_id[:16]}… was already rotated")
            if old.state is KeyState.REVOKED and not old.next_key_digest:
                raise KeyRevoked(f"{old.agent_id[:16]}… is revoked and committed to no successor")
            check_successor(statement, old.next_key_digest or None)
            if tx.get(statement.new_agent_id) is not None:
                raise RotationRefused(f"the successor {statement.new_agent_id[:16]}… is already known")
            if len(old.proof) >= cfg.max_rotation_chain:
                raise RotationRefused(f"more than {cfg.max_rotation_chain} rotations since the last record")
            self._make_room(tx, now_us)
            capabilities = decode_record(old.record).capabilities if old.record else ()
            ended = min(statement.issued_us, now_us)
            tx.put(
                replace(
                    old,
                    seq=statement.seq,
                    state=KeyState.ROTATED if old.state is KeyState.ACTIVE else old.state,
                    successor=statement.new_agent_id,
                    ended_us=ended if old.state is KeyState.ACTIVE else old.ended_us,
                    expires_us=0,
                    record=b"",
                    signature=b"",
                    proof=(),
                    aliases=(),
                    capabilities=(),
                )
            )
            tx.put(
                AgentRow(
                    agent_id=statement.new_agent_id,
                    seq=statement.seq,
                    expires_us=old.expires_us,
                    record=old.record,
                    signature=old.signature,
                    proof=(*old.proof, envelope) if old.record else (),
                    aliases=old.aliases,
                    capabilities=capabilities,
                )
            )
            return statement

        return self.store.atomic(txn)

    def apply_revocation(self, signed: SignedRevocation, now_us: int) -> Revocation:
        """End a key at once (a rotated key's grace period too)."""
        revocation = open_revocation(signed, now_us, max_skew_us=self.config.max_skew_us)
        ended = min(revocation.issued_us, now_us)

        def txn(tx: RecordStoreTx) -> Revocation:
            row = tx.get(revocation.agent_id)
            if row is None:
                self._make_room(tx, now_us)
                tx.put(AgentRow(revocation.agent_id, revocation.seq, KeyState.REVOKED, ended_us=ended))
                return revocation
            if revocation.seq <= row.seq:
                raise StaleSeq(f"revocation seq {revocation.seq} is not above the stored {row.seq}")
            if row.state is KeyState.REVOKED:
                raise KeyRevoked(f"{row.agent_id[:16]}… is already revoked")
            ended_at = min(row.ended_us, ended) if row.state is KeyState.ROTATED else ended
            # The record and aliases stay (reserved; a rotation to the committed successor
            # can still claim them); capabilities leave the index at once.
            tx.put(
                replace(row, seq=revocation.seq, state=KeyState.REVOKED, ended_us=ended_at, capabilities=())
            )
            return revocation

        return self.store.atomic(txn)

    # --- lookups -------------------------------------------------------------------------------

    def lookup_id(self, agent_id: str, now_us: int) -> RegistryEntry | None:
        """The live entry of ``agent_id``, or None (unknown, expired, rotated or revoked)."""
        check_agent_id(agent_id)
        row = self.store.atomic(lambda tx: tx.get(agent_id), write=False)
        return _entry(row, now_us)

    def lookup_alias(self, alias: str, now_us: int) -> RegistryEntry | None:
        """The live entry holding ``alias``, or None."""
        if not is_alias(alias):
            raise ConfigError(f"not an alias: {alias!r:.80}")

        def txn(tx: RecordStoreTx) -> AgentRow | None:
            owner = tx.alias_owner(alias)
            row = tx.get(owner) if owner is not None else None
            return row if row is not None and alias in row.aliases else None

        return _entry(self.store.atomic(txn, write=False), now_us)

    def lookup_capability(
        self, capability: str, now_us: int, limit: int | None = None
    ) -> list[RegistryEntry]:
        """Live entries offering ``capability``, sorted by AgentId, at most ``limit`` (``max_lookup``)."""
        if not is_capability(capability):
            raise ConfigError(f"not a capability: {capability!r:.80}")
        n = self.config.max_lookup if limit is None else max(0, min(limit, self.config.max_lookup))
        rows = self.store.atomic(lambda tx: tx.with_capability(capability, now_us, n), write=False)
        entries = [e for e in (_entry(r, now_us) for r in rows) if e is not None]
        return sorted(entries, key=lambda e: e.agent_id)

    def key_status(self, agent_id: str, now_us: int) -> KeyInfo:
        check_agent_id(agent_id)
        row = self.store.atomic(lambda tx: tx.get(agent_id), write=False)
        if row is None:
            return KeyInfo(KeyStatus.UNKNOWN)
        if row.state is KeyState.REVOKED:
            status = KeyStatus.REVOKED
        elif row.state is KeyState.ROTATED:
            in_grace = now_us < row.ended_us + self.config.rotation_grace_us
            status = KeyStatus.ROTATING if in_grace else KeyStatus.ROTATED
        else:
            status = KeyStatus.ACTIVE if row.expires_us > now_us else KeyStatus.EXPIRED
        return KeyInfo(status, row.seq, row.successor)

    def is_key_valid(self, agent_id: str, now_us: int) -> bool:
        """True for a registered key with a live record, or a rotated key inside its grace period.

        A node that does not require registration should refuse only ended keys:
        ``key_status(...).status in (KeyStatus.ROTATED, KeyStatus.REVOKED)``.
        """
        if not is_agent_id(agent_id):
            return False
        return self.key_status(agent_id, now_us).status in (KeyStatus.ACTIVE, KeyStatus.ROTATING)

    # --- housekeeping --------------------------------------------------------------------------

    def purge(self, now_us: int, limit: int = 1000) -> int:
        """Drop records that expired more than ``hold_us`` ago (their aliases are freed).

        The row of an active key goes; a rotated or revoked key keeps its row (its
        ``seq`` and state) for good. Returns how many records were dropped.
        """
        return self.store.atomic(lambda tx: self._purge(tx, now_us, limit))

    def count(self) -> int:
        """How many keys the store holds (including rotated and revoked ones)."""
        return self.store.atomic(lambda tx: tx.count(), write=False)

    def _purge(self, tx: RecordStoreTx, now_us: int, limit: int) -> int:
        rows = tx.purgeable(now_us - self.config.hold_us, limit)
        for row in rows:
            if row.state is KeyState.ACTIVE:
                tx.delete(row.agent_id)
            else:
                tx.put(
                    replace(
                        row, expires_us=0, record=b"", signature=b"", proof=(), aliases=(), capabilities=()
                    )
                )
        return len(rows)

    def _make_room(self, tx: RecordStoreTx, now_us: int) -> None:
        if tx.count() < self.config.max_keys:
            return
        self._purge(tx, now_us, 16)
        if tx.count() >= self.config.max_keys:
            raise RegistryFull(f"the registry holds {self.config.max_keys} keys")


def _refuse_ended(row: AgentRow) -> None:
    if row.state is KeyState.REVOKED:
        raise KeyRevoked(f"{row.agent_id[:16]}… is revoked")
    if row.state is KeyState.ROTATED:
        raise KeyRotated(f"{row.agent_id[:16]}… was rotated to {row.successor[:16]}…")


def _entry(row: AgentRow | None, now_us: int) -> RegistryEntry | None:
    if row is None or row.state is not KeyState.ACTIVE or not row.record or row.expires_us <= now_us:
        return None
    base = decode_record(row.record)
    rotations = tuple(_rotation_from_envelope(p) for p in row.proof)
    if rotations:
        record = replace(base, agent_id=row.agent_id, seq=row.seq, next_key_digest=None, aliases=row.aliases)
    else:
        record = replace(base, aliases=row.aliases)
    return RegistryEntry(record, SignedRecord(row.record, row.signature), rotations)
