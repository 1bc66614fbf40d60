-- verify.lua returns a consistent snapshot of everything placement keeps,
-- for Store.Verify. It writes nothing. It is O(devices + allocations +
-- users): for tests and admin checks, not for request paths.
--
-- KEYS[1] gpus set, KEYS[2] allocs
-- KEYS[3] usage (hash of user and group counters)
-- KEYS[4..7] the mode sets of sliced, exclusive, mig, mps
-- ARGV[1] device key prefix
-- Returns {allocs, devices, usage, modes}:
--   allocs   HGETALL of KEYS[2]
--   devices  per device {uuid, HGETALL, score in its alla, allf, aidx, fidx
--            ("" when not a member or the key is absent)}
--   usage    HGETALL of KEYS[3]
--   modes    SMEMBERS of KEYS[4..7], in that order

local function score(key, member)
  if not key then return '' end
  local s = redis.call('ZSCORE', key, member)
  if not s then return '' end
  return s
end

local devices = {}
for _, uuid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local gkey = ARGV[1] .. uuid
  local idx = redis.call('HMGET', gkey, 'alla', 'allf', 'aidx', 'fidx')
  devices[#devices + 1] = {uuid, redis.call('HGETALL', gkey),
    score(idx[1], uuid), score(idx[2], uuid), score(idx[3], uuid), score(idx[4], uuid)}
end
local modes = {}
for i = 4, 7 do
  modes[#modes + 1] = redis.call('SMEMBERS', KEYS[i])
end

return {redis.call('HGETALL', KEYS[2]), devices, redis.call('HGETALL', KEYS[3]), modes}
