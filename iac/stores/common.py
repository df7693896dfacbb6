"""What several stores share: a SQLite file with its lock and transactions, a Redis client made
from a URL or given, the replay stores' argument checks, and how record stores write an
:class:`~iac.protocol.record_store.AgentRow`'s lists."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from iac.errors import ConfigError, StoreUnavailable
from iac.protocol.replay import DEFAULT_RESERVATION_LEASE_US, ReplayConfig

if TYPE_CHECKING:
    import redis as redis_lib

_T = TypeVar("_T")

_MASK64 = (1 << 64) - 1

#: Largest ``window_size`` the SQLite and Redis replay stores accept (the bitmap is read and
#: written on every call).
MAX_STORE_WINDOW_SIZE = 1 << 16
#: Longest sender string accepted (an AgentId is 64 characters).
MAX_SENDER_LEN = 256


def check_u64(name: str, value: int) -> None:
    if not 0 <= value <= _MASK64:
        raise ConfigError(f"{name} must be an unsigned 64-bit integer, got {value}")


def check_args(sender: str, session_id: int, msg_id: int) -> None:
    check_u64("msg_id", msg_id)
    check_u64("session_id", session_id)
    if not isinstance(sender, str) or not 0 < len(sender) <= MAX_SENDER_LEN:
        raise ConfigError(f"sender must be a non-empty string of at most {MAX_SENDER_LEN} characters")


def check_via(via: str | None) -> None:
    if via is not None and (not isinstance(via, str) or not 0 < len(via) <= MAX_SENDER_LEN):
        raise ConfigError(f"via must be a non-empty string of at most {MAX_SENDER_LEN} characters")


def check_store_config(config: ReplayConfig, reservation_lease_us: int | None) -> int:
    """Check a config for a store with history; return the reservation lease."""
    if config.window_size > MAX_STORE_WINDOW_SIZE:
        raise ConfigError(
            f"window_size {config.window_size} is above {MAX_STORE_WINDOW_SIZE}, the most a store keeps"
        )
    lease = DEFAULT_RESERVATION_LEASE_US if reservation_lease_us is None else reservation_lease_us
    if lease <= 0:
        raise ConfigError(f"reservation_lease_us must be positive, got {lease}")
    return lease


def share_refusal(sender: str, via: str, held_sender: int, held_via: int, cap: int) -> str:
    """The text of a new session refused for its tenant's share (``ReplayConfig.tenant_sessions``)."""
    if held_sender >= cap:
        who = f"sender {sender[:16]}… holds {held_sender} sessions"
    else:
        who = f"neighbour {via[:16]}… brought in {held_via} sessions"
    return f"replay store: {who}, its share (sessions_per_tenant {cap}); refused until one expires"


def json_list(values: Iterable[str]) -> str:
    return json.dumps(list(values), separators=(",", ":"))


def str_tuple(text: str | bytes) -> tuple[str, ...]:
    value = json.loads(text)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StoreUnavailable("registry store holds a malformed row")
    return tuple(value)


class SqliteFile:
    """One store's connection to its SQLite file (WAL, autocommit, usable from any thread) and
    the lock that serializes its calls. Every SQLite failure becomes
    :class:`~iac.errors.StoreUnavailable` naming ``what`` (``"nonce store"``) and the path.

    ``pragmas`` run after WAL is on, then the ``schema`` script; a failure there closes the
    connection."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        what: str,
        *,
        timeout_s: float,
        pragmas: Sequence[str] = (),
        schema: str = "",
    ) -> None:
        self.path = os.fspath(path)
        self.what = what
        self.lock = threading.Lock()
        try:
            self.db = sqlite3.connect(
                self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise self.unavailable(exc, "cannot open") from None
        try:
            for stmt in ("PRAGMA journal_mode=WAL", *pragmas):
                self.db.execute(stmt)
            if schema:
                self.db.executescript(schema)
        except sqlite3.Error as exc:
            self.db.close()
            raise self.unavailable(exc, "cannot open") from None

    def unavailable(self, exc: sqlite3.Error, doing: str = "") -> StoreUnavailable:
        if doing:
            return StoreUnavailable(f"{doing} {self.what} {self.path!r}: {exc}")
        return StoreUnavailable(f"{self.what} {self.path!r} failed: {exc}")

    def transaction(self, fn: Callable[[sqlite3.Connection], _T], *, write: bool = True) -> _T:
        """``fn(db)`` in one transaction (``BEGIN IMMEDIATE``, or ``BEGIN`` for a read), under the
        lock: committed when it returns, rolled back when it raises (its own errors pass through)."""
        with self.lock:
            db = self.db
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = fn(db)
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise self.unavailable(exc) from None

    def one(self, sql: str, args: Sequence[Any] = ()) -> Any:
        """The first row of one statement run outside a transaction, under the lock."""
        with self.lock:
            try:
                return self.db.execute(sql, args).fetchone()
            except sqlite3.Error as exc:
                raise self.unavailable(exc) from None

    def close(self) -> None:
        with self.lock:
            self.db.close()


class RedisBacked:
    """A store on a Redis client: :func:`redis_client`'s client, closed by :meth:`close` when
    the store made it; :meth:`_call` maps the client's failures to
    :class:`~iac.errors.StoreUnavailable` naming ``what``."""

    def __init__(self, redis: str | redis_lib.Redis, who: str, what: str, *, timeout_s: float) -> None:
        self._client, self._owns_client, self._errors = redis_client(redis, who, timeout_s=timeout_s)
        self._what = what

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._errors.RedisError as exc:
            raise StoreUnavailable(f"Redis {self._what} unavailable: {exc}") from None

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def redis_client(
    redis: str | redis_lib.Redis, who: str, *, timeout_s: float
) -> tuple[redis_lib.Redis, bool, Any]:
    """``(client, owned, redis.exceptions)``: a client made from a ``redis://`` URL with
    ``timeout_s`` socket timeouts (owned: the store closes it), or the client given. Without the
    redis package, a :class:`~iac.errors.ConfigError` naming ``who`` and the extra to install."""
    try:
        import redis as redis_mod
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError(f"{who} needs the redis client: pip install 'iac-mesh[redis]'") from None
    if isinstance(redis, str):
        client = redis_mod.Redis.from_url(redis, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return client, True, redis_mod.exceptions
    return redis, False, redis_mod.exceptions
