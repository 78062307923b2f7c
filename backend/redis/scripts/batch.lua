-- batch.lua runs many operations in one script call, one per key, in the
-- order given; backend/redis batch.go prepends numbers.lua and the other
-- scripts, each wrapped as a function of (KEYS, ARGV): take, refund,
-- bucket, counter, log, and peek (a fixed window's HMGET u r).
--
-- KEYS[i]  operation i's key
-- ARGV     for each operation: its script's number (1 take, 2 refund,
--          3 bucket, 4 counter, 5 log, 6 peek), n, then its n arguments
--
-- Returns one reply per operation: its script's reply (an array), or the
-- text of the error it raised (a string), so that one key's error (a key
-- of another type) fails that operation alone. The operations before an
-- error keep their writes, as separate scripts would.
local fns = {take, refund, bucket, counter, log, peek}
local out = {}
local a = 1
for i = 1, #KEYS do
  local f = fns[tonumber(ARGV[a])]
  local n = tonumber(ARGV[a + 1])
  local args = {}
  for j = 1, n do
    args[j] = ARGV[a + 1 + j]
  end
  a = a + 2 + n
  local ok, r = pcall(f, {KEYS[i]}, args)
  if not ok then
    if type(r) == 'table' and r.err then
      r = r.err
    end
    r = tostring(r)
  end
  out[i] = r
end
return out
