"""The Lua scripts of :class:`~iac.stores.redis.RedisReplayStore`: each call is one script, one
atomic step in Redis. The keys and their layout are described there and in docs/PROTOCOL.md."""

from __future__ import annotations

# One script for every operation, so each call is one atomic step in Redis.
# Lua numbers are doubles: 64-bit ids travel as two 32-bit halves (hi, lo) and
# serial arithmetic is done on the halves; every number given to redis.call is
# formatted with %.0f (Lua would otherwise print 1.7e+15).
CHECK = r"""
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
-- the tenants' shares: sessions of this sender, and sessions the call's neighbour (via) brought in
local k_ts, k_tv = KEYS[7], KEYS[8]
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
local share = tonumber(ARGV[13])
local via = ARGV[14]
local via_prefix = ARGV[15]

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

local w = redis.call('HMGET', k_w, 'hh', 'hl', 'ls', 'r', 'v')
local exists = w[1] ~= false
if exists and tonumber(w[3]) < limit then
  redis.call('DEL', k_w, k_b, k_p)
  exists = false
end
if not exists then
  if op == 'commit' or op == 'release' then return {6, 0} end
  if redis.call('ZCARD', k_index) >= max_sessions then return {4, 0} end
  redis.call('ZREMRANGEBYSCORE', k_ts, '-inf', '(' .. str(limit))
  redis.call('ZREMRANGEBYSCORE', k_tv, '-inf', '(' .. str(limit))
  local held = redis.call('ZCARD', k_ts)
  if held >= share then return {7, held} end
  held = redis.call('ZCARD', k_tv)
  if held >= share then return {8, held} end
  redis.call('DEL', k_b, k_p)
  redis.call('HSET', k_w, 'hh', str(mhi), 'hl', str(mlo), 'ls', str(clock), 'r', str(r), 'v', via)
  mark(op == 'reserve')
  redis.call('ZADD', k_index, str(clock), member)
  for _, k in ipairs({k_ts, k_tv}) do
    redis.call('ZADD', k, str(clock), member)
    redis.call('PEXPIRE', k, ttl_ms)
  end
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
  -- the session stays in its tenants' counts while it lives (the neighbour that brought it in)
  local shares = {k_ts}
  if w[5] then
    if w[5] == via then shares[2] = k_tv else shares[2] = via_prefix .. w[5] end
  end
  for _, k in ipairs(shares) do
    redis.call('ZADD', k, str(clock), member)
    redis.call('PEXPIRE', k, ttl_ms)
  end
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


# Renew reservations: KEYS = epoch, clock, then the reservations hash of each session; ARGV = now,
# the lease, the clock key's TTL (ms), then per session how many ids follow and the ids (16 hex).
# Only a reservation that has not lapsed is extended: a lapsed one may be someone else's by now.
RENEW = r"""
local function str(x) return string.format('%.0f', x) end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local now = tonumber(ARGV[1])
local clock = tonumber(redis.call('GET', KEYS[2]) or '0')
if now > clock then
  clock = now
  redis.call('SET', KEYS[2], str(clock), 'PX', ARGV[3])
end
local lapse = str(clock + tonumber(ARGV[2]))
local renewed = 0
local a = 4
for k = 3, #KEYS do
  local cnt = tonumber(ARGV[a])
  a = a + 1
  for j = 1, cnt do
    local v = redis.call('HGET', KEYS[k], ARGV[a])
    if v and tonumber(v) >= clock then
      redis.call('HSET', KEYS[k], ARGV[a], lapse)
      renewed = renewed + 1
    end
    a = a + 1
  end
end
return renewed
"""

# Where a session stands: KEYS = epoch, clock, window hash, bitmap, reservations; ARGV = n. Returns
# the clock, the window's fields, how far behind the highest id its highest done id is (-1: none)
# and the reservations. The epoch or the window gone: nothing known.
FRONTIER = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local w = redis.call('HMGET', KEYS[3], 'hh', 'hl', 'ls', 'r')
if w[1] == false then return false end
local n = tonumber(ARGV[1])
local r = tonumber(w[4])
local lo = tonumber(w[2])
local back = -1
for i = 0, n - 1 do
  if redis.call('GETBIT', KEYS[4], (lo - i) % r) == 1 then back = i; break end
end
return {redis.call('GET', KEYS[2]) or '0', w[1], w[2], w[3], w[4], back, redis.call('HGETALL', KEYS[5])}
"""

__all__ = ["CHECK", "FRONTIER", "RENEW"]
