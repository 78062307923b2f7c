-- acquire.lua takes a lease in KEYS[1], in one atomic step, by the lease
-- contract (throttler/lease.go) with the answers of leaseset.Set's
-- Acquire. Stripe's concurrent-requests limiter is the model: a sorted set
-- of the leases held, scored by time.
--
-- KEYS[1]  the leases: a sorted set, member the lease ID (decimal), score
--          its expiry in Unix ms
-- ARGV[1]  now (t), Unix ms, from the application's clock
-- ARGV[2]  the lease ID, decimal (up to 2^64 - 1: never a Lua number)
-- ARGV[3]  its expiry, t + TTL, Unix ms
-- ARGV[4]  the policy's limit (<= 10,000)
-- ARGV[5]  expiry margin, ms
--
-- Returns {allowed (0|1), used, earliest expiry (Unix ms)}: a lease is
-- always held after an Acquire, the new one or those that denied it.
--
-- Leases whose expiry is <= t are not held: they are dropped, which a
-- steady key skips after one look at the earliest. A key with no leases
-- (no set) takes three commands, one with leases five. An ID already held is
-- admitted again with its new expiry, counted once, even above a lowered
-- limit. Key expiry is a duration, for cleanup only: until the latest
-- lease ends, plus the margin. Scores are doubles, exact up to 2^53 ms.
local set, t, id = KEYS[1], tonumber(ARGV[1]), ARGV[2]
local expiry, limit = tonumber(ARGV[3]), tonumber(ARGV[4])

local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
if first[1] == nil then
  -- No leases (most keys, most of the time): this one is admitted alone.
  redis.call('ZADD', set, ARGV[3], id)
  redis.call('PEXPIRE', set, expiry - t + tonumber(ARGV[5]))
  return {1, 1, expiry}
end
-- Expired leases are dropped after the new one is added (its expiry is
-- after t, so it stays), never before: a drop that emptied the set would
-- delete its key, and on the source node of a Cluster slot being
-- migrated, any command on a key gone is refused, so the script would fail
-- after its delete.
local stale = tonumber(first[2]) <= t
local used = redis.call('ZCARD', set)
if stale then
  used = used - redis.call('ZCOUNT', set, '-inf', ARGV[1])
end

local allowed = 0
if used < limit then
  allowed = 1
else
  local score = redis.call('ZSCORE', set, id)
  if score and tonumber(score) > t then
    allowed = 1 -- held: admitted again, above the limit too
  end
end
if allowed == 1 then
  local added = redis.call('ZADD', set, ARGV[3], id)
  if stale then
    redis.call('ZREMRANGEBYSCORE', set, '-inf', ARGV[1])
    used = redis.call('ZCARD', set)
  else
    used = used + added
  end
elseif stale then
  -- Denied: the live leases (at least the limit, >= 1) keep the key.
  redis.call('ZREMRANGEBYSCORE', set, '-inf', ARGV[1])
end

-- A lease is held now (this one, or the Limit that denied it).
local earliest
if stale or first[1] == id then
  -- The earliest may have gone or moved: look again.
  earliest = tonumber(redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2])
else
  earliest = tonumber(first[2])
  if allowed == 1 and expiry < earliest then
    earliest = expiry
  end
end
if allowed == 1 then
  local latest = tonumber(redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2])
  redis.call('PEXPIRE', set, latest - t + tonumber(ARGV[5]))
end
return {allowed, used, earliest}
