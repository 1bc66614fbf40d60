-- set_mode.lua sets the sharing mode an admin asks for on one GPU, which
-- takes effect at once; it is refused while the GPU holds anything.
--
-- KEYS[1] device key
-- ARGV[1] uuid, ARGV[2] index prefix, ARGV[3] mode-set prefix
-- ARGV[4] the mode: sliced, exclusive or mps, or "" to follow the node's
--         label again
-- Returns one of
--   {"set", mode}           the mode in force now
--   {"nogpu"}               the device is not registered
--   {"mig"}                 the device is in MIG mode or is a MIG instance
--   {"busy", n, mode}       it holds n allocations in mode; nothing changed

local gkey, uuid = KEYS[1], ARGV[1]
local f = redis.call('HMGET', gkey, 'mode', 'lmode', 'parent', 'uuid')
if not f[4] then
  return {'nogpu'}
end
local g = gpu_load(gkey)
if g.mode == 'mig' or f[3] then
  return {'mig'}
end
local want = ARGV[4]
if want == '' then
  want = (f[2] and f[2] ~= '' and f[2]) or 'sliced'
end
if want ~= g.mode and g.n > 0 then
  return {'busy', tostring(g.n), g.mode}
end
redis.call('HSET', gkey, 'amode', ARGV[4])
redis.call('HDEL', gkey, 'pmode')
if want ~= g.mode then
  gpu_set_pool(gkey, g, uuid, ARGV[2], ARGV[3], true, want, want, want == 'exclusive')
end
return {'set', want}
