-- one_log.lua takes, peeks or refunds units of the sliding log stored in
-- KEYS[1], in one atomic step: log_read and log_apply (log.lua, prepended
-- when the script is built). A peek writes nothing, so a replica can run
-- it.
--
-- KEYS[1]  the log (log.lua)
-- ARGV[1]  op: 1 take, 2 peek, 3 refund
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  the policy's window in ms (w)
-- ARGV[4]  the policy's limit (<= 10,000)
-- ARGV[5]  cost (> 0, <= limit for a take; ignored by a peek)
-- ARGV[6]  expiry margin, ms (>= 1)
-- ARGV[7]  t - w: units at or before it have ended
-- ARGV[8]  a refund's receipt less w: the refunded take's units are at or
--          before it, and units after it were logged after the take
--
-- Returns log_apply's reply.
local op, t, w = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, cost = tonumber(ARGV[4]), tonumber(ARGV[5])
local top, at, used, ended = log_read(KEYS[1], op, t, w, limit, cost, ARGV[7])
return log_apply(KEYS[1], top, at, used, ended, op, t, ARGV[2], w, limit, cost, ARGV[7], ARGV[8],
  tonumber(ARGV[6]))
