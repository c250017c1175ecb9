"""The Lua scripts of the Redis lanes: every operation is one script, run atomically.

The layout of the keys and the reasoning behind each step are in the package docstring
(:mod:`lanequeue.redis`); the comments here sit at the line they justify.

Conventions shared by all scripts:

- ``KEYS[1]`` always ends in ``"h"`` and starts with the lane's (or key's) base
  ``{tag}:``; other keys of the same base (a waiter's signal list ``{tag}:s:<id>``) are
  derived from it. They share the hash tag, hence the slot, so a script never touches
  another slot (Redis Cluster).
- Time is ``TIME`` on the server, read once per script: ``now`` in ms (leases,
  liveness), ``now_us`` in µs (fencing tokens).
- Integers leave Lua through ``string.format('%.0f', x)``: Lua 5.1 would print
  ``1.7e+15`` for a µs timestamp with ``tostring``.
- Replies are integers (or arrays of integers), never floats, so ``decode_responses``
  does not matter. Acquire answers ``{1, fencing token}`` when granted, else
  ``{0, wake}``: ``wake`` is the ms until the lease blocking the caller runs out when the
  caller heads the line, -1 otherwise. Withdraw answers ``{1, token}`` or ``{0, 0}``.
"""

from __future__ import annotations

__all__ = [
    "COUNTING_ACQUIRE",
    "COUNTING_INFO",
    "COUNTING_RELEASE",
    "COUNTING_RENEW",
    "COUNTING_WITHDRAW",
    "SESSION_ACQUIRE",
    "SESSION_INFO",
    "SESSION_RELEASE",
    "SESSION_RENEW",
    "SESSION_WITHDRAW",
]

_PRELUDE = r"""
local function fmt(x) return string.format('%.0f', x) end

local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- Make the TTL of `key` at least `ms` (never shorten it: other members may need longer).
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, fmt(ms)) end
end

-- The next fencing token: larger than the last one while the counter lives, and the
-- server's clock in µs otherwise. A script runs for more than 1 µs, so the counter never
-- runs ahead of the clock by more than a few units; once it has expired (fttl ms after
-- the last grant), the clock has long passed it. Tokens therefore grow across idle gaps
-- and server restarts, as long as the server clock does not step back by more than fttl.
local function fence(fk, now_us, fttl)
  local last = tonumber(redis.call('GET', fk) or '0')
  local f = now_us
  if last >= f then f = last + 1 end
  redis.call('SET', fk, fmt(f), 'PX', fmt(fttl))
  return f
end
"""

# --------------------------------------------------------------------------------------
# Per-key lane. KEYS: h (holder hash: o=owner, f=fence, t=since ms), q (waiter ids, FIFO),
# w (zset waiter id -> liveness deadline ms), f (fence counter), s (the caller's signal).
# ARGV: owner, lease_ms, live_ms, mode (1 wait / 0 try), fence_ttl_ms.
# Invariant: an id is in q iff it is in w (both change together, in one script).
# --------------------------------------------------------------------------------------

_SESSION_PRELUDE = (
    _PRELUDE
    + r"""
-- Called only when nobody holds the key. Hands it to the first LIVE waiter in line:
-- dead waiters (liveness deadline passed: crashed, or paused too long) are dropped on
-- the way, each once. The grant is a CLAIM that lasts until the waiter's own liveness
-- deadline; the waiter turns it into a full lease when it confirms (its next acquire
-- call, right after the signal wakes it). A waiter that died after its last refresh thus
-- blocks the key only until that deadline, not for a whole lease.
local function promote(h, q, w, fk, now, now_us, fttl)
  local base = string.sub(h, 1, -2)
  while true do
    local id = redis.call('LPOP', q)
    if not id then return false end
    local dl = tonumber(redis.call('ZSCORE', w, id))
    redis.call('ZREM', w, id)
    if dl and dl > now then
      local f = fence(fk, now_us, fttl)
      redis.call('HSET', h, 'o', id, 'f', fmt(f), 't', fmt(now))
      redis.call('PEXPIRE', h, fmt(dl - now))
      local s = base .. 's:' .. id
      redis.call('RPUSH', s, fmt(f))
      redis.call('PEXPIRE', s, fmt(dl - now))
      return id
    end
  end
end
"""
)

