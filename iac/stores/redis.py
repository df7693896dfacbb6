"""A replay store in Redis, shared by every node or gateway that uses the same key prefix.

:class:`RedisReplayStore` implements :class:`~iac.protocol.replay.ReplayStore`
with the semantics of :class:`~iac.stores.sqlite.SqliteReplayStore` (the
in-memory store's windows, plus history and reservation lapse). Each call is
one Lua script run with ``EVALSHA``, atomic in Redis.
:attr:`RedisReplayStore.history_start_us` is the moment this key prefix first
appeared in Redis, so a Redis that restarted without persistence is detected and
treated as a store that has just started.

The interface is synchronous and the store is thread-safe, so an asyncio node
may call it through ``asyncio.to_thread`` (each call is one Redis round trip).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from iac.errors import ConfigError, ReplayStoreFull, StaleMessage, StoreUnavailable
from iac.protocol.replay import ReplayConfig, StoreSettings, Verdict
from iac.stores.common import check_args, check_store_config

if TYPE_CHECKING:
    import redis as redis_lib

# Verdict codes returned by the script.
_NEW, _DUPLICATE, _IN_PROGRESS, _TOO_OLD, _FULL, _LOST, _OK = range(7)
_VERDICTS = {
    _NEW: Verdict.NEW,
    _DUPLICATE: Verdict.DUPLICATE,
    _IN_PROGRESS: Verdict.IN_PROGRESS,
    _TOO_OLD: Verdict.TOO_OLD,
}

# One script for every operation, so each call is one atomic step in Redis.
# Lua numbers are doubles: 64-bit ids travel as two 32-bit halves (hi, lo) and
# serial arithmetic is done on the halves; every number given to redis.call is
# formatted with %.0f (Lua would otherwise print 1.7e+15).
_LUA = r"""
local TWO32 = 4294967296
local TWO31 = 2147483648
local function str(x) return string.format('%.0f', x) end
local function sub64(ahi, alo, bhi, blo)
  local lo = alo - blo
  local borrow = 0
  if lo < 0 then lo = lo + TWO32; borrow = 1 end
  return (ahi - bhi - borrow) % TWO32, lo
end

local k_epoch, k_clock, k_index, k_w, k_b, k_p = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op = ARGV[1]
local now = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local ttl_ms = ARGV[4]
local n = tonumber(ARGV[5])
local r = tonumber(ARGV[6])
local max_sessions = tonumber(ARGV[7])
local member = ARGV[8]
local mhi = tonumber(ARGV[9])
local mlo = tonumber(ARGV[10])
local mhex = ARGV[11]
local res_ttl = tonumber(ARGV[12])

-- Redis lost our keys (restart without persistence, eviction): history starts again now.
if redis.call('EXISTS', k_epoch) == 0 then
  redis.call('SET', k_epoch, str(now))
  return {5, str(now)}
end

local clock = tonumber(redis.call('GET', k_clock) or '0')
if now > clock then clock = now end
redis.call('SET', k_clock, str(clock), 'PX', ttl_ms)
local limit = clock - retention
local dropped = redis.call('ZREMRANGEBYSCORE', k_index, '-inf', '(' .. str(limit))
redis.call('PEXPIRE', k_index, ttl_ms)
if op == 'expire' then return {6, dropped} end

local function touch()
  redis.call('PEXPIRE', k_w, ttl_ms)
  redis.call('PEXPIRE', k_b, ttl_ms)
  redis.call('PEXPIRE', k_p, ttl_ms)
end
local function slot(lo) return lo % r end
local function clear_span(a, cnt)
  local i = a
  local e = a + cnt
  while i < e and i % 8 ~= 0 do redis.call('SETBIT', k_b, i, 0); i = i + 1 end
  local full = math.floor((e - i) / 8)
  if full > 0 then
    redis.call('SETRANGE', k_b, i / 8, string.rep('\0', full))
    i = i + full * 8
  end
  while i < e do redis.call('SETBIT', k_b, i, 0); i = i + 1 end
end
local function mark(reserve)
  if reserve then
    redis.call('HSET', k_p, mhex, str(clock + res_ttl))
  else
    redis.call('SETBIT', k_b, slot(mlo), 1)
  end
