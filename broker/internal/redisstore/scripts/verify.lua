-- verify.lua returns a consistent snapshot of everything placement keeps,
-- for Store.Verify. It writes nothing. It is O(GPUs + allocations + users):
-- for tests and admin checks, not for request paths.
--
-- KEYS[1] gpus set, KEYS[2] allocs
-- KEYS[3] all avail index, KEYS[4] all full index
-- KEYS[5] usage (hash of user and group counters)
-- ARGV[1] gpu key prefix
-- Returns {allocs, gpus, usage}:
--   allocs  HGETALL of KEYS[2]
--   gpus    per GPU {uuid, HGETALL, score in all-avail, all-full,
--           model-avail, model-full ("" when not a member)}
--   usage   HGETALL of KEYS[5]

local function score(key, member)
  if not key then return '' end
  local s = redis.call('ZSCORE', key, member)
  if not s then return '' end
  return s
end

local gpus = {}
for _, uuid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local gkey = ARGV[1] .. uuid
  local idx = redis.call('HMGET', gkey, 'aidx', 'fidx')
  gpus[#gpus + 1] = {uuid, redis.call('HGETALL', gkey),
    score(KEYS[3], uuid), score(KEYS[4], uuid), score(idx[1], uuid), score(idx[2], uuid)}
end

return {redis.call('HGETALL', KEYS[2]), gpus, redis.call('HGETALL', KEYS[5])}
