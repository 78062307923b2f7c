-- take.lua counts ARGV[4] units against the window stored in KEYS[1], if they
-- fit, in one atomic step. window_read, window_fits and window_take come
-- from window.lua, prepended when the script is built.
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
-- window").
local now, cost = tonumber(ARGV[1]), tonumber(ARGV[4])
local used, reset = window_read(KEYS[1], now)
if not window_fits(used, tonumber(ARGV[3]), cost) then
  return {0, used or 0, reset}
end
used, reset = window_take(KEYS[1], used, reset, cost, ARGV[4], ARGV[2], ARGV[5])
return {1, used, reset}
