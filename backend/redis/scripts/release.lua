-- release.lua gives back a lease in KEYS[1], in one atomic step, by the
-- lease contract (throttler/lease.go) with the answers of
-- leaseset.Set's Release. It only removes: the key's expiry, set by
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
if first[1] == nil then
  return {0, 0, 0}
end
-- Removing the ID or the expired leases may empty the set, which deletes
-- its key; on the source node of a Cluster slot being migrated, any
-- command on a key gone is refused, and the script would fail after its
-- delete. So the count is taken first, and the set is read again only
-- while it holds a lease.
local card = redis.call('ZCARD', set)
local held, removed = 0, 0
if tonumber(first[2]) > t then
  held = redis.call('ZREM', set, id)
  removed = held
else
  local score = redis.call('ZSCORE', set, id)
  if score then
    if tonumber(score) > t then
      held = 1
    end
    removed = redis.call('ZREM', set, id)
  end
  if card > removed then
    removed = removed + redis.call('ZREMRANGEBYSCORE', set, '-inf', ARGV[1])
  end
end
local used = card - removed

local earliest = 0
if used > 0 then
  if removed > held or (held == 1 and first[1] == id) then
    earliest = tonumber(redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')[2])
  else
    earliest = tonumber(first[2])
  end
end
return {held, used, earliest}
