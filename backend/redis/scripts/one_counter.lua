-- one_counter.lua takes, peeks or refunds units of the sliding-window
-- counter stored in KEYS[1], in one atomic step: counter_read and
-- counter_apply (counter.lua, prepended when the script is built). A peek
-- writes nothing, so a replica can run it.
--
-- KEYS[1]  the counter (counter.lua)
-- ARGV[1]  op: 1 take, 2 peek, 3 refund
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  the policy's window in ms (w)
-- ARGV[4]  the policy's limit
-- ARGV[5]  cost (> 0, <= limit for a take)
-- ARGV[6]  expiry margin, ms
-- ARGV[7]  a refund's receipt: (K+1)*w of the refunded take's window K
--
-- Returns counter_apply's reply.
local stored, rk, rc, rp, rw = counter_read(KEYS[1])
local _, reply = counter_apply(KEYS[1], stored, rk, rc, rp, rw, tonumber(ARGV[1]),
  tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]),
  tonumber(ARGV[7]), tonumber(ARGV[6]), true)
return reply