SESSION_ACQUIRE = (
    _SESSION_PRELUDE
    + r"""
local h, q, w, fk, sig = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, live, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local fttl = tonumber(ARGV[5])
local now, now_us = clock()
local o = redis.call('HGET', h, 'o')
-- No holder (released, or its lease ran out: a key with an expired TTL reads as absent):
-- the head of the line goes first, so a newcomer never overtakes a live waiter.
if not o then o = promote(h, q, w, fk, now, now_us, fttl) end
if o == me then
  -- Granted to us by hand-off (or this is a retry whose first reply was lost): confirm,
  -- i.e. turn the claim into a full lease. Idempotent per owner id.
  redis.call('PEXPIRE', h, fmt(lease))
  redis.call('DEL', sig)
  return {1, tonumber(redis.call('HGET', h, 'f'))}
end
if not o then
  -- Free and nobody alive in line (promote emptied it): ours, without queueing.
  local f = fence(fk, now_us, fttl)
  redis.call('HSET', h, 'o', me, 'f', fmt(f), 't', fmt(now))
  redis.call('PEXPIRE', h, fmt(lease))
  return {1, f}
end
if mode == '0' then return {0, -1} end
-- Held by someone else: join the line at the tail (first call), or stay in place and
-- refresh our liveness (later calls). A waiter dropped as dead rejoins at the tail.
if not redis.call('ZSCORE', w, me) then redis.call('RPUSH', q, me) end
redis.call('ZADD', w, fmt(now + live), me)
keep(q, live)
keep(w, live)
-- The head of the line learns when the holder's lease (or claim) runs out, and polls
-- right then: a holder that died is replaced one round trip after its lease ends.
if redis.call('LINDEX', q, 0) == me then return {0, redis.call('PTTL', h)} end
return {0, -1}
"""
)

SESSION_RELEASE = (
    _SESSION_PRELUDE
    + r"""
local h, q, w, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local me, fttl = ARGV[1], tonumber(ARGV[2])
local now, now_us = clock()
local o = redis.call('HGET', h, 'o')
local ok = 0
-- The owner id is unique to one acquisition: a stale holder (lease ran out, key passed
-- on) or a foreign client never matches, so it can never end someone else's hold.
if o == me then
  redis.call('DEL', h)
  ok, o = 1, false
end
-- Hand-off in the same script: no instant in which a newcomer could take the key ahead
-- of the line. (Also moves a key whose holder lapsed, when a stale release comes by.)
if not o then promote(h, q, w, fk, now, now_us, fttl) end
return ok
"""
)

SESSION_RENEW = r"""
-- KEYS: h. ARGV: owner, lease_ms. Extends the lease only while it is still ours: an
-- expired holder key reads as absent, so a lease that ran out is never revived.
if redis.call('HGET', KEYS[1], 'o') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

SESSION_WITHDRAW = (
    _SESSION_PRELUDE
    + r"""
-- KEYS: h q w f s. ARGV: owner, lease_ms, fence_ttl_ms. A waiter leaves the line
-- (timeout, cancellation, interrupt). If a hand-off reached it first, it holds the key:
-- the lease is confirmed and the token returned; the caller keeps or releases it.
local h, q, w, fk, sig = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, fttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, now_us = clock()
redis.call('LREM', q, 1, me)
redis.call('ZREM', w, me)
redis.call('DEL', sig)
local o = redis.call('HGET', h, 'o')
if o == me then
  redis.call('PEXPIRE', h, fmt(lease))
  return {1, tonumber(redis.call('HGET', h, 'f'))}
end
if not o then promote(h, q, w, fk, now, now_us, fttl) end
return {0, 0}
"""
)

SESSION_INFO = r"""
-- KEYS: h w. Read only: {1 if held, live waiters}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local held = redis.call('EXISTS', KEYS[1])
return {held, redis.call('ZCOUNT', KEYS[2], '(' .. string.format('%.0f', now), '+inf')}
"""

# --------------------------------------------------------------------------------------
# Counting lane. KEYS: h (zset hold id -> lease deadline ms), i (hash hold id ->
# "fence:since_ms:key"), q (list of "id:key", FIFO), w (zset waiter id -> liveness
# deadline ms), f (fence counter), s (the caller's signal).
# ARGV: owner, lease_ms, live_ms, mode, fence_ttl_ms, max_concurrent, key.
# Hold ids are hex, so the first ':' of a line entry separates id and key.
# --------------------------------------------------------------------------------------

_COUNTING_PRELUDE = (
    _PRELUDE
    + r"""
-- Holds whose lease deadline has passed are gone: their permits return to the lane.
local function purge(h, i, now)
  local gone = redis.call('ZRANGEBYSCORE', h, '-inf', fmt(now))
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', h, '-inf', fmt(now))
    for _, id in ipairs(gone) do redis.call('HDEL', i, id) end
  end
end

local function grant(h, i, fk, id, key, dl, now, now_us, fttl)
  local f = fence(fk, now_us, fttl)
  redis.call('ZADD', h, fmt(dl), id)
  redis.call('HSET', i, id, fmt(f) .. ':' .. fmt(now) .. ':' .. key)
  keep(h, dl - now)
  keep(i, dl - now)
  return f
end

