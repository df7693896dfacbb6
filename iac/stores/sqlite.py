"""A replay store in one SQLite file: it survives a restart and the processes of a host share it.

:class:`SqliteReplayStore` implements :class:`~iac.protocol.replay.ReplayStore`
with exactly the semantics of :class:`~iac.stores.memory.MemoryReplayStore`: per
``(sender, session_id)`` the highest msg_id and a bitmap of the ``window_size``
ids ending at it, RFC 1982 serial arithmetic on 64 bits, two-phase
reserve/commit/release, expiry ``2 * max_skew`` after the session's newest
arrival (by the high-water mark of the ``now_us`` values the store was given, so
a clock stepping back never expires a window early) and a hard cap of
``max_sessions`` live windows (``replay_store_full``). Each call
is one ``BEGIN IMMEDIATE`` transaction, atomic across processes.

What it adds over the in-memory store:

* **History.** A replay captured before a restart is still refused after it.
  :attr:`SqliteReplayStore.history_start_us` is None unless the database was
  created with a recorded start.
* **Reservation lease.** A reservation belongs to a process that may crash while
  its handler runs. It therefore lapses ``reservation_lease_us`` (default 5 s)
  after it was made or last renewed (:meth:`~SqliteReplayStore.renew`, which
  its holder calls every third of the lease); a copy then gets NEW instead of
  IN_PROGRESS, so the sender's retransmission is handled soon after the holder
  died. :meth:`~SqliteReplayStore.commit` after a lapse still marks the id done.

The interface is synchronous and the store is thread-safe, so an asyncio node
may call it through ``asyncio.to_thread`` (each call is one short transaction).
"""

from __future__ import annotations

import os
import sqlite3
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from iac.errors import ConfigError, MessageRejected
from iac.protocol.replay import ReplayConfig, StoreSettings, Verdict, highest_of, serial_diff
from iac.stores.common import SqliteFile, check_args, check_store_config, check_via, share_refusal

_MOD = 1 << 64
_MASK64 = _MOD - 1
_HALF = 1 << 63


def _to_i64(value: int) -> int:
    """An unsigned 64-bit value as SQLite's signed INTEGER (two's complement)."""
    return value - _MOD if value >= _HALF else value


def _from_i64(value: int) -> int:
    return value & _MASK64


@dataclass(slots=True)
class _State:
    """One session's window, as loaded from and saved to a SQLite row."""

    highest: int
    bitmap: int  # bit i set: id (highest - i) is done
    last_seen_us: int
    pending: dict[int, int]  # reserved msg_id -> when the reservation lapses (receiver clock, us)
    via: str = ""  # the neighbour that delivered the session's first message (its share counts it)


_PENDING = struct.Struct("<Qq")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS iac_replay_state (
        id INTEGER PRIMARY KEY CHECK (id = 0),
        version INTEGER NOT NULL,
        clock_us INTEGER NOT NULL,
        sessions INTEGER NOT NULL,
        started_at_us INTEGER
    )""",
    """CREATE TABLE IF NOT EXISTS iac_replay_window (
        sender TEXT NOT NULL,
        session_id INTEGER NOT NULL,
        highest INTEGER NOT NULL,
        bitmap BLOB NOT NULL,
        last_seen_us INTEGER NOT NULL,
        pending BLOB NOT NULL,
        via TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (sender, session_id)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS iac_replay_window_last_seen ON iac_replay_window (last_seen_us)",
)
#: Made after the ``via`` column is there (a file from before it had none: it is added).
_VIA_INDEX = "CREATE INDEX IF NOT EXISTS iac_replay_window_via ON iac_replay_window (via)"
_SCHEMA_VERSION = 1


