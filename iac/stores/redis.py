"""A replay store in Redis, shared by every node or gateway that uses the same key prefix.

:class:`RedisReplayStore` implements :class:`~iac.protocol.replay.ReplayStore`
with the semantics of :class:`~iac.stores.sqlite.SqliteReplayStore` (the
in-memory store's windows, plus history and reservation leases). Each call is
one Lua script run with ``EVALSHA``, atomic in Redis.
:attr:`RedisReplayStore.history_start_us` is the moment this key prefix first
appeared in Redis, so a Redis that restarted without persistence is detected and
treated as a store that has just started.

The interface is synchronous and the store is thread-safe, so an asyncio node
may call it through ``asyncio.to_thread`` (each call is one Redis round trip).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal

from iac.errors import ConfigError, MessageRejected, StoreUnavailable
from iac.protocol.replay import ReplayConfig, StoreSettings, Verdict, highest_of
from iac.stores.common import RedisBacked, check_args, check_store_config, check_via, share_refusal
from iac.stores.redis_scripts import CHECK, FRONTIER, RENEW

if TYPE_CHECKING:
    import redis as redis_lib

# Verdict codes returned by the script.
_NEW, _DUPLICATE, _IN_PROGRESS, _TOO_OLD, _FULL, _LOST, _OK, _SENDER_SHARE, _VIA_SHARE = range(9)
_VERDICTS = {
    _NEW: Verdict.NEW,
    _DUPLICATE: Verdict.DUPLICATE,
    _IN_PROGRESS: Verdict.IN_PROGRESS,
    _TOO_OLD: Verdict.TOO_OLD,
}


def _ring_size(window_size: int) -> int:
    """The bitmap ring: the next power of two >= window_size (it divides 2**32, so slot = id mod R)."""
    return 1 << max(3, (window_size - 1).bit_length())


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisReplayStore(StoreSettings, RedisBacked):
    """A :class:`~iac.ReplayStore` in Redis, shared by every node or gateway that uses the same prefix.

    Each call is one Lua script run with ``EVALSHA`` (atomic in Redis). Keys,
    for ``key_prefix`` ``P``, session ``S = <sender>:<session_id as 16 hex>``:

    * ``P:epoch`` — string, no TTL: when this prefix's history began (receiver
      clock, us). If it disappears (Redis restarted without persistence, or
      evicted it), the next call re-creates it, refuses its message with
      ``stale_message`` and :attr:`history_start_us` moves to then.
    * ``P:clock`` — string: the high-water mark of ``now_us`` (TTL ``2 * max_skew``).
    * ``P:sessions`` — sorted set of ``S`` scored by newest arrival: the live
      session count for ``max_sessions`` and expiry (TTL ``2 * max_skew``).
    * ``P:w:S`` — hash: ``hh``/``hl`` the highest id's 32-bit halves, ``ls``
      the newest arrival, ``r`` the ring size.
    * ``P:b:S`` — string bitmap, a ring of ``R`` bits (``R`` = the next power of
      two >= ``window_size``): id ``x`` is bit ``x mod R``.
    * ``P:p:S`` — hash: reserved id (16 hex) -> when the reservation lapses.
    * ``P:ts:<sender>`` and ``P:tv:<via>`` — sorted sets of ``S`` scored by
      newest arrival: the sessions of a sender, and those a neighbour brought in
      (the ``v`` field of ``P:w:S``), counted against ``ReplayConfig.tenant_sessions``.

    The three ``P:?:S`` keys get a TTL of ``2 * max_skew`` (rounded up to a
    millisecond), refreshed on every call that writes them, so Redis deletes a
    session 2 × max_skew after its newest message even if no node calls again.
    Expiry is also checked against the callers' clock (``ls`` against the
    high-water mark), which gives the same results as the in-memory store.
    On Redis Cluster, put the prefix in braces (``{iac}``) so all keys share a slot.

    Persistence: with RDB snapshots only, a Redis restart may bring back an old
    snapshot and forget recent ids while ``P:epoch`` survives; use AOF
    (``appendonly yes``, ``appendfsync always``) or no persistence at all (the
    epoch check then covers the restart). ``maxmemory-policy noeviction`` is
    recommended; a Redis out of memory refuses new ids with ``replay_store_full``.

    Args:
        redis: a ``redis://`` URL or a ``redis.Redis`` client (synchronous). A
            client made from a URL is closed by :meth:`close`.
        config: window size, skew and session cap.
        key_prefix: prefix of every key (nodes that share it share replay state).
        started_at_us: the start of history if this prefix is new in Redis
            (default: Redis' own ``TIME``).
        reservation_lease_us: how long a reservation lasts unless it is committed,
            released or renewed (default 5 s).
        timeout_s: socket connect and read timeout of a client made from a URL.
    """

    #: Whether other processes can share this store (processes on any host): see
    #: :func:`iac.protocol.tickets.check_cluster_stores`.
    shared = True

    def __init__(
        self,
        redis: str | redis_lib.Redis,
        config: ReplayConfig | None = None,
        *,
        key_prefix: str = "iac:replay",
        started_at_us: int | None = None,
        reservation_lease_us: int | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        self._config = config if config is not None else ReplayConfig()
        self._reservation_lease_us: int = check_store_config(self._config, reservation_lease_us)
        if not key_prefix:
            raise ConfigError("key_prefix must not be empty")
        self._prefix = key_prefix
        self._ring = _ring_size(self._config.window_size)
        self._ttl_ms = str(math.ceil(self._config.retention_us / 1000))
        super().__init__(redis, "RedisReplayStore", "replay store", timeout_s=timeout_s)
        self._script = self._client.register_script(CHECK)
        self._renew_script = self._client.register_script(RENEW)
        self._frontier_script = self._client.register_script(FRONTIER)
        self._k_epoch = f"{key_prefix}:epoch"
        self._k_clock = f"{key_prefix}:clock"
        self._k_index = f"{key_prefix}:sessions"
        try:
            self._history_start_us: int = self._call(self._init_epoch, started_at_us)
        except BaseException:
            self.close()
            raise

    # --- ReplayStore -------------------------------------------------------------------------

    @property
    def key_prefix(self) -> str:
        return self._prefix

    def check_and_mark(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        return self._verdict(self._run("mark", sender, session_id, msg_id, now_us, via))

    def reserve(
        self, sender: str, session_id: int, msg_id: int, now_us: int, *, via: str | None = None
    ) -> Verdict:
        return self._verdict(self._run("reserve", sender, session_id, msg_id, now_us, via))

    def commit(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        self._run("commit", sender, session_id, msg_id, now_us)

    def release(self, sender: str, session_id: int, msg_id: int, now_us: int) -> None:
        self._run("release", sender, session_id, msg_id, now_us)

    def expire(self, now_us: int) -> int:
        """Drop sessions whose retention has passed from the live count; return how many.

        Their keys are already dead to every check (``ls`` is too old) and Redis
        deletes them by TTL.
        """
        code, value = self._run("expire", "-", 0, 0, now_us)
        return value if code == _OK else 0

    def renew(self, keys: Sequence[tuple[str, int, int]], now_us: int) -> int:
        by_session: dict[tuple[str, int], list[int]] = {}
        for sender, session_id, msg_id in keys:
            check_args(sender, session_id, msg_id)
            by_session.setdefault((sender, session_id), []).append(msg_id)
        if not by_session:
            return 0
        rkeys = [self._k_epoch, self._k_clock]
        args = [str(now_us), str(self._reservation_lease_us), self._ttl_ms]
        for (sender, session_id), ids in by_session.items():
            rkeys.append(self.session_key("p", sender, session_id))
            args.append(str(len(ids)))
            args.extend(f"{m:016x}" for m in ids)
        return int(self._call(self._renew_script, rkeys, args))

    def frontier(
        self, sender: str, session_id: int, now_us: int, exclude: Collection[int] = ()
    ) -> int | None:
        check_args(sender, session_id, 0)
        rkeys = [
            self._k_epoch,
            self._k_clock,
            self.session_key("w", sender, session_id),
            self.session_key("b", sender, session_id),
            self.session_key("p", sender, session_id),
        ]
        row = self._call(self._frontier_script, rkeys, [str(self._config.window_size)])
        if not row:
            return None
        clock_s, hh, hl, last_seen, ring, back, pend = row
        clock = max(int(clock_s), now_us)
        if int(last_seen) < clock - self._config.retention_us:
            return None  # expired
        highest = (int(hh) << 32) | int(hl)
        if int(ring) != self._ring:
            return highest  # stored with another window size: the script counts every id as done
        n = self._config.window_size
        done = 1 << int(back) if int(back) >= 0 else 0
        others = [
            m
            for m, lapse in ((int(pend[i], 16), int(pend[i + 1])) for i in range(0, len(pend), 2))
            if lapse >= clock and m not in exclude
        ]
        return highest_of(highest, n, done, others)

    # --- introspection and lifetime ----------------------------------------------------------

    def session_key(self, kind: Literal["w", "b", "p"], sender: str, session_id: int) -> str:
        """The Redis key of one session's window (``w``), bitmap (``b``) or reservations (``p``)."""
        return f"{self._prefix}:{kind}:{sender}:{session_id:016x}"

    def __len__(self) -> int:
        """How many sessions are tracked (expired ones go at the next call)."""
        return int(self._call(self._client.zcard, self._k_index))

    @property
    def pending_count(self) -> int:
        """Reserved ids across all sessions of this prefix (a SCAN: for tests and debugging)."""

        def count() -> int:
            total = 0
            for key in self._client.scan_iter(match=_glob_escape(f"{self._prefix}:p:") + "*", count=1000):
                total += int(self._client.hlen(key))
            return total

        return int(self._call(count))

    def __enter__(self) -> RedisReplayStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RedisReplayStore(key_prefix={self._prefix!r}, window_size={self._config.window_size})"

    # --- internals ---------------------------------------------------------------------------

    def _call(self, fn: Any, *args: Any) -> Any:
        """Run a Redis call; map client failures to this library's errors."""
        try:
            return fn(*args)
        except self._errors.ResponseError as exc:
            if str(exc).startswith("OOM"):
                raise MessageRejected(f"Redis is out of memory: {exc}", reason="replay_store_full") from None
            raise StoreUnavailable(f"Redis refused the replay store's command: {exc}") from None
        except self._errors.RedisError as exc:
            raise StoreUnavailable(f"Redis replay store unavailable: {exc}") from None

    def _init_epoch(self, started_at_us: int | None) -> int:
        if started_at_us is None:
            sec, usec = self._client.time()
            started_at_us = int(sec) * 1_000_000 + int(usec)
        self._client.set(self._k_epoch, str(started_at_us), nx=True)
        value = self._client.get(self._k_epoch)
        if value is None:  # deleted between the two calls: take ours
            return started_at_us
        return int(value)

    def _run(
        self, op: str, sender: str, session_id: int, msg_id: int, now_us: int, via: str | None = None
    ) -> tuple[int, int]:
        check_args(sender, session_id, msg_id)
        check_via(via)
        via = sender if via is None else via
        sid = f"{sender}:{session_id:016x}"
        keys = [
            self._k_epoch,
            self._k_clock,
            self._k_index,
            f"{self._prefix}:w:{sid}",
            f"{self._prefix}:b:{sid}",
            f"{self._prefix}:p:{sid}",
            f"{self._prefix}:ts:{sender}",
            f"{self._prefix}:tv:{via}",
        ]
        args = [
            op,
            str(now_us),
            str(self._config.retention_us),
            self._ttl_ms,
            str(self._config.window_size),
            str(self._ring),
            str(self._config.max_sessions),
            sid,
            str(msg_id >> 32),
            str(msg_id & 0xFFFFFFFF),
            f"{msg_id:016x}",
            str(self._reservation_lease_us),
            str(self._config.tenant_sessions),
            via,
            f"{self._prefix}:tv:",
        ]
        code, value = self._call(self._script, keys, args)
        code = int(code)
        value = int(value)
        if code == _LOST:
            self._history_start_us = value
            if op in ("mark", "reserve"):
                raise MessageRejected(
                    "the Redis replay store lost its history (restart without persistence, or eviction); "
                    f"it starts again at {value} and cannot vouch for this message",
                    reason="stale_message",
                )
        if code in (_SENDER_SHARE, _VIA_SHARE):
            held = (value, 0) if code == _SENDER_SHARE else (0, value)
            raise MessageRejected(
                share_refusal(sender, via, *held, self._config.tenant_sessions), reason="replay_store_full"
            )
        if code == _FULL:
            raise MessageRejected(
                f"replay store tracks {self._config.max_sessions} sessions (max_sessions); "
                "new session refused until one expires",
                reason="replay_store_full",
            )
        return code, value

    @staticmethod
    def _verdict(result: tuple[int, int]) -> Verdict:
        return _VERDICTS[result[0]]
