-- log.lua takes, peeks or refunds units of the sliding log stored in KEYS[1]
-- and KEYS[2], in one atomic step, exactly as backend.Log
-- (backend/algorithms.go) does. A peek writes nothing, so a replica can run
-- it; it answers from the caller's now like a take, so a replica that lags
-- answers as the primary did when it held the same entries.
--
-- KEYS[1]  the log: a sorted set of one member "<at>:<units>" per ms that
--          admitted units, scored by at (Unix ms); entries of one ms merge
-- KEYS[2]  its totals, a hash in the same slot: u = the units of all stored
--          entries, ended ones included, n = the members of KEYS[1] when
--          u was written
-- ARGV[1]  op: 1 take, 2 peek, 3 refund
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  the policy's window in ms (w)
-- ARGV[4]  the policy's limit (<= 10,000, which bounds the log)
-- ARGV[5]  cost (> 0, <= limit for a take; ignored by a peek)
-- ARGV[6]  expiry margin, ms
--
-- Returns {allowed (0|1), used, reset-at ms, retry-after ms}.
--
-- An entry is live at t while t < at + w (entries from a later ms, written
-- by a clock ahead, count). Only an admitted take drops the entries that
-- ended by t. Expiry is a duration, for cleanup only: until the newest
-- entry ends, plus the margin. All numbers stay far below 2^53 and are
-- written with %.0f.
--
-- Cost: no call reads the whole log. The totals describe every stored
-- entry, so they hold for any caller's t, a clock behind included; a call
-- subtracts the stored entries that ended by its t, which an admitted take
-- then drops: in steady use none or a few. Should many have ended with no
-- take admitted since (a log left to peeks), the smaller of the ended and
-- the live part is read, by rank, after a ZCOUNT. The newest entry (the
-- reset, a merge) is one ZRANGE; a denied call walks from whichever end of
-- the live entries reaches its answer with fewer units, in chunks by rank.
-- Redis finds a rank or a score in O(log n). Totals that are absent or do
-- not match the log (a log written before they existed, one key expired
-- before the other) are rebuilt from the whole log once, by the next write.
-- int comes from numbers.lua, prepended when the script is built.
local op, t, w = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, cost = tonumber(ARGV[4]), tonumber(ARGV[5])
local log, totals = KEYS[1], KEYS[2]
local from = string.format('%.0f', t - w) -- entries at or before it have ended

-- entry reads a member as (at, units); anything else is not ours: nil.
local function entry(m)
  local a, u = string.match(m, '^(%-?%d+):(%d+)$')
  if a ~= nil and #a <= 17 and #u <= 17 then
    return tonumber(a), tonumber(u)
  end
  return nil, nil
end

local function member(at, u)
  return string.format('%.0f:%.0f', at, u)
end

local function sum(members)
  local s = 0
  for _, m in ipairs(members) do
    local _, u = entry(m)
    if u ~= nil then
      s = s + u
    end
  end
  return s
end

-- The stored state: card members, total units, of which the first ended
-- members (by rank) hold endedUnits.
local card = redis.call('ZCARD', log)
local tv = redis.call('HMGET', totals, 'u', 'n')
local total, n = int(tv[1]), int(tv[2])
local ended, endedUnits = 0, 0
if card == 0 then
  total = 0
elseif total == nil or n ~= card or total < 0 then
  total = sum(redis.call('ZRANGE', log, 0, -1)) -- stored again by a write
end
if card > 0 then
  local few = redis.call('ZRANGEBYSCORE', log, '-inf', from, 'LIMIT', 0, 16)
  if #few < 16 then
    ended, endedUnits = #few, sum(few)
  else
    ended = redis.call('ZCOUNT', log, '-inf', from)
    if ended <= card - ended then
      endedUnits = sum(redis.call('ZRANGE', log, 0, ended - 1))
    else
      endedUnits = total - sum(redis.call('ZRANGE', log, ended, -1))
    end
  end
end
local used = total - endedUnits

-- newest returns the newest entry of ours at rank >= lo: at, units, member.
local function newest(lo)
  for r = card - 1, lo, -1 do
    local m = redis.call('ZRANGE', log, r, r)[1]
    if m == nil then
      return nil
    end
    local a, u = entry(m)
    if a ~= nil then
      return a, u, m
    end
  end
  return nil
