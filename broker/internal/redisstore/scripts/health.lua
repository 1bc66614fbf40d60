-- health.lua sets a registered device's health and reindexes it.
--
-- KEYS[1] device key
-- ARGV[1] uuid, ARGV[2] healthy "1"/"0"
-- Returns 1 when set, 0 when the device is not registered.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'healthy', ARGV[2])
gpu_index(gpu_load(KEYS[1]), ARGV[1], 'any')
return 1
