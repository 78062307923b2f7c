-- release.lua gives back a lease in KEYS[1], in one atomic step, by the
-- lease contract (throttler/lease.go) with the answers of
-- backend.LeaseSet's Release. It only removes: the key's expiry, set by
-- acquire.lua to outlive every lease, stays.
--
-- KEYS[1]  the leases: a sorted set, member the lease ID (decimal), score
--          its expiry in Unix ms
-- ARGV[1]  now (t), Unix ms, from the application's clock
-- ARGV[2]  the lease ID, decimal
--
-- Returns {held (0|1), used, earliest expiry (Unix ms; 0 when none is
-- held)}: held is whether the ID was held at t (an expired lease, one
-- released already or never acquired is not, and nothing changes).
local set, t, id = KEYS[1], tonumber(ARGV[1]), ARGV[2]

local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
local stale = false
if first[1] ~= nil and tonumber(first[2]) <= t then
  redis.call('ZREMRANGEBYSCORE', set, '-inf', ARGV[1])
  stale = true
end
local held = redis.call('ZREM', set, id)
local used = redis.call('ZCARD', set)

local earliest = 0
if used > 0 then
  if stale or (held == 1 and first[1] == id) then
    earliest = tonumber(redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2])
  else
    earliest = tonumber(first[2])
  end
end
return {held, used, earliest}
