-- health.lua sets a registered device's health and reindexes it.
--
-- KEYS[1] device key
-- ARGV[1] uuid, ARGV[2] healthy "1"/"0"
-- Returns 1 when set, 0 when the device is not registered.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
-- Read (gpu_load raises on unreadable counters) before anything is written.
local g = gpu_load(KEYS[1])
redis.call('HSET', KEYS[1], 'healthy', ARGV[2])
g.healthy = ARGV[2] == '1'
gpu_index(g, ARGV[1], 'any')
return 1
