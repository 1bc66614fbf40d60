-- lib.lua is prepended to every script that changes GPU usage or reads it.
--
-- A GPU hash (gpu:<uuid>) has the fields
--   uuid node model sm   inventory, strings
--   mem                  allocatable memory, MiB
--   healthy              "1" or "0"
--   amem acp n           allocated MiB, allocated guaranteed compute percent,
--                        number of slices
--   hidx aidx            the keys of its model's healthy and available indexes
--
-- Index membership (the only place it is decided):
--   healthy index:   healthy GPUs, score = mem - amem (free MiB, may be < 0)
--   available index: healthy GPUs with acp < 100, score = free MiB

-- reindex puts the GPU stored at gkey into the indexes its state calls for:
-- the model indexes named in the hash and the all-GPU indexes allh, alla.
local function reindex(gkey, uuid, allh, alla)
  local f = redis.call('HMGET', gkey, 'mem', 'amem', 'acp', 'healthy', 'hidx', 'aidx')
  local free = tonumber(f[1]) - tonumber(f[2])
  local acp = tonumber(f[3])
  if f[4] == '1' then
    redis.call('ZADD', allh, free, uuid)
    redis.call('ZADD', f[5], free, uuid)
    if acp < 100 then
      redis.call('ZADD', alla, free, uuid)
      redis.call('ZADD', f[6], free, uuid)
    else
      redis.call('ZREM', alla, uuid)
      redis.call('ZREM', f[6], uuid)
    end
  else
    redis.call('ZREM', allh, uuid)
    redis.call('ZREM', f[5], uuid)
    redis.call('ZREM', alla, uuid)
    redis.call('ZREM', f[6], uuid)
  end
end

-- charge_gpu adds sign * (mem MiB, cp percent, one slice) to the GPU's usage
-- and reindexes it. It returns the GPU's new amem and acp.
local function charge_gpu(gkey, uuid, mem, cp, sign, allh, alla)
  local amem = redis.call('HINCRBY', gkey, 'amem', sign * mem)
  local acp = redis.call('HINCRBY', gkey, 'acp', sign * cp)
  redis.call('HINCRBY', gkey, 'n', sign)
  reindex(gkey, uuid, allh, alla)
  return amem, acp
end

-- charge_subject adds sign * (one server, mem MiB, cp percent) to a user's
-- or group's counters and deletes them when nothing is held any more.
local function charge_subject(key, mem, cp, sign)
  local n = redis.call('HINCRBY', key, 'servers', sign)
  redis.call('HINCRBY', key, 'mem', sign * mem)
  redis.call('HINCRBY', key, 'cp', sign * cp)
  if n <= 0 then
    redis.call('DEL', key)
  end
end

-- alloc_json is the stored allocation: the JSON form of allocRecord in
-- store.go. groups_json is a JSON array; mem, cp and clp are decimal strings.
local function alloc_json(id, user, groups_json, mem, cp, clp, gpu, node)
  return '{"sliceId":' .. cjson.encode(id) ..
    ',"user":' .. cjson.encode(user) ..
    ',"groups":' .. groups_json ..
    ',"memoryMiB":' .. mem ..
    ',"computePercent":' .. cp ..
    ',"computeLimitPercent":' .. clp ..
    ',"gpu":' .. cjson.encode(gpu) ..
    ',"node":' .. cjson.encode(node) .. '}'
end
