-- numbers.lua is prepended to bucket.lua and counter.lua (backend/redis
-- algorithms.go): the integer reading and exact division they share.
--
-- int reads a stored field as a number only if it is a decimal integer of
-- magnitude <= 2^53 (exact in a double); anything else reads as absent.
-- ceildiv is ceil(a / b) for a >= 0 without a float division:
-- (a - fmod(a, b)) / b is exact below 2^53.
local function int(v)
  if type(v) ~= 'string' then
    return nil
  end
  local digits = string.match(v, '^%-?(%d+)$')
  if digits == nil or #digits > 16 or (#digits == 16 and digits > '9007199254740992') then
    return nil -- not a decimal integer of magnitude <= 2^53
  end
  return tonumber(v)
end

local function ceildiv(a, b)
  if a <= 0 then
    return 0
  end
  local r = math.fmod(a, b)
  if r > 0 then
    return (a - r) / b + 1
  end
  return a / b
end
