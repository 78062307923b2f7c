-- log.lua is the sliding log's algorithm, with the answers of algo.Log
-- (internal/algo/algorithms.go), prepended to one_log.lua (one log's call)
-- and all.lua (a composite's): log_read counts the live units, log_apply
-- applies a take, peek or refund and answers, so that a composite checks
-- every member before it writes any. A peek writes nothing, so a replica
-- can run it; it answers from the caller's now like a take, so a replica
-- that lags answers as the primary did when it held the same units.
--
-- The log is a sorted set of one member per admitted unit, scored by the
-- Unix ms it was admitted at (at), named "<at>:<j>" with j the unit's
-- number within its ms, 1, 2, ... in five digits (a ms holds at most the
-- limit, 10,000, since all its units are live at that ms).
--
-- A unit is live at t while t < at + w (units from a later ms, written by a
-- clock ahead, count). Only an admitted take drops the units that ended by
-- t. Expiry is a duration, for cleanup only: at least until the newest
-- unit ends plus the margin, at most a grid cell of g = min(w, margin) ms
-- later (set once per cell, below).
--
-- One member per unit keeps every call to a few O(log n) commands
-- whatever the clocks, where a member per ms would need its units summed:
-- Used is ZCARD less a ZCOUNT of the ended scores; ResetAt is the newest
-- member's score; a denied call's RetryAfter is the score of the member by
-- which enough units will have ended, found by its rank from the newest; a
-- refund drops its newest by rank; a take adds its own, wherever its ms
-- falls, and drops the ended ones. A steady take is ZREVRANGE 0 0, ZCARD,
-- ZCOUNT (none when the take fits the log whole), ZADD and
-- ZREMRANGEBYSCORE (none when nothing ended), with PEXPIRE once per grid
-- cell. No command touches the key after one that may have deleted it (a
-- drop that emptied the set): see the take's drop below. algo.Log's
-- entries (at, units) are these members grouped by score.

-- log_newest returns the newest member of log and its score, or nil. The
-- score is read from the member's name, which starts with it: cheaper than
-- WITHSCORES (a double formatted by Redis, then parsed), which is kept for
-- a member of another shape.
local function log_newest(log)
  local m = redis.call('ZREVRANGE', log, '0', '0')[1]
  if m == nil then
    return nil, nil
  end
  local at = tonumber(string.match(m, '^(%-?%d+):'))
  if at == nil then
    at = tonumber(redis.call('ZSCORE', log, m))
  end
  return m, at
end

-- log_read reads the log for op (1 take, 2 peek, 3 refund) of cost at t,
-- the policy admitting limit units per w ms (endedArg: t - w as the
-- caller's string; units at or before it have ended): it returns the
-- newest member and its ms (nil when none), the units used and the units
-- ended. Used is ZCARD less a ZCOUNT of the ended members, those at or
-- before t - w. A ZCOUNT of the live ones would be one command, but on a
-- small set (a listpack) it walks every live member, where the ended ones
-- are the few at its head: without the slow log's cost per command, the
-- two measured faster (commandstats). When the newest unit ended, all
-- did. A take that fits even if none ended is read uncounted (ended nil,
-- used counting the ended units too): its drop counts them.
local function log_read(log, op, t, w, limit, cost, endedArg)
  local top, at = log_newest(log)
  local used, ended = 0, 0
  if top ~= nil then
    if at > t - w then
      used = redis.call('ZCARD', log)
      if op == 1 and used + cost <= limit then
        ended = nil
      else
        ended = redis.call('ZCOUNT', log, '-inf', endedArg)
        used = used - ended
      end
    else
      ended = 1
    end
  end
  return top, at, used, ended
end

-- log_apply applies op to the log read by log_read (top, at, used, ended,
-- for the same op, cost and t): a take that fits logs its units, a refund
-- of cost drops the newest units logged at or before receiptArg (a
-- refund's receipt less w, as the caller's string; units after it were
-- logged after the take). tArg is t, and endedArg t - w, as the caller's
-- strings; margin the expiry margin in ms (>= 1). It returns allowed
-- (0|1), used, reset-at ms and retry-after ms packed as four little-endian
-- doubles (one string, see algorithms.go's parsePacked).
local function log_apply(log, top, at, used, ended, op, t, tArg, w, limit, cost, endedArg,
    receiptArg, margin)
  local want, allowed = 1, 0
  if op == 1 then
    want = cost
    if used + cost <= limit then
      allowed = 1
      -- Number the units after those of this ms already logged: the last of
      -- them sorts last among its score.
      local j = 0
      if at ~= nil and at >= t then
        if at > t then
          top = redis.call('ZREVRANGEBYSCORE', log, tArg, tArg, 'LIMIT', 0, 1)[1]
        end
        if top ~= nil then
          j = tonumber(string.match(top, ':(%d+)$')) or 0
        end
      end
      if cost == 1 and j == 0 then
        redis.call('ZADD', log, tArg, tArg .. ':00001')
      else
        local args, n = {}, 0
        for i = j + 1, j + cost do
          args[n + 1], args[n + 2], n = tArg, string.format('%s:%05d', tArg, i), n + 2
          if n == 2000 or i == j + cost then
            redis.call('ZADD', log, unpack(args, 1, n))
            n = 0
          end
        end
      end
      -- Drop the units that ended only now that the take's own are logged
      -- (at t > t - w, never dropped): a drop that emptied the log would
      -- delete its key, and on the source node of a Cluster slot being
      -- migrated, any command on a key gone is refused, so the script would
      -- fail after its delete.
      if ended == nil then
        used = used - redis.call('ZREMRANGEBYSCORE', log, '-inf', endedArg)
      elseif ended > 0 then
        redis.call('ZREMRANGEBYSCORE', log, '-inf', endedArg)
      end
      used = used + cost
      -- The expiry runs to the end of the grid cell (g ms, cells aligned to
      -- the epoch) holding the newest unit's end, plus the margin. A take at
      -- or after the newest unit whose own unit ends in that same cell finds
      -- it set already and skips PEXPIRE; one whose unit ends in a later
      -- cell, or after every unit ended (the newest's cell is earlier: g <=
      -- w), or from a clock behind the newest unit, sets it. A refund only
      -- removes units, so the expiry it leaves still covers the newest.
      local newest = at
      if at == nil or at < t then
        newest = t
      end
      local g, e = math.min(w, margin), newest + w
      local r = math.fmod(e, g)
      if r < 0 then -- before 1970: fmod takes the dividend's sign
        r = r + g
      end
      if at == nil or at > t or (at < t and at + w < e - r) then
        redis.call('PEXPIRE', log, string.format('%d', e - r + g - t + margin))
      end
      at = newest
    end
  else
    if op == 3 and used > 0 then
      -- The newest live units logged at or before the receipt less w go
      -- first: ranks [upto - left, upto) of the set. (used > 0, so the
      -- ended units were counted above.)
      local upto = redis.call('ZCOUNT', log, '-inf', receiptArg)
      local left = math.min(cost, upto - ended)
      if left > 0 then
        redis.call('ZREMRANGEBYRANK', log, upto - left, upto - 1)
        used = used - left
        if used > 0 then
          top, at = log_newest(log)
        end
      end
    end
    if used + 1 <= limit then
      allowed = 1
    end
  end

  local reset = t + w
  if used > 0 then
    reset = at + w
  end
  local retry = 0
  if allowed == 0 then
    -- The oldest live units end first: wait until the unit by which enough
    -- of them have ended, the need-th oldest live one, used - need from the
    -- newest.
    local need = used + want - limit
    local m = redis.call('ZREVRANGE', log, used - need, used - need, 'WITHSCORES')
    retry = tonumber(m[2]) + w - t
  end
  return struct.pack('<dddd', allowed, used, reset, retry)
end
