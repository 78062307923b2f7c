-- window.lua is the fixed window's algorithm, prepended to take.lua (one
-- window's Take) and all.lua (a composite's): the read, the admission and
-- the write of a Take, apart, so that a composite checks every member
-- before it writes any.
--
-- The window is a hash: field u = units used, field r = reset-at (Unix ms).
-- A stored window whose reset-at <= now has ended: it is replaced, whatever
-- TTL the key still has, so the application's clock decides, never Redis's.
-- Expiry is set as a duration (PEXPIRE), for cleanup only. Numbers are Lua
-- doubles: limits and costs are <= 2^48, the admission is written as cost
-- <= limit - used so that it stays exact, and values are stored from the
-- caller's strings or by HINCRBY, never formatted from a double.

-- window_read returns the units used in the window stored in key and its
-- reset-at, or nil and now when no window is open at now.
local function window_read(key, now)
  local v = redis.call('HMGET', key, 'u', 'r')
  local used, reset = tonumber(v[1]), tonumber(v[2])
  if used == nil or reset == nil or reset <= now then
    return nil, now
  end
  return used, reset
end

-- window_fits reports whether cost fits the window read (used nil: none),
-- a new one opening if needed. A cost above the limit never fits, so the
-- script alone never stores more than the limit.
local function window_fits(used, limit, cost)
  if used == nil then
    return cost <= limit
  end
  return cost <= limit - used
end

-- window_take counts cost, which fits, in the window read, opening one
-- when none is (its reset-at and expiry as the caller's strings), and
-- returns the units used after and the reset-at.
local function window_take(key, used, reset, cost, costArg, resetArg, expiryArg)
  if used == nil then
    redis.call('HSET', key, 'u', costArg, 'r', resetArg)
    redis.call('PEXPIRE', key, expiryArg)
    return cost, tonumber(resetArg)
  end
  return redis.call('HINCRBY', key, 'u', costArg), reset
end
