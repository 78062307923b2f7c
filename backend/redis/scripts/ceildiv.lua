-- ceildiv.lua is prepended to bucket.lua and counter.lua (backend/redis
-- algorithms.go): ceil(a / b) for a >= 0 without a float division,
-- (a - fmod(a, b)) / b, exact below 2^53. A prelude of its own because a
-- script pays for every function it defines on every call (a closure
-- each): the bucket needs this one alone.
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
