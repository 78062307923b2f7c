-- takes.lua runs, in one step, the Takes of fixed windows that arrived in
-- one batch: for each window, its Takes in their order, with the answers
-- take.lua would give them one after the other. A batch's windows on one
-- server cost one script call, and each window one HMGET and at most one
-- HSET, PEXPIRE and HINCRBY, instead of a script per Take. str comes from
-- numbers.lua, prepended when the script is built (it writes an integer
-- exactly).
--
-- KEYS[j]  window j's hash, as for take.lua; each key once
-- ARGV     the number of parameter sets P; then P sets of four of
--          take.lua's arguments: now, reset-at of a window opened now,
--          limit, expiry of a window opened now; then, for each window
--          in turn, the number of its Takes, then for each of them the
--          number of its set (1 to P) and its cost. The Takes of a batch
--          mostly share one set (one policy at one instant): a Take is
--          two short arguments, not five.
--
-- Returns one flat array: for each window in turn, take.lua's three
-- values for each of its Takes, one after the other; or, when the
-- window's key cannot be read or counted (WRONGTYPE, a u that is no
-- integer), that one error, for its Takes alone: the other windows are
-- answered, and it wrote nothing. The caller knows each window's Takes,
-- hence where each window's answer begins.
--
-- A window's writes are those its Takes would have left: the window last
-- opened (HSET u r, PEXPIRE, with that Take's own arguments, as strings),
-- then the units admitted after it, by HINCRBY. Units are summed in
-- doubles, exact to 2^53; limits and costs are at most 2^48.
-- Globals are table lookups in Lua 5.1: those used per Take are locals.
local tonumber, KEYS, ARGV = tonumber, KEYS, ARGV
local call, pcall = redis.call, redis.pcall
local sets = tonumber(ARGV[1])
local nows, limits = {}, {}
for s = 1, sets do
  local b = 4 * s - 2
  nows[s], limits[s] = tonumber(ARGV[b]), tonumber(ARGV[b + 2])
end
local out, o, a = {}, 0, 4 * sets + 2
for j = 1, #KEYS do
  local key, m = KEYS[j], tonumber(ARGV[a])
  local first = a + 1
  a = first + 2 * m
  local v = pcall('HMGET', key, 'u', 'r')
  if v.err then
    o = o + 1
    out[o] = v
  else
    local used, reset = tonumber(v[1]), tonumber(v[2])
    local start, opened, inc = o, nil, 0
    for i = first, a - 1, 2 do
      local s = tonumber(ARGV[i])
      local now, limit, cost = nows[s], limits[s], tonumber(ARGV[i + 1])
      if used == nil or reset == nil or reset <= now then
        if cost > limit then
          out[o + 1], out[o + 2], out[o + 3] = 0, 0, now
        else
          used, reset, opened, inc = cost, tonumber(ARGV[4 * s - 1]), i, 0
          out[o + 1], out[o + 2], out[o + 3] = 1, cost, reset
        end
      elseif cost > limit - used then
        out[o + 1], out[o + 2], out[o + 3] = 0, used, reset
      else
        used, inc = used + cost, inc + cost
        out[o + 1], out[o + 2], out[o + 3] = 1, used, reset
      end
      o = o + 3
    end
    if opened ~= nil then
      -- The key is a hash or none (HMGET read it): these cannot fail.
      local b = 4 * tonumber(ARGV[opened]) - 2
      call('HSET', key, 'u', ARGV[opened + 1], 'r', ARGV[b + 1])
      call('PEXPIRE', key, ARGV[b + 3])
    end
    if inc > 0 then
      -- Fails only on a u that is no integer, when no window was opened
      -- (HSET wrote one): then nothing was written.
      local r = pcall('HINCRBY', key, 'u', str(inc))
      if type(r) == 'table' and r.err then
        for i = o, start + 2, -1 do
          out[i] = nil
        end
        o = start + 1
        out[o] = r
      end
    end
  end
end
return out
