-- log.lua takes, peeks or refunds units of the sliding log stored in KEYS[1],
-- in one atomic step, exactly as backend.Log (backend/algorithms.go) does.
-- A peek writes nothing, so a replica can run it; it answers from the
-- caller's now like a take, so a replica that lags answers as the primary
-- did when it held the same entries.
--
-- KEYS[1]  the log: a sorted set of one member "<at>:<units>" per ms that
--          admitted units, scored by at (Unix ms); entries of one ms merge
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
local op, t, w = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, cost = tonumber(ARGV[4]), tonumber(ARGV[5])
local from = t - w -- entries at or before it have ended

local members = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%.0f', from), '+inf')
local ats, units, names, n, used = {}, {}, {}, 0, 0
for _, m in ipairs(members) do
  local a, u = string.match(m, '^(%-?%d+):(%d+)$')
  if a ~= nil and #a <= 17 and #u <= 17 then -- anything else is not ours: skipped
    n = n + 1
    ats[n], units[n], names[n] = tonumber(a), tonumber(u), m
    used = used + units[n]
  end
end

local function entry(at, u)
  return string.format('%.0f:%.0f', at, u)
end

local want, allowed = 1, 0
if op == 1 then
  want = cost
  if used + cost <= limit then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', from))
    local i = n
    while i > 0 and ats[i] > t do
      i = i - 1
    end
    if i > 0 and ats[i] == t then
      redis.call('ZREM', KEYS[1], names[i])
      units[i] = units[i] + cost
    else
      -- A new entry; only the newest matters below, so the arrays need
      -- it only when it is the newest.
      if i == n then
        n = n + 1
        ats[n] = t
        units[n] = cost
        i = n
      else
        i = 0
      end
    end
    if i > 0 then
      redis.call('ZADD', KEYS[1], string.format('%.0f', t), entry(t, units[i]))
    else
      redis.call('ZADD', KEYS[1], string.format('%.0f', t), entry(t, cost))
    end
    used = used + cost
    allowed = 1
    redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ats[n] + w - t + tonumber(ARGV[6])))
  end
else
  if op == 3 then
    -- The newest entries go first, so emptied ones are always last.
    local left = math.min(cost, used)
    used = used - left
    while left > 0 do
      local take = math.min(left, units[n])
      redis.call('ZREM', KEYS[1], names[n])
      units[n] = units[n] - take
      left = left - take
      if units[n] == 0 then
        n = n - 1
      else
        redis.call('ZADD', KEYS[1], string.format('%.0f', ats[n]), entry(ats[n], units[n]))
      end
    end
  end
  if used + 1 <= limit then
    allowed = 1
  end
end

local reset = t + w
if n > 0 then
  reset = ats[n] + w
end
local retry = 0
if allowed == 0 then
  -- The oldest live entries end first; wait for enough of them.
  local need = used + want - limit
  for i = 1, n do
    need = need - units[i]
    if need <= 0 then
      retry = ats[i] + w - t
      break
    end
  end
end
return {allowed, used, reset, retry}
