-- register.lua upserts a device's inventory and mode and keeps its usage
-- counters. A mode change (node label, MIG switched on or off) takes
-- effect only while the device holds nothing; until then it is pending
-- (pmode).
--
-- KEYS[1] device key, KEYS[2] gpus set
-- ARGV[1] uuid, ARGV[2] node, ARGV[3] model, ARGV[4] memory MiB,
-- ARGV[5] SM count, ARGV[6] healthy "1"/"0"
-- ARGV[7] the ref fragment of allocation records on this device (lib.lua)
-- ARGV[8] index prefix, ARGV[9] mode-set prefix
-- ARGV[10] the reported mode: "" (no opinion), sliced, exclusive, mps, or
--          mig (a GPU whose MIG mode is on, or one of its instances)
-- ARGV[11] MIG profile and ARGV[12] parent uuid of a MIG instance ("" else)
-- ARGV[13] compute percent a MIG instance is charged (its SM share)
-- Returns 1 when the device is new, 0 when it was updated.

local gkey, uuid = KEYS[1], ARGV[1]
-- Unreadable counters raise here, before anything is written.
gpu_counters(gkey, redis.call('HGET', gkey, 'use'))
local cur = redis.call('HMGET', gkey, 'mode', 'amode')
local instance = ARGV[12] ~= ''
local mode = cur[1] or 'sliced'
local want
if ARGV[10] == 'mig' then
  want = 'mig' -- the hardware's word
else
  local keep = mode
  if keep == 'mig' then
    keep = 'sliced' -- MIG was switched off (a GPU reset): follow the labels
  end
  local amode = cur[2] or ''
  want = (amode ~= '' and amode) or (ARGV[10] ~= '' and ARGV[10]) or keep
end

redis.call('HSET', gkey, 'uuid', uuid, 'node', ARGV[2], 'model', ARGV[3], 'mem', ARGV[4], 'sm', ARGV[5],
  'healthy', ARGV[6], 'ref', ARGV[7], 'lmode', ARGV[10], 'cpw', instance and ARGV[13] or '100')
if instance then
  redis.call('HSET', gkey, 'parent', ARGV[12], 'migp', ARGV[11])
else
  redis.call('HDEL', gkey, 'parent', 'migp')
end
local g = gpu_load(gkey)
if g.legacy then
  -- A new device (counters 0) or one an earlier build wrote: store its
  -- counters in the use field (lib.lua).
  gpu_store(gkey, g)
end
if want ~= mode then
  if g.n == 0 then
    mode = want
    redis.call('HDEL', gkey, 'pmode')
  else
    redis.call('HSET', gkey, 'pmode', want)
  end
else
  redis.call('HDEL', gkey, 'pmode')
end
local pool = mode
if mode == 'mig' then
  pool = instance and ('mig:' .. ARGV[11]) or ''
end
gpu_set_pool(gkey, g, uuid, ARGV[8], ARGV[9], not instance, mode, pool, instance or mode == 'exclusive')
return redis.call('SADD', KEYS[2], uuid)