-- While a permit is free, hand it to the first LIVE waiter in line (dead ones are
-- dropped on the way). Each grant is a claim until the waiter's liveness deadline,
-- confirmed into a full lease by the waiter's next call (see the per-key promote).
local function promote(h, i, q, w, fk, cap, now, now_us, fttl)
  local base = string.sub(h, 1, -2)
  while redis.call('ZCARD', h) < cap do
    local item = redis.call('LPOP', q)
    if not item then return end
    local c = string.find(item, ':', 1, true)
    local id, key = string.sub(item, 1, c - 1), string.sub(item, c + 1)
    local dl = tonumber(redis.call('ZSCORE', w, id))
    redis.call('ZREM', w, id)
    if dl and dl > now then
      local f = grant(h, i, fk, id, key, dl, now, now_us, fttl)
      local s = base .. 's:' .. id
      redis.call('RPUSH', s, fmt(f))
      redis.call('PEXPIRE', s, fmt(dl - now))
    end
  end
end

local function fence_of(i, id)
  return tonumber(string.match(redis.call('HGET', i, id), '^(%d+)'))
end
"""
)

COUNTING_ACQUIRE = (
    _COUNTING_PRELUDE
    + r"""
local h, i, q, w, fk, sig = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local me, lease, live, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local fttl, cap, key = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local now, now_us = clock()
purge(h, i, now)
promote(h, i, q, w, fk, cap, now, now_us, fttl)
if redis.call('ZSCORE', h, me) then
  -- Granted to us by hand-off (or a retried call): confirm the full lease.
  redis.call('ZADD', h, fmt(now + lease), me)
  keep(h, lease)
  keep(i, lease)
  redis.call('DEL', sig)
  return {1, fence_of(i, me)}
end
-- promote stops only when the line is empty or the lane is full, so a free permit here
-- means nobody alive waits: taking it overtakes no one.
if redis.call('ZCARD', h) < cap then
  return {1, grant(h, i, fk, me, key, now + lease, now, now_us, fttl)}
end
if mode == '0' then return {0, -1} end
if not redis.call('ZSCORE', w, me) then redis.call('RPUSH', q, me .. ':' .. key) end
redis.call('ZADD', w, fmt(now + live), me)
keep(q, live)
keep(w, live)
-- The head of the line learns when the first lease runs out (see the per-key acquire).
local head = redis.call('LINDEX', q, 0)
if head and string.sub(head, 1, #me + 1) == me .. ':' then
  local first = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
  if first[2] then return {0, tonumber(first[2]) - now} end
end
return {0, -1}
"""
)

COUNTING_RELEASE = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i q w f. ARGV: owner, fence_ttl_ms, max_concurrent.
local h, i, q, w, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, fttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now, now_us = clock()
purge(h, i, now)
local ok = 0
-- Only the hold's own id ends it: an expired hold was purged just above, so a late
-- release finds nothing and cannot return a permit that is no longer its own.
if redis.call('ZREM', h, me) == 1 then
  redis.call('HDEL', i, me)
  ok = 1
end
promote(h, i, q, w, fk, cap, now, now_us, fttl)
return ok
"""
)

COUNTING_RENEW = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i q w f. ARGV: owner, lease_ms, fence_ttl_ms, max_concurrent.
local h, i, q, w, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, fttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local now, now_us = clock()
purge(h, i, now)
local ok = 0
if redis.call('ZSCORE', h, me) then
  redis.call('ZADD', h, fmt(now + lease), me)
  keep(h, lease)
  keep(i, lease)
  ok = 1
end
-- Permits freed by the purge go to the line now, not at the waiters' next poll.
promote(h, i, q, w, fk, cap, now, now_us, fttl)
return ok
"""
)

COUNTING_WITHDRAW = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i q w f s. ARGV: owner, lease_ms, fence_ttl_ms, max_concurrent, key.
local h, i, q, w, fk, sig = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local me, lease, fttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cap, key = tonumber(ARGV[4]), ARGV[5]
local now, now_us = clock()
redis.call('LREM', q, 1, me .. ':' .. key)
redis.call('ZREM', w, me)
redis.call('DEL', sig)
purge(h, i, now)
if redis.call('ZSCORE', h, me) then
  redis.call('ZADD', h, fmt(now + lease), me)
  keep(h, lease)
  keep(i, lease)
  return {1, fence_of(i, me)}
end
promote(h, i, q, w, fk, cap, now, now_us, fttl)
return {0, 0}
"""
)

COUNTING_INFO = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i w. Returns {now_ms, holds, live waiters, info strings of the live holds...}.
local h, i, w = KEYS[1], KEYS[2], KEYS[3]
local now = clock()
purge(h, i, now)
local out = {now, redis.call('ZCARD', h), redis.call('ZCOUNT', w, '(' .. fmt(now), '+inf')}
for _, v in ipairs(redis.call('HVALS', i)) do out[#out + 1] = v end
return out
"""
)
