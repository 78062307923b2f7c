-- take.lua counts ARGV[4] units against the window stored in KEYS[1], if they
-- fit, in one atomic step.
--
-- KEYS[1]  the window's hash: field u = units used, field r = reset-at (Unix ms)
-- ARGV[1]  now, Unix ms, from the application's clock
-- ARGV[2]  reset-at of a window opened now: now + the policy's window, Unix ms
-- ARGV[3]  the policy's limit
-- ARGV[4]  cost (> 0, <= limit: the caller refuses a larger one as an
--          input error, ErrInvalidCost)
-- ARGV[5]  expiry of a window opened now, ms: the policy's window + a margin
--
-- Returns {allowed (0|1), used, reset-at ms}. Should a cost above the limit
-- reach it anyway, it opens nothing and returns reset-at = now ("no
-- window"): the script alone never stores more than the limit.
--
-- A stored window whose reset-at <= now has ended: it is replaced, whatever
-- TTL the key still has, so the application's clock decides, never Redis's.
-- Expiry is set as a duration (PEXPIRE), for cleanup only.
--
-- Numbers are Lua doubles: the caller keeps limit and cost <= 2^53, the
-- comparison is written as cost > limit - used so that it stays exact, and
-- values are stored from the caller's strings or by HINCRBY, never
-- formatted from a double.
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local v = redis.call('HMGET', KEYS[1], 'u', 'r')
local used, reset = tonumber(v[1]), tonumber(v[2])
if used == nil or reset == nil or reset <= now then
  if cost > limit then
    return {0, 0, now}
  end
  redis.call('HSET', KEYS[1], 'u', ARGV[4], 'r', ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  return {1, cost, tonumber(ARGV[2])}
end
if cost > limit - used then
  return {0, used, reset}
end
return {1, redis.call('HINCRBY', KEYS[1], 'u', ARGV[4]), reset}
