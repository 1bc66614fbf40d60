-- batch.lua runs one operation's script body for each request of a batch
-- (group commit, batch.go). It follows the definition of
-- `local function one(KEYS, ARGV)`, the body of place.lua or release.lua
-- as a function, with each request's own KEYS and ARGV (scripts.go).
--
-- ARGV[1] n, the number of requests; ARGV[2] keys per request (kc);
-- ARGV[3..2+n] the number of arguments of each request; then every
-- request's arguments, in order. KEYS: kc per request, in order.
-- Returns one reply per request, in order: the body's reply, or
-- {"error", message} when the body raised an error. A body writes nothing
-- before it has read and checked what it needs, so an error leaves that
-- request's state as it was, and the requests before and after it stand.

local n, kc = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
local at = 2 + n
for i = 1, n do
  local k, a = {}, {}
  for j = 1, kc do
    k[j] = KEYS[(i - 1) * kc + j]
  end
  for j = 1, tonumber(ARGV[2 + i]) do
    a[j] = ARGV[at + j]
  end
  at = at + #a
  local ok, r = pcall(one, k, a)
  if ok then
    out[i] = r
  else
    if type(r) == 'table' then
      r = r.err
    end
    out[i] = {'error', tostring(r)}
  end
end
return out
