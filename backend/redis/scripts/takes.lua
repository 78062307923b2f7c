-- takes.lua runs, in one step, the Takes of fixed windows that arrived in
-- one batch: for each window, its Takes in their order, with the answers
-- take.lua would give them one after the other. A batch's windows on one
-- server cost one script call, and each window one HMGET and at most one
-- HSET, PEXPIRE and HINCRBY, instead of a script per Take. num, str and
-- ceildiv come from numbers.lua, prepended when the script is built (str
-- writes an integer exactly).
--
-- KEYS[j]  window j's hash, as for take.lua; each key once
-- ARGV     for each window in turn: the number of its Takes, then for
--          each of them take.lua's five arguments: now, reset-at of a
--          window opened now, limit, cost, expiry of a window opened now
--
-- Returns one entry per window: take.lua's three values for each of its
-- Takes, one after the other; or, when the window's key cannot be read
-- or counted (WRONGTYPE, a u that is no integer), that error, for its
-- Takes alone: the other windows are answered, and it wrote nothing.
--
-- A window's writes are those its Takes would have left: the window last
-- opened (HSET u r, PEXPIRE, with that Take's own arguments, as strings),
-- then the units admitted after it, by HINCRBY. Units are summed in
-- doubles, exact to 2^53; limits and costs are at most 2^48.
local out, a = {}, 1
for j = 1, #KEYS do
  local key, m = KEYS[j], tonumber(ARGV[a])
  local first = a + 1
  a = first + 5 * m
  local v = redis.pcall('HMGET', key, 'u', 'r')
  if v.err then
    out[j] = v
  else
    local used, reset = tonumber(v[1]), tonumber(v[2])
    local res, opened, inc = {}, nil, 0
    for i = first, a - 1, 5 do
      local now, limit, cost = tonumber(ARGV[i]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
      local n = #res
      if used == nil or reset == nil or reset <= now then
        if cost > limit then
          res[n + 1], res[n + 2], res[n + 3] = 0, 0, now
        else
          used, reset, opened, inc = cost, tonumber(ARGV[i + 1]), i, 0
          res[n + 1], res[n + 2], res[n + 3] = 1, cost, reset
        end
      elseif cost > limit - used then
        res[n + 1], res[n + 2], res[n + 3] = 0, used, reset
      else
        used, inc = used + cost, inc + cost
        res[n + 1], res[n + 2], res[n + 3] = 1, used, reset
      end
    end
    if opened ~= nil then
      -- The key is a hash or none (HMGET read it): these cannot fail.
      redis.call('HSET', key, 'u', ARGV[opened + 3], 'r', ARGV[opened + 1])
      redis.call('PEXPIRE', key, ARGV[opened + 4])
    end
    if inc > 0 then
      -- Fails only on a u that is no integer, when no window was opened
      -- (HSET wrote one): then nothing was written.
      local r = redis.pcall('HINCRBY', key, 'u', str(inc))
      if type(r) == 'table' and r.err then
        res = r
      end
    end
    out[j] = res
  end
end
return out