end

local w = redis.call('HMGET', k_w, 'hh', 'hl', 'ls', 'r')
local exists = w[1] ~= false
if exists and tonumber(w[3]) < limit then
  redis.call('DEL', k_w, k_b, k_p)
  exists = false
end
if not exists then
  if op == 'commit' or op == 'release' then return {6, 0} end
  if redis.call('ZCARD', k_index) >= max_sessions then return {4, 0} end
  redis.call('DEL', k_b, k_p)
  redis.call('HSET', k_w, 'hh', str(mhi), 'hl', str(mlo), 'ls', str(clock), 'r', str(r))
  mark(op == 'reserve')
  redis.call('ZADD', k_index, str(clock), member)
  touch()
  return {0, 0}
end

local hhi, hlo = tonumber(w[1]), tonumber(w[2])
if tonumber(w[4]) ~= r then
  -- window_size changed: which ids are done is unknown, so count every id in the window as done
  redis.call('DEL', k_b)
  redis.call('SETRANGE', k_b, 0, string.rep('\255', r / 8))
  redis.call('HSET', k_w, 'r', str(r))
end

local dhi, dlo = sub64(mhi, mlo, hhi, hlo)
local ahead = (dhi ~= 0 or dlo ~= 0) and dhi < TWO31
local behind = 0
if not ahead then
  local bhi, blo = sub64(hhi, hlo, mhi, mlo)
  if bhi == 0 and blo < n then behind = blo else behind = n end
end

local function advance()
  local s = r
  if dhi == 0 and dlo < r then s = dlo end
  if s >= r then
    redis.call('DEL', k_b)
  else
    local start = (hlo + 1) % r
    if start + s <= r then
      clear_span(start, s)
    else
      clear_span(start, r - start)
      clear_span(0, s - (r - start))
    end
  end
  redis.call('HSET', k_w, 'hh', str(mhi), 'hl', str(mlo))
  if redis.call('HLEN', k_p) > n then
    -- prune reservations that left the window or lapsed (amortized: at most n + 1 are kept)
    local all = redis.call('HGETALL', k_p)
    for i = 1, #all, 2 do
      local f = all[i]
      local fhi = tonumber(string.sub(f, 1, 8), 16)
      local flo = tonumber(string.sub(f, 9, 16), 16)
      local bhi, blo = sub64(mhi, mlo, fhi, flo)
      if tonumber(all[i + 1]) < clock or bhi ~= 0 or blo >= n then redis.call('HDEL', k_p, f) end
    end
  end
end

local function check()
  if ahead then
    advance()
    mark(op == 'reserve')
    return 0
  end
  if behind >= n then return 3 end
  if redis.call('GETBIT', k_b, slot(mlo)) == 1 then return 1 end
  local lapse = redis.call('HGET', k_p, mhex)
  if lapse then
    if tonumber(lapse) >= clock then return 2 end
    redis.call('HDEL', k_p, mhex)
  end
  mark(op == 'reserve')
  return 0
end

if op == 'mark' or op == 'reserve' then
  redis.call('HSET', k_w, 'ls', str(clock))
  redis.call('ZADD', k_index, str(clock), member)
  local verdict = check()
  touch()  -- after the writes: a key that check() created gets its TTL too
  return {verdict, 0}
end

redis.call('HDEL', k_p, mhex)
if op == 'commit' then
  if ahead then
    advance()
    behind = 0
  end
  if behind < n then redis.call('SETBIT', k_b, slot(mlo), 1) end
  touch()
