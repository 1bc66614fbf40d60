-- register.lua upserts a GPU's inventory and keeps its usage counters.
--
-- KEYS[1] gpu key, KEYS[2] gpus set
-- KEYS[3] all avail index, KEYS[4] all full index
-- KEYS[5] model avail index, KEYS[6] model full index
-- ARGV[1] uuid, ARGV[2] node, ARGV[3] model, ARGV[4] memory MiB,
-- ARGV[5] SM count, ARGV[6] healthy "1"/"0"
-- ARGV[7] the ref fragment of allocation records on this GPU (lib.lua)
-- Returns 1 when the GPU is new, 0 when it was updated.

local old = redis.call('HMGET', KEYS[1], 'aidx', 'fidx')
if old[1] and old[1] ~= KEYS[5] then
  -- The model changed: leave the old model's indexes.
  redis.call('ZREM', old[1], ARGV[1])
  redis.call('ZREM', old[2], ARGV[1])
end
redis.call('HSET', KEYS[1], 'uuid', ARGV[1], 'node', ARGV[2], 'model', ARGV[3],
  'mem', ARGV[4], 'sm', ARGV[5], 'healthy', ARGV[6], 'aidx', KEYS[5], 'fidx', KEYS[6], 'ref', ARGV[7])
redis.call('HSETNX', KEYS[1], 'amem', 0)
redis.call('HSETNX', KEYS[1], 'acp', 0)
redis.call('HSETNX', KEYS[1], 'n', 0)
gpu_index(gpu_load(KEYS[1]), ARGV[1], 'any', KEYS[3], KEYS[4])
return redis.call('SADD', KEYS[2], ARGV[1])