class SqliteReplayStore(StoreSettings):
    """A :class:`~iac.ReplayStore` in one SQLite file (WAL): survives restarts, shareable by processes.

    Every call runs in one ``BEGIN IMMEDIATE`` transaction, which takes the
    database's write lock first, so check-and-set is atomic across every
    process and thread that opens the same file. Tables:

    * ``iac_replay_state`` (one row): schema version, the clock high-water mark,
      the live session count and the optional recorded start of history.
    * ``iac_replay_window``: one row per ``(sender, session_id)`` with the highest
      id (signed 64-bit two's complement), the bitmap (``ceil(N / 8)`` bytes,
      little-endian, bit ``i`` = id ``highest - i``), the newest arrival and the
      reservations (16 bytes each: ``<Q`` msg_id, ``<q`` lapse time).

    Expired rows are deleted inside every call (an index on ``last_seen_us``
    makes that cheap when there is nothing to delete).

    Args:
        path: the database file (created if missing). ``":memory:"`` works but
            has no history across restarts.
        config: window size, skew and session cap (:class:`~iac.ReplayConfig`).
        started_at_us: only used when this call creates the database: recorded as
            the start of its history (:attr:`history_start_us`). The default,
            None, declares a database that has all history (use it when no other
            store accepted messages for this node before).
        reservation_lease_us: how long a reservation lasts unless it is
            committed, released or renewed (default 5 s). A holder that cannot
            renew it for that long (its process died, or stalled) loses it.
        synchronous: SQLite's ``synchronous`` pragma. ``"FULL"`` (default) makes
            every accepted id durable across a power loss; ``"NORMAL"`` is faster
            and survives a process crash, but a power loss may forget the last
            ids accepted.
        busy_timeout_s: how long a call waits for another process's transaction
            before it fails with :class:`StoreUnavailable`.
    """

    #: Whether other processes can share this store (the processes of a host): see
    #: :func:`iac.protocol.tickets.check_cluster_stores`.
    shared = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        config: ReplayConfig | None = None,
        *,
        started_at_us: int | None = None,
        reservation_lease_us: int | None = None,
        synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout_s: float = 5.0,
    ) -> None:
        self._config = config if config is not None else ReplayConfig()
        self._reservation_lease_us: int = check_store_config(self._config, reservation_lease_us)
        if synchronous not in ("FULL", "NORMAL"):
            raise ConfigError(f"synchronous must be 'FULL' or 'NORMAL', got {synchronous!r}")
        if busy_timeout_s <= 0:
            raise ConfigError(f"busy_timeout_s must be positive, got {busy_timeout_s}")
        self._n = self._config.window_size
        self._nbytes = (self._n + 7) // 8
        self._full_mask = (1 << self._n) - 1
        self._file = SqliteFile(
            path, "replay store", timeout_s=busy_timeout_s, pragmas=(f"PRAGMA synchronous={synchronous}",)
        )
        self._path = self._file.path
        try:
            self._history_start_us: int | None = self._file.transaction(
                lambda db: self._create(db, started_at_us)
            )
        except BaseException:
            self._file.close()
            raise

    # --- ReplayStore -------------------------------------------------------------------------

    def check_and_mark(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        check_args(sender, session_id, msg_id)
        check_via(via)
        return self._file.transaction(
            lambda db: self._check(db, sender, session_id, msg_id, now_us, False, via)
        )

    def reserve(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        check_args(sender, session_id, msg_id)
        check_via(via)
        return self._file.transaction(
            lambda db: self._check(db, sender, session_id, msg_id, now_us, True, via)
        )

    def commit(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        check_args(sender, session_id, msg_id)
        self._file.transaction(lambda db: self._finish(db, sender, session_id, msg_id, now_us, True))

    def release(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        check_args(sender, session_id, msg_id)
        self._file.transaction(lambda db: self._finish(db, sender, session_id, msg_id, now_us, False))

    def expire(self, now_us: int) -> int:
        return self._file.transaction(lambda db: self._expire_due(db, now_us)[1])

    def renew(self, keys: Sequence[tuple[str, int, int]], now_us: int) -> int:
        for sender, session_id, msg_id in keys:
            check_args(sender, session_id, msg_id)
        if not keys:
            return 0
        return self._file.transaction(lambda db: self._renew(db, keys, now_us))

    def frontier(
        self, sender: str, session_id: int, now_us: int, exclude: Collection[int] = ()
    ) -> int | None:
        check_args(sender, session_id, 0)
        return self._file.transaction(lambda db: self._frontier(db, sender, session_id, now_us, exclude))

    # --- introspection and lifetime ----------------------------------------------------------

    def __len__(self) -> int:
        """How many sessions are tracked (expired ones go at the next call)."""
        return self._file.transaction(
            lambda db: int(db.execute("SELECT sessions FROM iac_replay_state").fetchone()[0])
        )

    @property
    def pending_count(self) -> int:
        """How many ids are reserved and neither committed, released nor pruned (all sessions)."""
        return self._file.transaction(
            lambda db: sum(
                len(row[0]) // _PENDING.size for row in db.execute("SELECT pending FROM iac_replay_window")
            )
        )

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SqliteReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SqliteReplayStore({self._path!r}, window_size={self._n})"

    # --- internals ---------------------------------------------------------------------------

    def _create(self, db: sqlite3.Connection, started_at_us: int | None) -> int | None:
        for stmt in _SCHEMA:
            db.execute(stmt)
        columns = {row[1] for row in db.execute("PRAGMA table_info(iac_replay_window)")}
        if "via" not in columns:
            db.execute("ALTER TABLE iac_replay_window ADD COLUMN via TEXT NOT NULL DEFAULT ''")
        db.execute(_VIA_INDEX)
        db.execute(
            "INSERT OR IGNORE INTO iac_replay_state (id, version, clock_us, sessions, started_at_us) "
            "VALUES (0, ?, ?, 0, ?)",
            (_SCHEMA_VERSION, -(1 << 63), started_at_us),
        )
        version, start = db.execute("SELECT version, started_at_us FROM iac_replay_state").fetchone()
        if version != _SCHEMA_VERSION:
            raise ConfigError(f"replay store {self._path!r} has schema version {version}, expected 1")
        return None if start is None else int(start)

    def _expire_due(self, db: sqlite3.Connection, now_us: int) -> tuple[int, int]:
        """Advance the clock high-water mark, drop expired windows; return (clock, dropped)."""
        clock, sessions = db.execute("SELECT clock_us, sessions FROM iac_replay_state").fetchone()
        clock = max(int(clock), now_us)
        dropped = db.execute(
            "DELETE FROM iac_replay_window WHERE last_seen_us < ?", (clock - self._config.retention_us,)
        ).rowcount
        db.execute(
            "UPDATE iac_replay_state SET clock_us = ?, sessions = ? WHERE id = 0", (clock, sessions - dropped)
        )
        return clock, dropped

    def _load(self, db: sqlite3.Connection, sender: str, session_id: int) -> _State | None:
        row = db.execute(
            "SELECT highest, bitmap, last_seen_us, pending, via FROM iac_replay_window "
            "WHERE sender = ? AND session_id = ?",
            (sender, _to_i64(session_id)),
        ).fetchone()
        if row is None:
            return None
        highest, blob, last_seen, pend, via = row
        bitmap = int.from_bytes(blob, "little")
        if len(blob) * 8 < self._n:
            # Stored with a smaller window_size: ids beyond it are unknown, so count them as done.
            bitmap |= self._full_mask & ~((1 << (len(blob) * 8)) - 1)
        pending = dict(_PENDING.iter_unpack(pend))
        return _State(_from_i64(highest), bitmap & self._full_mask, int(last_seen), pending, str(via))

    def _save(self, db: sqlite3.Connection, sender: str, session_id: int, st: _State) -> None:
        db.execute(
            "INSERT OR REPLACE INTO iac_replay_window "
            "(sender, session_id, highest, bitmap, last_seen_us, pending, via) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                sender,
                _to_i64(session_id),
                _to_i64(st.highest),
                st.bitmap.to_bytes(self._nbytes, "little"),
                st.last_seen_us,
                b"".join(_PENDING.pack(m, t) for m, t in st.pending.items()),
                st.via,
            ),
        )

    def _advance(self, st: _State, msg_id: int, clock: int) -> None:
        shift = serial_diff(msg_id, st.highest)
        st.bitmap = (st.bitmap << shift) & self._full_mask if shift < self._n else 0
        st.highest = msg_id
        if st.pending:
            st.pending = {
                m: t for m, t in st.pending.items() if serial_diff(msg_id, m) < self._n and t >= clock
            }

    def _mark(self, st: _State, msg_id: int, offset: int, clock: int, reserve: bool) -> None:
        if reserve:
            st.pending[msg_id] = clock + self._reservation_lease_us
        else:
            st.bitmap |= 1 << offset

    def _check(
        self,
        db: sqlite3.Connection,
        sender: str,
        session_id: int,
        msg_id: int,
        now_us: int,
        reserve: bool,
        via: str | None,
    ) -> Verdict:
        clock, _ = self._expire_due(db, now_us)
        st = self._load(db, sender, session_id)
        if st is None:
            (sessions,) = db.execute("SELECT sessions FROM iac_replay_state").fetchone()
            if sessions >= self._config.max_sessions:
                raise MessageRejected(
                    f"replay store tracks {sessions} sessions (max_sessions); "
                    "new session refused until one expires",
                    reason="replay_store_full",
                )
            via = sender if via is None else via
            cap = self._config.tenant_sessions
            count = "SELECT COUNT(*) FROM iac_replay_window WHERE "
            (held_sender,) = db.execute(count + "sender = ?", (sender,)).fetchone()
            (held_via,) = db.execute(count + "via = ?", (via,)).fetchone()
            if held_sender >= cap or held_via >= cap:
                raise MessageRejected(
                    share_refusal(sender, via, held_sender, held_via, cap), reason="replay_store_full"
                )
            st = _State(highest=msg_id, bitmap=0, last_seen_us=clock, pending={}, via=via)
            self._mark(st, msg_id, 0, clock, reserve)
            self._save(db, sender, session_id, st)
            db.execute("UPDATE iac_replay_state SET sessions = sessions + 1 WHERE id = 0")
            return Verdict.NEW
        st.last_seen_us = clock
        verdict = self._decide(st, msg_id, clock, reserve)
        self._save(db, sender, session_id, st)
        return verdict

    def _decide(self, st: _State, msg_id: int, clock: int, reserve: bool) -> Verdict:
        offset = -serial_diff(msg_id, st.highest)  # how far behind the highest; 2**63 counts as behind
        if offset < 0:
            self._advance(st, msg_id, clock)
            self._mark(st, msg_id, 0, clock, reserve)
            return Verdict.NEW
        if offset >= self._n:
            return Verdict.TOO_OLD
        if st.bitmap >> offset & 1:
            return Verdict.DUPLICATE
        lapse = st.pending.get(msg_id)
        if lapse is not None:
            if lapse >= clock:
                return Verdict.IN_PROGRESS
            del st.pending[msg_id]  # the holder never finished (crashed): the reservation lapsed
        self._mark(st, msg_id, offset, clock, reserve)
        return Verdict.NEW

    def _renew(self, db: sqlite3.Connection, keys: Sequence[tuple[str, int, int]], now_us: int) -> int:
        clock, _ = self._expire_due(db, now_us)
        by_session: dict[tuple[str, int], list[int]] = {}
        for sender, session_id, msg_id in keys:
            by_session.setdefault((sender, session_id), []).append(msg_id)
        renewed = 0
        lapse = clock + self._reservation_lease_us
        for (sender, session_id), ids in by_session.items():
            st = self._load(db, sender, session_id)
            if st is None:
                continue
            n = 0
            for msg_id in ids:
                held = st.pending.get(msg_id)
                if held is not None and held >= clock:  # a lapsed reservation is no longer its holder's
                    st.pending[msg_id] = lapse
                    n += 1
            if n:
                self._save(db, sender, session_id, st)
                renewed += n
        return renewed

    def _frontier(
        self, db: sqlite3.Connection, sender: str, session_id: int, now_us: int, exclude: Collection[int]
    ) -> int | None:
        clock, _ = self._expire_due(db, now_us)
        st = self._load(db, sender, session_id)
        if st is None:
            return None
        others = [m for m, lapse in st.pending.items() if lapse >= clock and m not in exclude]
        return highest_of(st.highest, self._n, st.bitmap, others)

    def _finish(
        self, db: sqlite3.Connection, sender: str, session_id: int, msg_id: int, now_us: int, commit: bool
    ) -> None:
        clock, _ = self._expire_due(db, now_us)
        st = self._load(db, sender, session_id)
        if st is None:
            return  # expired: any replay is now stale
        st.pending.pop(msg_id, None)
        if commit:
            offset = -serial_diff(msg_id, st.highest)
            if offset < 0:  # commit without reserve, ahead of the window: advance to it
                self._advance(st, msg_id, clock)
                offset = 0
            if offset < self._n:
                st.bitmap |= 1 << offset
        self._save(db, sender, session_id, st)
