"""The Lua scripts of the Redis lanes: every operation is one script, run atomically.

The layout of the keys and the reasoning behind each step are in the package docstring
(:mod:`lanequeue.redis`); the comments here sit at the line they justify.

Conventions shared by all scripts:

- ``KEYS[1]`` always ends in ``"h"`` and starts with the lane's (or key's) base
  ``{tag}:``; other keys of the same base (a withdrawn waiter's tombstone ``{tag}:x:<id>``; in
  the per-key lane every other key) are derived from it. They share the hash tag, hence
  the slot, so a script never touches another slot (Redis Cluster).
- Time is ``TIME`` on the server, read once per script: ``now`` in ms (leases,
  liveness), ``now_us`` in µs (fencing tokens).
- Integers leave Lua through ``string.format('%.0f', x)`` (Lua 5.1 would print
  ``1.7e+15`` for a µs timestamp with ``tostring``), except on the fast paths, where the
  µs timestamp is built from ``TIME``'s digits: formatting a float is the dearest Lua
  step of a short script.
- Replies are integers (or arrays of integers), never floats, so ``decode_responses``
  does not matter. Acquire answers the fencing token (an integer > 0) when granted,
  else ``{0, wake}``: ``wake`` is the ms until the lease blocking the caller runs out
  when the caller heads the line, -1 otherwise. Withdraw answers the token or
  ``{0, 0}``. (A bare integer costs the script less than a table.)
- On the wire each script is wrapped (:func:`._wire.wrap`): it takes a nonce as its last
  argument and answers ``{nonce, reply}``, so a reply is only ever taken by the request
  it answers (see :mod:`._wire`). The replies above are what the wrapper carries.
- Needs Redis >= 6.2 (or Valkey): ``SET ... GET``.
"""

from __future__ import annotations

