-- restore.lua records an allocation that a pod proves exists, without
-- quota or capacity refusal, charging the GPU, user and groups.
--
-- KEYS[1] allocs, KEYS[2] gpu key
-- KEYS[3] all healthy index, KEYS[4] all avail index
-- KEYS[5] user counters, KEYS[6..] group counters in ARGV[3] order
-- ARGV[1] slice id, ARGV[2] user, ARGV[3] groups JSON array,
-- ARGV[4] memory MiB, ARGV[5] compute percent, ARGV[6] compute limit percent,
-- ARGV[7] gpu uuid, ARGV[8] node ("" = the GPU's node)
-- Returns one of
--   {"restored", allocation JSON}
--   {"overcommit", allocation JSON, allocated MiB, memory MiB, allocated compute}
--                            recorded, but the GPU is now overcommitted
--   {"exists", allocation JSON}   an allocation with this id is stored
--   {"nogpu"}                     the GPU is not registered

local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then
  return {'exists', existing}
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  return {'nogpu'}
end
local mem = tonumber(ARGV[4])
local cp = tonumber(ARGV[5])
local amem, acp = charge_gpu(KEYS[2], ARGV[7], mem, cp, 1, KEYS[3], KEYS[4])
charge_subject(KEYS[5], mem, cp, 1)
local groups = cjson.decode(ARGV[3])
for i = 1, #groups do
  charge_subject(KEYS[5 + i], mem, cp, 1)
end
local node = ARGV[8]
if node == '' then
  node = redis.call('HGET', KEYS[2], 'node')
end
local rec = alloc_json(ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], node)
redis.call('HSET', KEYS[1], ARGV[1], rec)
local total = tonumber(redis.call('HGET', KEYS[2], 'mem'))
if amem > total or acp > 100 then
  return {'overcommit', rec, tostring(amem), tostring(total), tostring(acp)}
end
return {'restored', rec}
