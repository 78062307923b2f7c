-- bucket.lua takes, peeks or refunds units of the token bucket stored in
-- KEYS[1], in one atomic step, exactly as algo.TokenBucket
-- (internal/algo/algorithms.go) does. It returns the state it read; the caller
-- derives the Decision from that state with algo.TokenBucket, so every
-- answer is Go's. A peek writes nothing, so a replica can run it.
--
-- KEYS[1]  the bucket: a string of 24 bytes, three little-endian IEEE
--          doubles s, t, w (struct.pack '<ddd'): s = tokens scaled by the
--          window (one token is w units), t = Unix ms of the last refill,
--          w = the window in ms that scaled s
-- ARGV[1]  op: 1 take, 2 peek, 3 refund
-- ARGV[2]  now (t), Unix ms, from the application's clock
-- ARGV[3]  the policy's window in ms (w)
-- ARGV[4]  the policy's limit: tokens refilled per window
-- ARGV[5]  capacity (the burst, or the limit)
-- ARGV[6]  cost (> 0, <= capacity for a take)
-- ARGV[7]  expiry margin, ms (>= 1)
-- ARGV[8]  a refund's receipt: the Unix ms at which the bucket was full
--          again after the refunded take (its ResetAt); refunds only
--          before both t and t0 reach it
--
-- Returns wrote (0|1), stored (0|1), s, t, w, s', t' packed as seven
-- little-endian doubles (one string, see algorithms.go's parsePacked):
-- stored is 1 when the value holds three integers of magnitude <= 2^53,
-- s, t, w are their values (0 otherwise), and s', t' the state after the
-- call, which the caller checks against Go's.
--
-- One string, read with GET and written with SET PX, keeps a call to two
-- commands. Numbers are Lua doubles, exact to 2^53: policy validation
-- bounds capacity * w by 2^53, every product is formed only below that
-- bound, divisions are exact (a - fmod(a, b)) / b, and the state is
-- stored as doubles, exact for these integers. Expiry is a duration, for
-- cleanup only: at least until the bucket is full again plus the margin,
-- at most a grid cell of g = min(w, margin) ms later.
-- ceildiv comes from ceildiv.lua, prepended when the script is built.

local op, t, w = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local limit, cap, cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local full = cap * w

-- The state is three little-endian doubles: struct.unpack reads them
-- without parsing decimals, struct.pack writes them without formatting.
-- Only integers of magnitude <= 2^53 read as a state (NaN fails x == x).
local rs, rt, rw
local stored = false
local v = redis.call('GET', KEYS[1])
if v and #v == 24 then
  rs, rt, rw = struct.unpack('<ddd', v)
  stored = rs == math.floor(rs) and rt == math.floor(rt) and rw == math.floor(rw)
    and rs <= 9007199254740992 and rs >= -9007199254740992
    and rt <= 9007199254740992 and rt >= -9007199254740992
    and rw <= 9007199254740992 and rw >= -9007199254740992
end
local live = stored and rw == w -- a state of another window reads as none

-- prev: when the state read is full again (its key expires no sooner
-- than the end of the grid cell holding it, plus the margin; below).
local s, t0, prev = full, t, t
if live then
  s, t0 = rs, rt
  if s < 0 then
    s = 0
  elseif s > full then
    s = full
  end
  prev = t0 + ceildiv(full - s, limit)
end
if t > t0 then
  if t >= prev then
    s = full
  else
    s = s + (t - t0) * limit -- < full - s
  end
  t0 = t
end

local wrote = 0
if op == 1 then
  local need = cost * w
  if s >= need then
    s = s - need
    wrote = 1
  end
elseif op == 3 and live and s < full and t0 < tonumber(ARGV[8]) then
  -- A full bucket takes no refund and stores nothing, as a key with no
  -- state: so dropping a full bucket can never change a later answer.
  -- Nor does one that has been full since the take (t0 >= the receipt).
  s = math.min(full, s + math.min(cost, cap) * w)
  wrote = 1
end

if wrote == 1 then
  -- The expiry runs to the end of the grid cell (g ms, cells aligned to
  -- the epoch) holding the time the bucket is full again, plus the
  -- margin. A write whose end falls in the cell of the state it read, or
  -- an earlier one, keeps the expiry that state's write set (KEEPTTL:
  -- cheaper than PX, which updates it); only a later cell, or a key with
  -- no live state, sets it.
  local margin = tonumber(ARGV[7])
  local g, ends = math.min(w, margin), t0 + ceildiv(full - s, limit)
  local r = math.fmod(ends, g)
  if r < 0 then -- before 1970: fmod takes the dividend's sign
    r = r + g
  end
  local state = struct.pack('<ddd', s, t0, w)
  if live and prev >= ends - r then
    redis.call('SET', KEYS[1], state, 'KEEPTTL')
  else
    -- Redis writes a number argument with %.17g: exact for these
    -- integers, below 2^53.
    redis.call('SET', KEYS[1], state, 'PX', ends - r + g - t + margin)
  end
end
if stored then
  return struct.pack('<ddddddd', wrote, 1, rs, rt, rw, s, t0)
end
return struct.pack('<ddddddd', wrote, 0, 0, 0, 0, s, t0)