end
return {6, 0}
"""


def _ring_size(window_size: int) -> int:
    """The bitmap ring: the next power of two >= window_size (it divides 2**32, so slot = id mod R)."""
    return 1 << max(3, (window_size - 1).bit_length())


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisReplayStore(StoreSettings):
    """A :class:`~iac.ReplayStore` in Redis, shared by every node or gateway that uses the same prefix.

    Each call is one Lua script run with ``EVALSHA`` (atomic in Redis). Keys,
    for ``key_prefix`` ``P``, session ``S = <sender>:<session_id as 16 hex>``:

    * ``P:epoch`` — string, no TTL: when this prefix's history began (receiver
      clock, us). If it disappears (Redis restarted without persistence, or
      evicted it), the next call re-creates it, refuses its message with
      :class:`~iac.StaleMessage` and :attr:`history_start_us` moves to then.
    * ``P:clock`` — string: the high-water mark of ``now_us`` (TTL ``2 * max_skew``).
    * ``P:sessions`` — sorted set of ``S`` scored by newest arrival: the live
      session count for ``max_sessions`` and expiry (TTL ``2 * max_skew``).
    * ``P:w:S`` — hash: ``hh``/``hl`` the highest id's 32-bit halves, ``ls``
      the newest arrival, ``r`` the ring size.
    * ``P:b:S`` — string bitmap, a ring of ``R`` bits (``R`` = the next power of
      two >= ``window_size``): id ``x`` is bit ``x mod R``.
    * ``P:p:S`` — hash: reserved id (16 hex) -> when the reservation lapses.

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
    recommended; a Redis out of memory refuses new ids with :class:`~iac.ReplayStoreFull`.

    Args:
        redis: a ``redis://`` URL or a ``redis.Redis`` client (synchronous). A
            client made from a URL is closed by :meth:`close`.
        config: window size, skew and session cap.
        key_prefix: prefix of every key (nodes that share it share replay state).
        started_at_us: the start of history if this prefix is new in Redis
            (default: Redis' own ``TIME``).
        reservation_ttl_us: how long a reservation lasts without commit or release.
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
        reservation_ttl_us: int | None = None,
        timeout_s: float = 2.0,
    ) -> None:
        try:
            import redis as redis_mod
        except ImportError:  # pragma: no cover - depends on the environment
            raise ConfigError("RedisReplayStore needs the redis client: pip install 'iac[redis]'") from None
        self._errors = redis_mod.exceptions
        self._config = config if config is not None else ReplayConfig()
        self._reservation_ttl_us = check_store_config(self._config, reservation_ttl_us)
        if not key_prefix:
            raise ConfigError("key_prefix must not be empty")
        self._prefix = key_prefix
        self._ring = _ring_size(self._config.window_size)
        self._ttl_ms = str(math.ceil(self._config.retention_us / 1000))
        self._owns_client = isinstance(redis, str)
        if isinstance(redis, str):
            self._client: redis_lib.Redis = redis_mod.Redis.from_url(
                redis, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        else:
            self._client = redis
        self._script = self._client.register_script(_LUA)
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

    def check_and_mark(self, sender: str, session_id: int, msg_id: int, now_us: int) -> Verdict:
        return self._verdict(self._run("mark", sender, session_id, msg_id, now_us))

    def reserve(self, sender: str, session_id: int, msg_id: int, now_us: int) -> Verdict:
        return self._verdict(self._run("reserve", sender, session_id, msg_id, now_us))

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

    def close(self) -> None:
        """Close the client if this store made it from a URL."""
        if self._owns_client:
            self._client.close()

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
                raise ReplayStoreFull(f"Redis is out of memory: {exc}") from None
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

    def _run(self, op: str, sender: str, session_id: int, msg_id: int, now_us: int) -> tuple[int, int]:
        check_args(sender, session_id, msg_id)
        sid = f"{sender}:{session_id:016x}"
        keys = [
            self._k_epoch,
            self._k_clock,
            self._k_index,
            f"{self._prefix}:w:{sid}",
            f"{self._prefix}:b:{sid}",
            f"{self._prefix}:p:{sid}",
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
            str(self._reservation_ttl_us),
        ]
        code, value = self._call(self._script, keys, args)
        code = int(code)
        value = int(value)
        if code == _LOST:
            self._history_start_us = value
            if op in ("mark", "reserve"):
                raise StaleMessage(
                    "the Redis replay store lost its history (restart without persistence, or eviction); "
                    f"it starts again at {value} and cannot vouch for this message"
                )
        if code == _FULL:
            raise ReplayStoreFull(
                f"replay store tracks {self._config.max_sessions} sessions (max_sessions); "
                "new session refused until one expires"
            )
        return code, value

    @staticmethod
    def _verdict(result: tuple[int, int]) -> Verdict:
        return _VERDICTS[result[0]]
