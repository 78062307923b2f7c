-- one_bucket.lua takes, peeks or refunds units of the token bucket stored
-- in KEYS[1], in one atomic step: bucket_read and bucket_apply (bucket.lua,
-- prepended when the script is built). A peek writes nothing, so a replica
-- can run it.
--
-- KEYS[1]  the bucket (bucket.lua)
-- ARGV[1]  op: 1 take, 2 peek, 3 refund
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  the policy's window in ms (w)
-- ARGV[4]  the policy's limit: tokens refilled per window
-- ARGV[5]  capacity (the burst, or the limit)
-- ARGV[6]  cost (> 0, <= capacity for a take)
-- ARGV[7]  expiry margin, ms (>= 1)
-- ARGV[8]  a refund's receipt (bucket_apply)
--
-- Returns bucket_apply's reply.
local stored, rs, rt, rw = bucket_read(KEYS[1])
local _, reply = bucket_apply(KEYS[1], stored, rs, rt, rw, tonumber(ARGV[1]), tonumber(ARGV[2]),
  tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8]),
  tonumber(ARGV[7]), true)
return reply
