-- batch.lua runs one operation's function for each request of a batch
-- (group commit, batch.go). It follows the script of the operation
-- (place.lua or release.lua), which defines it, and `local one = <it>`
-- (scripts.go). Each request's KEYS and ARGV are the operation's shared
-- keys and arguments (the same for every request of a batch: sent once,
-- so Redis makes their strings once per batch, not per request) followed
-- by the request's own.
--
-- ARGV[1] n, the number of requests; ARGV[2] shared keys (sk); ARGV[3]
-- keys of each request (kc); ARGV[4] shared arguments (sa); ARGV[5..4+n]
-- the number of own arguments of each request; then the shared arguments;
-- then every request's own arguments, in order. KEYS: the sk shared keys,
-- then kc per request, in order.
-- Returns one reply per request, in order: the function's reply, or
-- {"error", message} when it raised an error. A function writes nothing
-- before it has read and checked what it needs, so an error leaves that
-- request's state as it was, and the requests before and after it stand.

local n, sk, kc, sa = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
-- One KEYS and one ARGV table for every request: the shared part is
-- filled once, the own part overwritten per request (an operation keeps
-- no reference to them), and entries a longer request left are cleared.
local k, a = {}, {}
for j = 1, sk do
  k[j] = KEYS[j]
end
local at = 4 + n
for j = 1, sa do
  a[j] = ARGV[at + j]
end
at = at + sa
local last = sa
for i = 1, n do
  local base = sk + (i - 1) * kc
  for j = 1, kc do
    k[sk + j] = KEYS[base + j]
  end
  local own = tonumber(ARGV[4 + i])
  for j = 1, own do
    a[sa + j] = ARGV[at + j]
  end
  for j = sa + own + 1, last do
    a[j] = nil
  end
  last = sa + own
  at = at + own
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
