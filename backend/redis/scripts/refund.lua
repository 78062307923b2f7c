-- refund.lua gives ARGV[2] units back to the window stored in KEYS[1], never
-- below zero, if that window is still open at ARGV[1] and is the one the
-- refunded Take counted in (its reset-at is ARGV[3]); otherwise it changes
-- nothing, so a window a clock ahead opened is never credited.
--
-- KEYS[1]  the window's hash: field u = units used, field r = reset-at (Unix ms)
-- ARGV[1]  now, Unix ms, from the application's clock
-- ARGV[2]  cost (> 0)
-- ARGV[3]  the receipt: the reset-at (Unix ms) of the Take's window
--
-- Returns {used, reset-at ms}; reset-at <= now means no window is open.
local now = tonumber(ARGV[1])
local v = redis.call('HMGET', KEYS[1], 'u', 'r')
local used, reset = tonumber(v[1]), tonumber(v[2])
if used == nil or reset == nil or reset <= now then
  return {0, now}
end
if reset ~= tonumber(ARGV[3]) then
  return {used, reset}
end
local cost = tonumber(ARGV[2])
if cost >= used then
  redis.call('HSET', KEYS[1], 'u', '0')
  return {0, reset}
end
return {redis.call('HINCRBY', KEYS[1], 'u', '-' .. ARGV[2]), reset}
