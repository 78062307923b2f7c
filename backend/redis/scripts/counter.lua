-- counter.lua is the sliding-window counter's algorithm, exactly as
-- algo.Counter (internal/algo/algorithms.go) computes it, prepended to
-- one_counter.lua (one counter's call) and all.lua (a composite's):
-- counter_read reads the state, counter_apply applies a take, peek or
-- refund to it, and writes only when told to, so that a composite checks
-- every member before it writes any. The caller derives the Decision from
-- the state read with algo.Counter, so every answer is Go's.
--
-- The counter is a string "<k>:<c>:<p>:<w>", k = index of the newest window
-- with a count (window k is [k*w, (k+1)*w) in Unix ms), c = units in window
-- k, p = units in window k-1, w = the window in ms that indexed k.
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

-- counter_read returns whether key holds a state, and its k, c, p, w (zeros
-- when not): four decimal integers of magnitude <= 2^53.
local function counter_read(key)
  local v = redis.call('GET', key)
  if v then
    local a, b, c, d = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+)$')
    if a then
      local rk, rc, rp, rw = num(a), num(b), num(c), num(d)
      if rk ~= nil and rc ~= nil and rp ~= nil and rw ~= nil then
        return true, rk, rc, rp, rw
      end
    end
  end
  return false, 0, 0, 0, 0
end

-- counter_clamp reads a stored count: above a lowered limit, it is the
-- limit.
local function counter_clamp(n, limit)
  if n < 0 then
    return 0
  elseif n > limit then
    return limit
  end
  return n
end

-- counter_apply applies op (1 take, 2 peek, 3 refund) at t to the state
-- read (stored, rk, rc, rp, rw) of the counter in key, whose policy admits
-- limit units per w ms (wArg: w as the caller's string); cost is a take's
-- or a refund's, receipt a refund's ((K+1)*w of the refunded take's window
-- K), margin the expiry margin in ms. It writes the new state only when
-- write is true, and returns wrote (0|1: a take admitted, a refund given)
-- and the reply: wrote, stored (0|1), k, c, p, w, k', c', p' packed as nine
-- little-endian doubles (one string, see algorithms.go's parsePacked),
-- k', c', p' the state after the call, which the caller checks against
-- Go's.
local function counter_apply(key, stored, rk, rc, rp, rw, op, t, w, wArg, limit, cost, receipt,
    margin, write)
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
      curr, prev = counter_clamp(rc, limit), counter_clamp(rp, limit)
    elseif k == rk + 1 then
      prev = counter_clamp(rc, limit)
    end
  end

  local wrote = 0
  if op == 1 then
    if cost <= limit - (curr + ceildiv(prev * (w - e), w)) then
      curr = curr + cost
      wrote = 1
    end
  elseif op == 3 and live and k == rk and (k + 1) * w == receipt then
    curr = math.max(0, curr - math.min(cost, limit))
    wrote = 1
  end

  if wrote == 1 and write then
    local state = string.format('%d:%d:%d:%s', k, curr, prev, wArg)
    if live and k == rk then
      -- The state read set this window's expiry: keep it (KEEPTTL is
      -- cheaper than PX, which updates it).
      redis.call('SET', key, state, 'KEEPTTL')
    else
      redis.call('SET', key, state, 'PX', string.format('%d', (k + 2) * w - t + margin))
    end
  end
  if stored then
    return wrote, struct.pack('<ddddddddd', wrote, 1, rk, rc, rp, rw, k, curr, prev)
  end
  return wrote, struct.pack('<ddddddddd', wrote, 0, 0, 0, 0, 0, k, curr, prev)
end