__all__ = [
    "VERSION_CLAIM",
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

_CLOCK = r"""
local function fmt(x) return string.format('%.0f', x) end

-- Server time: now in ms and now_us in µs (numbers), and now_us as a decimal string,
-- built from TIME's digits (string.format of a float is the dearest step of a short
-- script, and tostring would print 1.7e+15).
local function clock()
  local t = redis.call('TIME')
  local us = t[2]
  if #us < 6 then us = string.rep('0', 6 - #us) .. us end
  local s = t[1] .. us
  return tonumber(string.sub(s, 1, -4)), tonumber(s), s
end

-- The next fencing token: larger than the last one while the counter lives, and the
-- server's clock in µs otherwise. A script runs for more than 1 µs, so the counter never
-- runs ahead of the clock by more than a few units; once it has expired (fttl ms after
-- the last grant), the clock has long passed it. Tokens therefore grow across idle gaps
-- and server restarts, as long as the server clock does not step back by more than fttl.
-- One call in the usual case: SET ... GET (Redis >= 6.2) stores the clock and returns the
-- last token; only when that one is not below the clock (grants within the same µs, or
-- a clock that stepped back) does a second SET store last + 1.
-- Returns the token as a number and as a string (`s_us`: now_us as a string, see clock).
local function fence(fk, now_us, s_us, fttl)
  local last = tonumber(redis.call('SET', fk, s_us, 'PX', fttl, 'GET') or '0')
  if last < now_us then return now_us, s_us end
  local f = last + 1
  local fs = fmt(f)
  redis.call('SET', fk, fs, 'PX', fttl)
  return f, fs
end
"""

_WAKE = r"""
-- Wake a waiter: one message on its process's wake-up channel (the first 10 characters
-- of an owner id name the process). Every process subscribes to its own channel on ONE
-- connection and hands the message to the waiting thread or task, so waiters hold no
-- connection while they wait. A message lost (no subscriber at that instant) costs the
-- waiter one poll of latency, never a hang: it re-checks at least every poll.
-- With `tok` (a fencing token as a string), the message also carries a grant of a full
-- lease ("id:tok"): the woken waiter holds at once, with no confirm round trip.
local function wake(id, tok)
  local msg = id
  if tok then msg = id .. ':' .. tok end
  redis.call('PUBLISH', 'lq:wake:' .. string.sub(id, 1, 10), msg)
end

-- The presence channel and lease (ms) a waiter sent with its last poll (hash `n`:
-- "channel|lease"), if its process's presence connection is there now: the hand-off may
-- then grant it a full lease (ITS lease: lease_s may differ per process), since presence
-- bounds a waiter that died (see _presence.py). Removes the entry.
local function live_channel(n, id)
  local v = redis.call('HGET', n, id)
  if not v then return false end
  redis.call('HDEL', n, id)
  local c, ms = string.match(v, '^(.*)|(%d+)$')
  if c and redis.call('PUBSUB', 'NUMSUB', c)[2] > 0 then return c, tonumber(ms) end
  return false
end
"""

_KEEP = r"""
-- Make the TTL of `key` at least `ms` (never shorten it: other members may need longer).
local function keep(key, ms)
  if redis.call('PTTL', key) < ms then redis.call('PEXPIRE', key, fmt(ms)) end
end
"""

_PRELUDE = _CLOCK + _KEEP

# --------------------------------------------------------------------------------------
# Per-key lane. KEYS: h only, the holder: the string "owner:fence", plus ":w" once someone
# joined the line while it held. The other keys of the key's base are derived from it in
# the script (same hash tag, same slot): q (waiter ids, FIFO), w (zset waiter id ->
# liveness deadline ms), f (fence counter), x:<id> (a withdrawn owner). ARGV: owner,
# lease_ms (also the fence counter's TTL), then per script (see each). One key and few
# arguments keep the fast paths cheap.
# Invariants: an id is in q iff it is in w (both change together, in one script); while
# the holder key lives without the ":w" mark, q is empty (an id enters q only in a script
# that marks the holder it waits behind, and a holder set by the hand-off is marked from
# the start), so a release that finds no mark needs no look at the line.
# --------------------------------------------------------------------------------------

_HOLDER = r"""
-- The one reader of the holder key: owner id, fencing token, and whether the line may be
-- non-empty (":w" mark); false when nobody holds the key (released, or its lease ran
-- out: a key with an expired TTL reads as absent).
local function holder(h)
  local v = redis.call('GET', h)
  if not v then return false end
  local o, f = string.match(v, '^([^:]*):(%d+)')
  return o, tonumber(f), string.sub(v, -2) == ':w'
end
"""

# Each per-key script first names its keys, then runs its fast path, and only then
# defines the helpers of the other paths (a Lua function definition is a statement that
# costs time at every run): _SESSION_KEYS + [the helpers the fast path uses] + fast path
# + _SESSION_REST + the other paths.
_SESSION_KEYS = r"""
local h = KEYS[1]
local base = string.sub(h, 1, -2)
"""

_SESSION_REST = (
    _KEEP
    + _WAKE
    + r"""
local q, w, fk, n, j = base .. 'q', base .. 'w', base .. 'f', base .. 'n', base .. 'j'

-- Record the holder's presence channel (see _presence.py): "owner|channel|absent since
-- (ms, 0: present)". A record naming another owner is stale and ignored.
local function present(id, c, ttl)
  if c and c ~= '' then redis.call('SET', base .. 'p', id .. '|' .. c .. '|0', 'PX', ttl) end
end

-- Called only when nobody holds the key. Hands it to the first LIVE waiter in line:
-- dead waiters (liveness deadline passed: crashed, or paused too long) are dropped on
-- the way, each once. The grant is a CLAIM that lasts until the waiter's own liveness
-- deadline; the waiter turns it into a full lease when it confirms (its next acquire
-- call, right after the signal wakes it). A waiter that died after its last refresh thus
-- blocks the key only until that deadline, not for a whole lease. The new holder is
-- marked ":w" (others may still be in line). Returns the new holder's id and token, or
-- false (the line is empty now). The clock is read only once someone is in line.
local function promote(fttl, now, now_us, s_us)
  while true do
    local id = redis.call('LPOP', q)
    if not id then return false end
    if not now then now, now_us, s_us = clock() end
    local dl = tonumber(redis.call('ZSCORE', w, id))
    redis.call('ZREM', w, id)
    redis.call('HDEL', j, id)
    local c, ms = live_channel(n, id)
    if dl and dl > now then
      local f, fs = fence(fk, now_us, s_us, fttl)
      if c then
        -- The waiter's process is present: a full lease (its own), its presence
        -- recorded, the grant carried in the wake-up (2 round trips per hand-off: the
        -- release, then the woken waiter works at once). A waiter that died since its
        -- last poll is ended by presence (its process) or its lease (its host).
        redis.call('SET', h, id .. ':' .. fs .. ':w', 'PX', ms)
        present(id, c, ms)
        wake(id, fs)
      else
        local ttl = fmt(dl - now)
        redis.call('SET', h, id .. ':' .. fs .. ':w', 'PX', ttl)
        wake(id)
      end
      return id, f
    end
  end
end
"""
)

SESSION_ACQUIRE = (
    _SESSION_KEYS
    + _CLOCK
    + r"""
-- ARGV: owner, lease_ms, live_ms (0: try only, never join the line), presence channel
-- of the caller's process ('' for none), grace_ms.
local me, lease, chan = ARGV[1], ARGV[2], ARGV[4]
local now, now_us, s_us
-- Fast path: no holder and no line at all (not even dead waiters), and this acquisition
-- was not withdrawn: ours at once.
if redis.call('EXISTS', h, base .. 'q', base .. 'x:' .. me) == 0 then
  now, now_us, s_us = clock()
  local f, fs = fence(base .. 'f', now_us, s_us, lease)
  redis.call('SET', h, me .. ':' .. fs, 'PX', lease)
  if chan ~= '' then redis.call('SET', base .. 'p', me .. '|' .. chan .. '|0', 'PX', lease) end
  return f
end
"""
    + _HOLDER
    + _SESSION_REST
    + r"""
local live = tonumber(ARGV[3])
-- Withdrawn already (a cancelled caller's clean-up ran before this call, which was sent
-- first but reached the server later): never grant it, nobody would own the grant.
if redis.call('EXISTS', base .. 'x:' .. me) == 1 then return {0, 0} end
local o, f, marked = holder(h)
-- No holder, but a line: its head goes first, so a newcomer never overtakes a live waiter.
if not o then
  now, now_us, s_us = clock()
  o, f = promote(lease, now, now_us, s_us)
  marked = true
end
if o == me then
  -- Granted to us by hand-off (or this is a retry whose first reply was lost): confirm,
  -- i.e. turn the claim into a full lease. Idempotent per owner id.
  redis.call('PEXPIRE', h, lease)
  present(me, chan, lease)
  return f
end
-- The holder o's process is gone when its presence channel (see _presence.py) has stayed
-- empty for the grace period ARGV[5] (server clock; the first caller to find it empty
-- starts that count): true, the caller may end the hold; else false and the ms until it
-- may (-1: present, or no presence record of o). A process that is only slow keeps its
-- connection, so its channel never empties; its process marked the hold lost before the
-- grace ran out.
local function gone(o, now)
  local pv = redis.call('GET', base .. 'p')
  if not pv then return false, -1 end
  local po, pc, since = string.match(pv, '^([^|]*)|(.*)|(%d+)$')
  if po ~= o then return false, -1 end
  since = tonumber(since)
  if redis.call('PUBSUB', 'NUMSUB', pc)[2] > 0 then
    if since > 0 then redis.call('SET', base .. 'p', po .. '|' .. pc .. '|0', 'KEEPTTL') end
    return false, -1
  end
  if since == 0 then
    since = now
    redis.call('SET', base .. 'p', po .. '|' .. pc .. '|' .. fmt(now), 'KEEPTTL')
  end
  local left = since + tonumber(ARGV[5]) - now
  if left <= 0 then return true, 0 end
  return false, left
end
-- A try takes over a holder whose process is gone, but only with nobody in line (the
-- head of the line does it otherwise, and goes first).
if o and live == 0 and redis.call('EXISTS', q) == 0 then
  if not now then now = clock() end
  if gone(o, now) then
    redis.call('DEL', h)
    now, now_us, s_us = clock()
    o = false
  end
end
if not o then
  -- Free and nobody alive in line (promote emptied it, or a try just ended the hold of
  -- a process that is gone): ours, without queueing.
  local fs
  f, fs = fence(fk, now_us, s_us, lease)
  redis.call('SET', h, me .. ':' .. fs, 'PX', lease)
  present(me, chan, lease)
  return f
end
if live == 0 then return {0, -1} end
-- Held by someone else: join the line at the tail (first call), or stay in place and
-- refresh our liveness (later calls). A waiter dropped as dead rejoins at the tail. The
-- holder is marked first, so its release looks at the line (APPEND keeps its TTL).
if not now then now = clock() end
if not marked then redis.call('APPEND', h, ':w') end
if not redis.call('ZSCORE', w, me) then
  -- Joining: the server time of the join (hash j), for the views' oldest wait.
  redis.call('RPUSH', q, me)
  redis.call('HSET', j, me, fmt(now))
end
redis.call('ZADD', w, fmt(now + live), me)
keep(q, live)
keep(w, live)
keep(j, live)
if chan ~= '' then
  redis.call('HSET', n, me, chan .. '|' .. lease)
  keep(n, live)
end
-- Waiters at the head whose liveness ran out (they died in line, or stopped polling)
-- leave it, as a release's promote drops them: else a dead head would keep the first
-- live waiter from taking over a holder whose process is gone, until the holder's whole
-- lease ran out. (One that polls again later rejoins at the tail.)
while true do
  local id = redis.call('LINDEX', q, 0)
  if not id or id == me then break end
  local dl = tonumber(redis.call('ZSCORE', w, id))
  if dl and dl > now then break end
  redis.call('LPOP', q)
  redis.call('ZREM', w, id)
  redis.call('HDEL', j, id)
  redis.call('HDEL', n, id)
end
-- The head of the line learns when the holder's lease (or claim) runs out, and polls
-- right then: a holder that died is replaced one round trip after its lease ends.
if redis.call('LINDEX', q, 0) ~= me then return {0, -1} end
local wake = redis.call('PTTL', h)
-- Failover: a holder whose process is gone is taken over now, not at the end of its lease.
local dead, soon = gone(o, now)
if dead then
  redis.call('DEL', h)
  now, now_us, s_us = clock()
  o, f = promote(lease, now, now_us, s_us)
  if o == me then
    redis.call('PEXPIRE', h, lease)
    present(me, chan, lease)
    return f
  end
  return {0, -1}
end
if soon >= 0 and soon < wake then wake = soon end
return {0, wake}
"""
)

SESSION_RELEASE = (
    r"""
-- ARGV: "owner:token" (the holder value of the caller's grant), lease_ms (the fence
-- counter's TTL, should the release hand the key on).
local h = KEYS[1]
-- Fast path: the holder key is exactly our grant, unmarked: ours, and nobody in line.
if redis.call('GET', h) == ARGV[1] then
  redis.call('DEL', h)
  return 1
end
local base = string.sub(h, 1, -2)
"""
    + _HOLDER
    + r"""
local me = string.match(ARGV[1], '^[^:]*')
local o, _, marked = holder(h)
-- The owner id is unique to one acquisition: a stale holder (lease ran out, key passed
-- on) or a foreign client never matches, so it can never end someone else's hold.
if o and o ~= me then return 0 end
if o then
  redis.call('DEL', h)
  -- Unmarked: nobody joined the line while we held, so it is empty (see the invariants).
  if not marked then return 1 end
end
"""
    + _CLOCK
    + _SESSION_REST
    + r"""
-- Hand-off in the same script: no instant in which a newcomer could take the key ahead
-- of the line. (Also moves a key whose holder lapsed, when a stale release comes by.)
promote(ARGV[2])
if o then return 1 end
return 0
"""
)

SESSION_RENEW = (
    _HOLDER
    + r"""
-- KEYS: h. ARGV: owner, lease_ms, [presence channel]. Extends the lease only while it is
-- still ours: an expired holder key reads as absent, so a lease that ran out is never
-- revived. With a channel, the hold's presence record is replaced ('': removed, the
-- hold then lives by its lease only): a grant whose presence connection died before
-- the grant was answered moves to the new one.
if holder(KEYS[1]) == ARGV[1] then
  local p = string.sub(KEYS[1], 1, -2) .. 'p'
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[3] == nil then
    redis.call('PEXPIRE', p, ARGV[2])
  elseif ARGV[3] == '' then
    redis.call('DEL', p)
  else
    redis.call('SET', p, ARGV[1] .. '|' .. ARGV[3] .. '|0', 'PX', ARGV[2])
  end
  return 1
end
return 0
"""
)

SESSION_WITHDRAW = (
    _SESSION_KEYS
    + _CLOCK
    + _HOLDER
    + _SESSION_REST
    + r"""
-- ARGV: owner, lease_ms. A waiter leaves the line (timeout, cancellation, interrupt). If
-- a hand-off reached it first, it holds the key: the lease is confirmed and the token
-- returned; the caller keeps or releases it.
local me, lease = ARGV[1], ARGV[2]
-- Under OOM a script's first write may not grow memory (see the counting lane's
-- `writable`): a write that cannot (PERSIST of a key that never exists) comes first, so a
-- waiter can always leave the line.
redis.call('PERSIST', base .. 'o')
-- A tombstone: an acquire of this owner id that reaches the server after this withdraw
-- (sent before it on another connection) is refused. It lives one lease.
redis.call('SET', base .. 'x:' .. me, '1', 'PX', lease)
redis.call('LREM', q, 1, me)
redis.call('ZREM', w, me)
redis.call('HDEL', n, me)
redis.call('HDEL', j, me)
local o, f = holder(h)
if o == me then
  redis.call('PEXPIRE', h, lease)
  return f
end
if not o then promote(lease) end
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
# deadline ms), f (fence counter).
# ARGV: owner, lease_ms, live_ms, mode, fence_ttl_ms, max_concurrent, key.
# Hold ids are hex, so the first ':' of a line entry separates id and key.
# --------------------------------------------------------------------------------------

_COUNTING_PRELUDE = (
    _PRELUDE
    + _WAKE
    + r"""
-- Holds whose lease deadline has passed are gone: their permits return to the lane.
local function purge(h, i, now)
  local gone = redis.call('ZRANGEBYSCORE', h, '-inf', fmt(now))
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', h, '-inf', fmt(now))
    local p = string.sub(h, 1, -2) .. 'p'
    for _, id in ipairs(gone) do
      redis.call('HDEL', i, id)
      redis.call('HDEL', p, id)
    end
  end
end

-- Record a hold's presence channel (see _presence.py) in hash p: id -> "channel|absent
-- since (ms, 0: present)".
local function present(h, id, c, ttl)
  if c and c ~= '' then
    local p = string.sub(h, 1, -2) .. 'p'
    redis.call('HSET', p, id, c .. '|0')
    keep(p, ttl)
  end
end

-- Failover: holds whose process is gone (presence channel empty for `grace` ms, server
-- clock) end now. Returns whether any ended, and the ms until the next one may.
local function takeover(h, i, now, grace)
  local p = string.sub(h, 1, -2) .. 'p'
  local e = redis.call('HGETALL', p)
  local freed, wake = false, -1
  for k = 1, #e, 2 do
    local id, v = e[k], e[k + 1]
    local c, since = string.match(v, '^(.*)|(%d+)$')
    since = tonumber(since)
    if not redis.call('ZSCORE', h, id) then
      redis.call('HDEL', p, id)
    elseif redis.call('PUBSUB', 'NUMSUB', c)[2] > 0 then
      if since > 0 then redis.call('HSET', p, id, c .. '|0') end
    else
      if since == 0 then
        since = now
        redis.call('HSET', p, id, c .. '|' .. fmt(now))
      end
      if now - since >= grace then
        redis.call('ZREM', h, id)
        redis.call('HDEL', i, id)
        redis.call('HDEL', p, id)
        freed = true
      elseif wake < 0 or since + grace - now < wake then
        wake = since + grace - now
      end
    end
  end
  return freed, wake
end

local function grant(h, i, fk, id, key, dl, now, now_us, s_us, fttl)
  local f, fs = fence(fk, now_us, s_us, fttl)
  redis.call('ZADD', h, fmt(dl), id)
  redis.call('HSET', i, id, fs .. ':' .. string.sub(s_us, 1, -4) .. ':' .. key)
  keep(h, dl - now)
  keep(i, dl - now)
  return f
end

-- While a permit is free, hand it to the first LIVE waiter in line (dead ones are
-- dropped on the way). Each grant is a claim until the waiter's liveness deadline,
-- confirmed into a full lease by the waiter's next call (see the per-key promote).
local function promote(h, i, q, w, fk, cap, now, now_us, s_us, fttl)
  while redis.call('ZCARD', h) < cap do
    local item = redis.call('LPOP', q)
    if not item then return end
    local c = string.find(item, ':', 1, true)
    local id, key = string.sub(item, 1, c - 1), string.sub(item, c + 1)
    local dl = tonumber(redis.call('ZSCORE', w, id))
    redis.call('ZREM', w, id)
    redis.call('HDEL', string.sub(h, 1, -2) .. 'j', id)
    local c, ms = live_channel(string.sub(h, 1, -2) .. 'n', id)
    if dl and dl > now then
      if c then
        -- Present: a full lease (its own), carried in the wake-up (see the per-key
        -- promote).
        present(h, id, c, ms)
        wake(id, fmt(grant(h, i, fk, id, key, now + ms, now, now_us, s_us, fttl)))
      else
        grant(h, i, fk, id, key, dl, now, now_us, s_us, fttl)
        wake(id)
      end
    end
  end
end

-- Clients of one lane may disagree on max_concurrent (a rolling deploy that changes it):
-- the lane keeps the smallest cap any client used within the last lease (key "m"), so
-- no client admits more than the strictest one. Only a client whose cap is that smallest
-- one refreshes it, so a raised cap takes effect one lease after the last client with the
-- old cap went quiet.
-- Under OOM (noeviction, memory over maxmemory), Redis refuses a script's commands that
-- may grow memory (SET, ZADD, HSET) until the script has written something: release
-- and renew must still work then (they free or keep what is there), so they first make
-- a write that cannot grow memory (PERSIST of a key that never exists: 'o').
local function writable(h)
  redis.call('PERSIST', string.sub(h, 1, -2) .. 'o')
end

local function lane_cap(h, cap, ttl)
  local m = string.sub(h, 1, -2) .. 'm'
  local seen = tonumber(redis.call('GET', m))
  if seen and seen < cap then return seen end
  redis.call('SET', m, cap, 'PX', ttl)
  return cap
end

local function fence_of(i, id)
  return tonumber(string.match(redis.call('HGET', i, id), '^(%d+)'))
end
"""
)

COUNTING_ACQUIRE = (
    _COUNTING_PRELUDE
    + r"""
local h, i, q, w, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, live, mode = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local fttl, cap, key = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
-- ARGV[8]: the caller's presence channel ('' for none); ARGV[9]: grace_ms.
local chan = ARGV[8]
-- Withdrawn already (see the per-key acquire): never granted.
if redis.call('EXISTS', string.sub(h, 1, -2) .. 'x:' .. me) == 1 then return {0, 0} end
cap = lane_cap(h, cap, fttl)
local now, now_us, s_us = clock()
purge(h, i, now)
promote(h, i, q, w, fk, cap, now, now_us, s_us, fttl)
if redis.call('ZSCORE', h, me) then
  -- Granted to us by hand-off (or a retried call): confirm the full lease.
  redis.call('ZADD', h, fmt(now + lease), me)
  keep(h, lease)
  keep(i, lease)
  present(h, me, chan, lease)
  return fence_of(i, me)
end
-- promote stops only when the line is empty or the lane is full, so a free permit here
-- means nobody alive waits: taking it overtakes no one.
if redis.call('ZCARD', h) < cap then
  present(h, me, chan, lease)
  return grant(h, i, fk, me, key, now + lease, now, now_us, s_us, fttl)
end
if mode == '0' then
  -- A try ends the holds of dead processes (see takeover) when nobody is in line (the
  -- head of the line does it otherwise, and goes first), then takes a freed permit.
  if redis.call('LLEN', q) == 0 and takeover(h, i, now, tonumber(ARGV[9])) then
    if redis.call('ZCARD', h) < cap then
      present(h, me, chan, lease)
      return grant(h, i, fk, me, key, now + lease, now, now_us, s_us, fttl)
    end
  end
  return {0, -1}
end
local j = string.sub(h, 1, -2) .. 'j'
if not redis.call('ZSCORE', w, me) then
  -- Joining: the server time of the join (hash j), for the views' oldest wait.
  redis.call('RPUSH', q, me .. ':' .. key)
  redis.call('HSET', j, me, fmt(now))
end
redis.call('ZADD', w, fmt(now + live), me)
keep(q, live)
keep(w, live)
keep(j, live)
if chan ~= '' then
  local n = string.sub(h, 1, -2) .. 'n'
  redis.call('HSET', n, me, chan .. '|' .. fmt(lease))
  keep(n, live)
end
-- Dead waiters at the head leave it (see the per-key acquire); then the head of the line
-- learns when the first lease runs out.
local head
while true do
  head = redis.call('LINDEX', q, 0)
  if not head or string.sub(head, 1, #me + 1) == me .. ':' then break end
  local id = string.sub(head, 1, string.find(head, ':', 1, true) - 1)
  local dl = tonumber(redis.call('ZSCORE', w, id))
  if dl and dl > now then break end
  redis.call('LPOP', q)
  redis.call('ZREM', w, id)
  redis.call('HDEL', j, id)
  redis.call('HDEL', string.sub(h, 1, -2) .. 'n', id)
end
if head and string.sub(head, 1, #me + 1) == me .. ':' then
  -- Failover: the head ends the holds of dead processes (see takeover), then takes a
  -- freed permit through the line.
  local freed, soon = takeover(h, i, now, tonumber(ARGV[9]))
  if freed then
    promote(h, i, q, w, fk, cap, now, now_us, s_us, fttl)
    if redis.call('ZSCORE', h, me) then
      redis.call('ZADD', h, fmt(now + lease), me)
      keep(h, lease)
      keep(i, lease)
      present(h, me, chan, lease)
      return fence_of(i, me)
    end
  end
  local first = redis.call('ZRANGE', h, 0, 0, 'WITHSCORES')
  local wake = first[2] and tonumber(first[2]) - now or -1
  if soon >= 0 and (wake < 0 or soon < wake) then wake = soon end
  return {0, wake}
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
writable(h)
cap = lane_cap(h, cap, fttl)
local now, now_us, s_us = clock()
purge(h, i, now)
local ok = 0
-- Only the hold's own id ends it: an expired hold was purged just above, so a late
-- release finds nothing and cannot return a permit that is no longer its own.
if redis.call('ZREM', h, me) == 1 then
  redis.call('HDEL', i, me)
  redis.call('HDEL', string.sub(h, 1, -2) .. 'p', me)
  ok = 1
end
promote(h, i, q, w, fk, cap, now, now_us, s_us, fttl)
return ok
"""
)

COUNTING_RENEW = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i q w f. ARGV: owner, lease_ms, fence_ttl_ms, max_concurrent, [presence
-- channel: replaces the hold's presence record, '' removes it; see the per-key renew].
local h, i, q, w, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, fttl, cap = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
writable(h)
cap = lane_cap(h, cap, fttl)
local now, now_us, s_us = clock()
purge(h, i, now)
local ok = 0
if redis.call('ZSCORE', h, me) then
  redis.call('ZADD', h, fmt(now + lease), me)
  keep(h, lease)
  keep(i, lease)
  local p = string.sub(h, 1, -2) .. 'p'
  if ARGV[5] == '' then
    redis.call('HDEL', p, me)
  elseif ARGV[5] then
    present(h, me, ARGV[5], lease)
  end
  keep(p, lease)
  ok = 1
end
-- Permits freed by the purge go to the line now, not at the waiters' next poll.
promote(h, i, q, w, fk, cap, now, now_us, s_us, fttl)
return ok
"""
)

COUNTING_WITHDRAW = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i q w f s. ARGV: owner, lease_ms, fence_ttl_ms, max_concurrent, key.
local h, i, q, w, fk = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local me, lease, fttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cap, key = tonumber(ARGV[4]), ARGV[5]
-- A tombstone against a late acquire of this owner id (see the per-key withdraw), after
-- a write that cannot grow memory (OOM: see `writable`).
writable(h)
redis.call('SET', string.sub(h, 1, -2) .. 'x:' .. me, '1', 'PX', lease)
cap = lane_cap(h, cap, fttl)
local now, now_us, s_us = clock()
redis.call('LREM', q, 1, me .. ':' .. key)
redis.call('ZREM', w, me)
redis.call('HDEL', string.sub(h, 1, -2) .. 'n', me)
redis.call('HDEL', string.sub(h, 1, -2) .. 'j', me)
purge(h, i, now)
if redis.call('ZSCORE', h, me) then
  redis.call('ZADD', h, fmt(now + lease), me)
  keep(h, lease)
  keep(i, lease)
  return fence_of(i, me)
end
promote(h, i, q, w, fk, cap, now, now_us, s_us, fttl)
return {0, 0}
"""
)

COUNTING_INFO = (
    _COUNTING_PRELUDE
    + r"""
-- KEYS: h i w. Returns {now_ms, holds, live waiters, join time (ms) of the longest live
-- waiter (0: none), the smallest cap used within the last lease (key "m"; 0: none),
-- info strings of the live holds...}. The line is in join order, so the first live
-- waiter in it with a join time is the longest waiter.
local h, i, w = KEYS[1], KEYS[2], KEYS[3]
local q, j = string.sub(h, 1, -2) .. 'q', string.sub(h, 1, -2) .. 'j'
local now = clock()
purge(h, i, now)
local joined = 0
local k = 0
while true do
  local item = redis.call('LINDEX', q, k)
  if not item then break end
  local id = string.sub(item, 1, string.find(item, ':', 1, true) - 1)
  local dl = tonumber(redis.call('ZSCORE', w, id))
  local t = dl and dl > now and tonumber(redis.call('HGET', j, id))
  if t then
    joined = t
    break
  end
  k = k + 1
end
local out = {now, redis.call('ZCARD', h), redis.call('ZCOUNT', w, '(' .. fmt(now), '+inf'),
             joined, tonumber(redis.call('GET', string.sub(h, 1, -2) .. 'm')) or 0}
for _, v in ipairs(redis.call('HVALS', i)) do out[#out + 1] = v end
return out
"""
)

VERSION_CLAIM = r"""
-- KEYS: the lane's version marker. ARGV: our protocol version, ttl_ms. Claims (or keeps)
-- the lane for our version and returns it; returns the other version when the lane is
-- in use by clients of another one (their marker has not run out).
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return ARGV[1]
"""
