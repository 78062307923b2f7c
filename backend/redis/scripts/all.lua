-- all.lua takes or peeks a composite's members (throttler.All) in one
-- atomic step: every member's algorithm on its own key, as one_bucket.lua,
-- one_counter.lua, one_log.lua and take.lua run it alone, from the
-- functions of window.lua, bucket.lua, counter.lua and log.lua: those of
-- its members' algorithms, prepended when the script is built for that
-- mix (composite.go), so a branch for another algorithm is never taken and
-- names functions that are not there. A take reads every member first and
-- writes only when every one admits the cost, so a denied composite writes
-- nothing; a peek writes nothing, so a replica can run it.
--
-- KEYS[i]  member i's key, as for the member alone: every key in one slot
-- ARGV[1]  op: 1 take, 2 peek
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  cost (> 0, <= every member's capacity; 1 for a peek)
-- ARGV[4]  expiry margin, ms (>= 1)
-- then five arguments per member, from a = 5i:
-- ARGV[a]      its algorithm: 0 fixed window, 1 token bucket, 2 sliding
--              log, 3 sliding-window counter (throttler.Algorithm)
-- ARGV[a+1]    its window in ms (w)
-- ARGV[a+2]    its limit
-- ARGV[a+3]    a fixed window's reset-at of a window opened now (t + w); a
--              bucket's capacity; a log's t - w; a counter's 0
-- ARGV[a+4]    a fixed window's expiry of a window opened now (w + margin);
--              0 for the others
--
-- Returns one string of little-endian doubles: admitted (0|1; 0 for a
-- peek), then each member's reply in order, as its script alone answers
-- (a fixed window's three values packed as doubles too). In a take, every
-- member answers a take when the composite is admitted; when it is not, a
-- member that denied answers its own denied take, and one that would have
-- admitted answers a peek, its state as it stands.
local op, t = tonumber(ARGV[1]), tonumber(ARGV[2])
local cost, margin = tonumber(ARGV[3]), tonumber(ARGV[4])
local n = #KEYS

-- read reads member i and reports whether a take of cost fits it; the
-- state read is kept in st[i] for answer.
local st = {}
local function read(i, rop)
  local key, a = KEYS[i], 5 * i
  local alg, w, limit = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if alg == '0' then
    local used, reset = window_read(key, t)
    st[i] = {used, reset}
    return window_fits(used, limit, cost)
  elseif alg == '1' then
    local stored, rs, rt, rw = bucket_read(key)
    st[i] = {stored, rs, rt, rw}
    local wrote = bucket_apply(key, stored, rs, rt, rw, 1, t, w, limit, tonumber(ARGV[a + 3]),
      cost, 0, margin, false)
    return wrote == 1
  elseif alg == '3' then
    local stored, rk, rc, rp, rw = counter_read(key)
    st[i] = {stored, rk, rc, rp, rw}
    local wrote = counter_apply(key, stored, rk, rc, rp, rw, 1, t, w, ARGV[a + 1], limit, cost, 0,
      margin, false)
    return wrote == 1
  end
  local top, at, used, ended = log_read(key, rop, t, w, limit, cost, ARGV[a + 3])
  st[i] = {top, at, used, ended}
  return used + cost <= limit
end

-- answer runs op aop (1 take, 2 peek) on member i's state read, writing
-- when aop is a take that fits, and returns the member's reply.
local function answer(i, aop)
  local key, a, s = KEYS[i], 5 * i, st[i]
  local alg, w, limit = ARGV[a], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  if alg == '0' then
    local used, reset = s[1], s[2]
    local fits = window_fits(used, limit, cost)
    if aop == 1 and fits then
      used, reset = window_take(key, used, reset, cost, ARGV[3], ARGV[a + 3], ARGV[a + 4])
    end
    if fits then
      return struct.pack('<ddd', 1, used or 0, reset)
    end
    return struct.pack('<ddd', 0, used or 0, reset)
  elseif alg == '1' then
    local _, reply = bucket_apply(key, s[1], s[2], s[3], s[4], aop, t, w, limit,
      tonumber(ARGV[a + 3]), cost, 0, margin, true)
    return reply
  elseif alg == '3' then
    local _, reply = counter_apply(key, s[1], s[2], s[3], s[4], s[5], aop, t, w, ARGV[a + 1], limit,
      cost, 0, margin, true)
    return reply
  end
  return log_apply(key, s[1], s[2], s[3], s[4], aop, t, ARGV[2], w, limit, cost, ARGV[a + 3], '0',
    margin)
end

local out = {}
if op == 2 then
  out[1] = struct.pack('<d', 0)
  for i = 1, n do
    read(i, 2)
    out[i + 1] = answer(i, 2)
  end
  return table.concat(out)
end
local fits, all = {}, true
for i = 1, n do
  fits[i] = read(i, 1)
  all = all and fits[i]
end
if all then
  out[1] = struct.pack('<d', 1)
  for i = 1, n do
    out[i + 1] = answer(i, 1)
  end
  return table.concat(out)
end
out[1] = struct.pack('<d', 0)
for i = 1, n do
  if fits[i] then
    -- It would have admitted: its state as it stands, as a peek reads
    -- it (a log's read for a take may have left its ended units
    -- uncounted: it is read again).
    if ARGV[5 * i] == '2' then
      read(i, 2)
    end
    out[i + 1] = answer(i, 2)
  else
    out[i + 1] = answer(i, 1) -- its own denied take: it writes nothing
  end
end
return table.concat(out)
