-- counter.lua takes, peeks or refunds units of the sliding-window counter
-- stored in KEYS[1], in one atomic step, exactly as algo.Counter
-- (internal/algo/algorithms.go) does. It returns the state it read; the caller
-- derives the Decision from that state with algo.Counter, so every
-- answer is Go's. A peek writes nothing, so a replica can run it.
--
-- KEYS[1]  the counter: a string "<k>:<c>:<p>:<w>", k = index of the
--          newest window with a count (window k is [k*w, (k+1)*w) in Unix
--          ms), c = units in window k, p = units in window k-1, w = the
--          window in ms that indexed k
-- ARGV[1]  op: 1 take, 2 peek, 3 refund
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  the policy's window in ms (w)
-- ARGV[4]  the policy's limit
-- ARGV[5]  cost (> 0, <= limit for a take)
-- ARGV[6]  expiry margin, ms
-- ARGV[7]  a refund's receipt: (K+1)*w of the refunded take's window K
--
-- Returns wrote (0|1), stored (0|1), k, c, p, w, k', c', p' packed as nine
-- little-endian doubles (one string, see algorithms.go's parsePacked):
-- stored is 1 when the value holds four decimal integers of magnitude
-- <= 2^53, k, c, p, w are their values (0 otherwise), and k', c', p' the
-- state after the call, which the caller checks against Go's.
--
-- One string, read with GET and written with SET PX, keeps a call to two
-- commands. Numbers are Lua doubles, exact to 2^53: policy validation
-- bounds limit * w by 2^53, divisions are exact (a - fmod(a, b)) / b, and
-- numbers are written with %d (exact: Redis's Lua formats it from a 64-bit
-- integer), in one string.format. Expiry is a duration, for cleanup
-- only: until both counted windows are older than the previous one,
-- (k+2)*w, plus the margin, set by the first write of window k (from its
-- writer's clock) and kept by the others.
-- num and ceildiv come from numbers.lua and ceildiv.lua, prepended when the
-- script is built.

local op, t, w = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, cost = tonumber(ARGV[4]), tonumber(ARGV[5])

-- clamp reads a stored count: above a lowered limit, it is the limit.
local function clamp(n, limit)
  if n < 0 then
    return 0
  elseif n > limit then
    return limit
  end
  return n
end

local rk, rc, rp, rw
local v = redis.call('GET', KEYS[1])
if v then
  local a, b, c, d = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+)$')
  if a then
    rk, rc, rp, rw = num(a), num(b), num(c), num(d)
  end
end
local stored = rk ~= nil and rc ~= nil and rp ~= nil and rw ~= nil
local live = stored and rw == w -- a state of another window reads as none

local e = math.fmod(t, w) -- floor division, for instants before 1970 too
if e < 0 then
  e = e + w
end
local k = (t - e) / w
local curr, prev = 0, 0
if live then
  if k < rk then -- a clock behind: answered as made at rk*w
    k, e = rk, 0
  end
  if k == rk then
    curr, prev = clamp(rc, limit), clamp(rp, limit)
  elseif k == rk + 1 then
    prev = clamp(rc, limit)
  end
end

local wrote = 0
if op == 1 then
  if cost <= limit - (curr + ceildiv(prev * (w - e), w)) then
    curr = curr + cost
    wrote = 1
  end
elseif op == 3 and live and k == rk and (k + 1) * w == tonumber(ARGV[7]) then
  curr = math.max(0, curr - math.min(cost, limit))
  wrote = 1
end

if wrote == 1 then
  local state = string.format('%d:%d:%d:%s', k, curr, prev, ARGV[3])
  if live and k == rk then
    -- The state read set this window's expiry: keep it (KEEPTTL is
    -- cheaper than PX, which updates it).
    redis.call('SET', KEYS[1], state, 'KEEPTTL')
  else
    redis.call('SET', KEYS[1], state, 'PX', string.format('%d', (k + 2) * w - t + tonumber(ARGV[6])))
  end
end
if stored then
  return struct.pack('<ddddddddd', wrote, 1, rk, rc, rp, rw, k, curr, prev)
end
return struct.pack('<ddddddddd', wrote, 0, 0, 0, 0, 0, k, curr, prev)
