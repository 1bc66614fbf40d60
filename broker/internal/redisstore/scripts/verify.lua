-- verify.lua returns a consistent snapshot of everything placement keeps,
-- for Store.Verify. It writes nothing. It is O(GPUs + allocations + users):
-- for tests and admin checks, not for request paths.
--
-- KEYS[1] gpus set, KEYS[2] allocs
-- KEYS[3] all healthy index, KEYS[4] all avail index
-- ARGV[1] gpu key prefix
-- ARGV[2] SCAN pattern of user counter keys, ARGV[3] of group counter keys
-- Returns {allocs, gpus, users, groups}:
--   allocs  HGETALL of KEYS[2]
--   gpus    per GPU {uuid, HGETALL, score in all-healthy, all-avail,
--           model-healthy, model-avail ("" when not a member)}
--   users, groups  per key {key, HGETALL}

local function score(key, member)
  if not key then return '' end
  local s = redis.call('ZSCORE', key, member)
  if not s then return '' end
  return s
end

local gpus = {}
for _, uuid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local gkey = ARGV[1] .. uuid
  local idx = redis.call('HMGET', gkey, 'hidx', 'aidx')
  gpus[#gpus + 1] = {uuid, redis.call('HGETALL', gkey),
    score(KEYS[3], uuid), score(KEYS[4], uuid), score(idx[1], uuid), score(idx[2], uuid)}
end

local function scan(pattern)
  local out = {}
  local cursor = '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for _, key in ipairs(r[2]) do
      out[#out + 1] = {key, redis.call('HGETALL', key)}
    end
  until cursor == '0'
  return out
end

return {redis.call('HGETALL', KEYS[2]), gpus, scan(ARGV[2]), scan(ARGV[3])}
