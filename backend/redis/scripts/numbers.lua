-- numbers.lua is prepended to counter.lua (backend/redis algorithms.go) and
-- takes.lua (batch.go): the integer reading and writing they share.
--
-- num reads a decimal integer, captured as -?%d+, as a number only if its
-- magnitude is at most 2^53 (exact in a double); else nil, and the state
-- that holds it reads as none.
local function num(x)
  if #x < 16 then
    return tonumber(x) -- below 10^15 in magnitude
  end
  -- Compared as a number, without a new string (string.sub) or a string
  -- comparison (strcoll, under Redis's locale): every integer below 2^53
  -- reads exactly and every one from 2^53 on as 2^53 or more, so only 2^53
  -- itself needs its digits checked.
  local n = tonumber(x)
  local digits = #x
  if string.byte(x, 1) == 45 then -- '-'
    digits = digits - 1
  end
  if digits > 16 then
    return nil
  end
  if (n < 9007199254740992 and n > -9007199254740992) or x == '9007199254740992' or x == '-9007199254740992' then
    return n
  end
  return nil
end

-- str writes an integer-valued number exactly: Lua's own conversion
-- (%.14g) does so below 10^14, and %.0f, slower, above.
local function str(n)
  if n < 1e14 and n > -1e14 then
    return n
  end
  return string.format('%.0f', n)
end
