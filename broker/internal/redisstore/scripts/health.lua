-- health.lua sets a registered GPU's health and reindexes it.
--
-- KEYS[1] gpu key, KEYS[2] all avail index, KEYS[3] all full index
-- ARGV[1] uuid, ARGV[2] healthy "1"/"0"
-- Returns 1 when set, 0 when the GPU is not registered.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'healthy', ARGV[2])
gpu_index(gpu_load(KEYS[1]), ARGV[1], 'any', KEYS[2], KEYS[3])
return 1
