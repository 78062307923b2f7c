-- bucket.lua is the token bucket's algorithm, exactly as algo.TokenBucket
-- (internal/algo/algorithms.go) computes it, prepended to one_bucket.lua
-- (one bucket's call) and all.lua (a composite's): bucket_read reads the
-- state, bucket_apply applies a take, peek or refund to it, and writes only
-- when told to, so that a composite checks every member before it writes
-- any. The caller derives the Decision from the state read with
-- algo.TokenBucket, so every answer is Go's.
--
-- The bucket is a string of 24 bytes, three little-endian IEEE doubles
-- s, t, w (struct.pack '<ddd'): s = tokens scaled by the window (one token
-- is w units), t = Unix ms of the last refill, w = the window in ms that
-- scaled s.
--
-- One string, read with GET and written with SET PX, keeps a call to two
-- commands. Numbers are Lua doubles, exact to 2^53: policy validation
-- bounds capacity * w by 2^53, every product is formed only below that
-- bound, divisions are exact (a - fmod(a, b)) / b, and the state is
-- stored as doubles, exact for these integers. Expiry is a duration, for
-- cleanup only: at least until the bucket is full again plus the margin,
-- at most a grid cell of g = min(w, margin) ms later.
-- ceildiv comes from ceildiv.lua, prepended when the script is built.

-- bucket_read returns whether key holds a state, and its s, t, w (zeros
-- when not). struct.unpack reads the doubles without parsing decimals;
-- only integers of magnitude <= 2^53 read as a state (NaN fails x == x).
local function bucket_read(key)
  local v = redis.call('GET', key)
  if v and #v == 24 then
    local rs, rt, rw = struct.unpack('<ddd', v)
    if rs == math.floor(rs) and rt == math.floor(rt) and rw == math.floor(rw)
      and rs <= 9007199254740992 and rs >= -9007199254740992
      and rt <= 9007199254740992 and rt >= -9007199254740992
      and rw <= 9007199254740992 and rw >= -9007199254740992 then
      return true, rs, rt, rw
    end
  end
  return false, 0, 0, 0
end

-- bucket_apply applies op (1 take, 2 peek, 3 refund) at t to the state
-- read (stored, rs, rt, rw) of the bucket in key, whose policy refills
-- limit tokens per w ms into a capacity of cap; cost is a take's or a
-- refund's, receipt a refund's (the Unix ms at which the bucket was full
-- again after the refunded take: it refunds only before both t and t0
-- reach it), margin the expiry margin in ms (>= 1). It writes the new state
-- only when write is true, and returns wrote (0|1: a take admitted, a
-- refund given) and the reply: wrote, stored (0|1), s, t, w, s', t' packed
-- as seven little-endian doubles (one string, see algorithms.go's
-- parsePacked), s', t' the state after the call, which the caller checks
-- against Go's.
local function bucket_apply(key, stored, rs, rt, rw, op, t, w, limit, cap, cost, receipt, margin,
    write)
  local full = cap * w
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
  elseif op == 3 and live and s < full and t0 < receipt then
    -- A full bucket takes no refund and stores nothing, as a key with no
    -- state: so dropping a full bucket can never change a later answer.
    -- Nor does one that has been full since the take (t0 >= the receipt).
    s = math.min(full, s + math.min(cost, cap) * w)
    wrote = 1
  end

  if wrote == 1 and write then
    -- The expiry runs to the end of the grid cell (g ms, cells aligned to
    -- the epoch) holding the time the bucket is full again, plus the
    -- margin. A write whose end falls in the cell of the state it read, or
    -- an earlier one, keeps the expiry that state's write set (KEEPTTL:
    -- cheaper than PX, which updates it); only a later cell, or a key with
    -- no live state, sets it.
    local g, ends = math.min(w, margin), t0 + ceildiv(full - s, limit)
    local r = math.fmod(ends, g)
    if r < 0 then -- before 1970: fmod takes the dividend's sign
      r = r + g
    end
    local state = struct.pack('<ddd', s, t0, w)
    if live and prev >= ends - r then
      redis.call('SET', key, state, 'KEEPTTL')
    else
      -- Redis writes a number argument with %.17g: exact for these
      -- integers, below 2^53.
      redis.call('SET', key, state, 'PX', ends - r + g - t + margin)
    end
  end
  if stored then
    return wrote, struct.pack('<ddddddd', wrote, 1, rs, rt, rw, s, t0)
  end
  return wrote, struct.pack('<ddddddd', wrote, 0, 0, 0, 0, s, t0)
end
