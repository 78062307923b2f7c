-- takes.lua runs, in one step, the Takes of one fixed window that arrived
-- in one batch, in their order, with the answers take.lua would give them
-- one after the other: a hot key's batch costs one script call, one HMGET
-- and at most one HSET, PEXPIRE and HINCRBY, instead of a script per Take.
-- num, str and ceildiv come from numbers.lua, prepended when the script is
-- built (str writes an integer exactly).
--
-- KEYS[1]  the window's hash, as for take.lua
-- ARGV     for each Take, take.lua's five arguments: now, reset-at of a
--          window opened now, limit, cost, expiry of a window opened now
--
-- Returns take.lua's three values for each Take, one after the other.
--
-- The writes are those the Takes would have left: the window last opened
-- (HSET u r, PEXPIRE, with that Take's own arguments, as strings), then
-- the units admitted after it, by HINCRBY. Units are summed in doubles,
-- exact to 2^53; limits and costs are at most 2^48.
local v = redis.call('HMGET', KEYS[1], 'u', 'r')
local used, reset = tonumber(v[1]), tonumber(v[2])
local out, opened, inc = {}, nil, 0
for i = 1, #ARGV, 5 do
  local now, limit, cost = tonumber(ARGV[i]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local n = #out
  if used == nil or reset == nil or reset <= now then
    if cost > limit then
      out[n + 1], out[n + 2], out[n + 3] = 0, 0, now
    else
      used, reset, opened, inc = cost, tonumber(ARGV[i + 1]), i, 0
      out[n + 1], out[n + 2], out[n + 3] = 1, cost, reset
    end
  elseif cost > limit - used then
    out[n + 1], out[n + 2], out[n + 3] = 0, used, reset
  else
    used, inc = used + cost, inc + cost
    out[n + 1], out[n + 2], out[n + 3] = 1, used, reset
  end
end
if opened ~= nil then
  redis.call('HSET', KEYS[1], 'u', ARGV[opened + 3], 'r', ARGV[opened + 1])
  redis.call('PEXPIRE', KEYS[1], ARGV[opened + 4])
end
if inc > 0 then
  redis.call('HINCRBY', KEYS[1], 'u', str(inc))
end
return out