end

local want, allowed, wrote = 1, 0, false
local top -- at of the newest live entry after the call, if any
if op == 1 then
  want = cost
  if used + cost <= limit then
    allowed, wrote = 1, true
    if ended > 0 then
      card = card - redis.call('ZREMRANGEBYSCORE', log, '-inf', from)
      total, ended = total - endedUnits, 0
    end
    local a, u, m = newest(0)
    top = t
    if a ~= nil and a > t then
      -- A clock behind: the entry of this ms, if any, is not the newest.
      top, a, u, m = a, nil, nil, nil
      for _, x in ipairs(redis.call('ZRANGEBYSCORE', log, string.format('%.0f', t), string.format('%.0f', t))) do
        local xa, xu = entry(x)
        if xa == t then
          a, u, m = xa, xu, x
        end
      end
    end
    if a == t then
      redis.call('ZREM', log, m)
      redis.call('ZADD', log, string.format('%.0f', t), member(t, u + cost))
    else
      redis.call('ZADD', log, string.format('%.0f', t), member(t, cost))
      card = card + 1
    end
    total, used = total + cost, used + cost
  end
elseif op == 3 then
  -- The newest entries go first, so emptied ones are always last; only
  -- live units are taken (left <= used), so only live entries change.
  local left = math.min(cost, used)
  used = used - left
  wrote = left > 0
  local kept = 0 -- members at the end that are not ours, skipped
  while left > 0 do
    local chunk = redis.call('ZRANGE', log, -(kept + 16), -(kept + 1))
    if #chunk == 0 then
      break
    end
    for i = #chunk, 1, -1 do
      local a, u = entry(chunk[i])
      if a == nil then
        kept = kept + 1
      elseif left > 0 then
        local take = math.min(left, u)
        redis.call('ZREM', log, chunk[i])
        left, total = left - take, total - take
        if take == u then
          card = card - 1
        else
          redis.call('ZADD', log, string.format('%.0f', a), member(a, u - take))
        end
      end
    end
  end
end
if op ~= 1 and used + 1 <= limit then
  allowed = 1
end
if top == nil and card > ended then
  top = newest(ended)
end

if wrote then
  if card == 0 then
    redis.call('DEL', totals)
  else
    redis.call('HSET', totals, 'u', string.format('%.0f', total), 'n', string.format('%.0f', card))
    if op == 1 then
      local ttl = string.format('%.0f', top + w - t + tonumber(ARGV[6]))
      redis.call('PEXPIRE', log, ttl)
      redis.call('PEXPIRE', totals, ttl)
    else
      -- A refund keeps the log's expiry; the totals follow it.
      local ttl = redis.call('PTTL', log)
      if ttl > 0 then
        redis.call('PEXPIRE', totals, ttl)
      end
    end
  end
end

local reset = t + w
if top ~= nil then
  reset = top + w
end
local retry = 0
if allowed == 0 then
  -- The oldest live entries end first; wait for enough of them: the first
  -- live entry (oldest first) by which need units have ended, walked from
  -- the oldest, or from the newest as the first whose units, with those
  -- newer, exceed used - need.
  local need = used + want - limit
  local fromOldest = need <= used - need + 1
  local rest = used - need
  -- Each entry holds a unit at least: the walk reads at most this many.
  local size, pos = math.min(16, math.min(need, rest + 1)), 0 -- chunk size, entries read
  while retry == 0 and pos < card - ended do
    local chunk
    if fromOldest then
      chunk = redis.call('ZRANGE', log, ended + pos, ended + pos + size - 1)
    else
      chunk = redis.call('ZRANGE', log, -(pos + size), -(pos + 1))
    end
    if #chunk == 0 then
      break
    end
    local first, last, step = 1, #chunk, 1
    if not fromOldest then
      first, last, step = #chunk, 1, -1
    end
    for i = first, last, step do
      local a, u = entry(chunk[i])
      if u ~= nil then
        if fromOldest then
          need = need - u
          if need <= 0 then
            retry = a + w - t
            break
          end
        else
          rest = rest - u
          if rest < 0 then
            retry = a + w - t
            break
          end
        end
      end
    end
    pos, size = pos + #chunk, math.min(size * 2, 1024)
  end
end
return {allowed, used, reset, retry}
