-- lib.lua is prepended to every script that changes GPU usage or modes,
-- after libConsts (scripts.go), which defines USER_FIELD and GROUP_FIELD
-- (the usage field prefixes "u:" and "g:"), USAGE_FORMAT (the struct
-- format of a usage field's value) and ALL_MODES (every sharing mode,
-- space-separated).
--
-- A device hash (gpu:<uuid>: a physical GPU, or a MIG instance "MIG-…") has
-- the fields
--   uuid node model sm   inventory, strings
--   mem                  allocatable memory, MiB
--   healthy              "1" or "0"
--   use                  the allocations' counters in USAGE_FORMAT (16 bytes,
--                        as a usage field: allocations int32, allocated MiB
--                        int64, allocated compute percent int32,
--                        little-endian; gpu_counters, Go's decodeGPU): one
--                        field, so the walk reads, and a charge writes, one
--                        value. Builds before it kept three decimal fields
--                        amem acp n; those are read while use is absent,
--                        and at the device's next charge or registration
--                        use is written and they are set to "use"
--                        (gpu_store): no number, so an earlier build still
--                        running during a rolling upgrade fails its script
--                        on that device (Lua arithmetic on nil) instead of
--                        reading 0 and overcommitting it, and its
--                        registration's HSETNX amem 0 leaves them alone
--   mode                 sharing mode in force: sliced, exclusive, mig, mps
--   lmode amode pmode    the mode the reporter (node label) asks for, the
--                        admin's ("" for none), and a wanted mode that waits
--                        for the device to hold nothing (absent when none)
--   pool                 placement pool: the mode, "mig:<profile>" for a MIG
--                        instance, "" for a GPU in MIG mode (its instances
--                        are placed, not it)
--   whole                "1": held whole by one server (exclusive GPUs, MIG
--                        instances); "0": shared (sliced, mps)
--   cpw                  compute percent charged when held whole: 100, or
--                        a MIG instance's share of its GPU's SMs
--   parent migp          a MIG instance's GPU and MIG profile
--   shape                an MPS GPU's client size "<MiB>/<percent>" while it
--                        holds clients (all MPS clients of a GPU are alike)
--   alla allf aidx fidx  the keys of its pool's all-model and model indexes
--                        (absent when pool is "")
--   ref                  the JSON members "gpu":…,"node":…,"model":…[,…]
--                        that follow the slice members of an allocation
--                        record on this device (built in Go)
--
-- Every healthy device with a pool is in exactly one class of its pool,
-- with score = free MiB (mem - amem, < 0 when overcommitted), in its model
-- index and the all-model index of that class:
--   avail ("a"): shared with acp < 100, or whole and empty (n = 0)
--   full  ("f"): the rest, only counted for capacity errors
-- An unhealthy device, and a GPU in MIG mode, is in no index. Each physical
-- GPU is in the set mode:<mode> of its mode; MIG instances are in none.

-- usage_pack(USAGE_FORMAT, servers, mem, cp) and usage_unpack(USAGE_FORMAT,
-- value) are Redis's struct.pack and struct.unpack. miniredis (the
-- embedded Redis of dev mode) has no struct library; there they are the
-- same little-endian encoding in plain Lua (slow, and only for this one
-- format).
local usage_pack, usage_unpack
local struct_lib = rawget(_G, 'struct')
if struct_lib then
  usage_pack, usage_unpack = struct_lib.pack, struct_lib.unpack
else
  local function le(n, bytes)
    local out = {}
    for i = 1, bytes do
      out[i] = string.char(n % 256)
      n = math.floor(n / 256)
    end
    return table.concat(out)
  end
  local function from_le(x, at, bytes)
    local n = 0
    for i = at + bytes - 1, at, -1 do
      n = n * 256 + string.byte(x, i)
    end
    return n
  end
  usage_pack = function(_, s, m, c)
    return le(s % 4294967296, 4) .. le(m % 4294967296, 4) .. le(math.floor(m / 4294967296) % 4294967296, 4) .. le(c % 4294967296, 4)
  end
  usage_unpack = function(_, x)
    local function signed(n, bits)
      if n >= 2 ^ (bits - 1) then return n - 2 ^ bits end
      return n
    end
    local hi = signed(from_le(x, 9, 4), 32)
    return signed(from_le(x, 1, 4), 32), hi * 4294967296 + from_le(x, 5, 4), signed(from_le(x, 13, 4), 32)
  end
end

-- gpu_counters decodes a device's counters from the value x of its use
-- field: allocated MiB, allocated compute percent, allocations, and false.
-- A device that an earlier build wrote has no use field (x nil): its
-- decimal fields amem acp n are read instead (absent: 0, a device never
-- charged), and the last result is true (legacy: gpu_store writes use
-- and marks them). Decimal fields that are no numbers (marked "use", the
-- use field itself gone) raise an error.
-- A use value of another length raises an error, so scripts read devices
-- before they write anything.
local function gpu_counters(gkey, x)
  if x then
    if #x ~= 16 then
      error('device ' .. gkey .. ' field use is not 16 bytes of counters (allocations int32, MiB int64, compute percent int32)')
    end
    local n, m, c = usage_unpack(USAGE_FORMAT, x)
    return m, c, n, false
  end
  local f = redis.call('HMGET', gkey, 'amem', 'acp', 'n')
  local m, c, n = tonumber(f[1] or '0'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
  if not (m and c and n) then
    error('device ' .. gkey .. ' has no use field and its decimal counters amem acp n are not numbers')
  end
  return m, c, n, true
end

-- gpu_store writes a loaded device's counters into its use field, with
-- the further field-value pairs given (one HSET). When g was read from an
-- earlier build's decimal fields (or the device is new), it also sets
-- those to "use" (see the field list above: an earlier build must not
-- read them as numbers).
local function gpu_store(gkey, g, ...)
  local use = usage_pack(USAGE_FORMAT, g.n, g.amem, g.acp)
  if g.legacy then
    redis.call('HSET', gkey, 'use', use, 'amem', 'use', 'acp', 'use', 'n', 'use', ...)
    g.legacy = false
  else
    redis.call('HSET', gkey, 'use', use, ...)
  end
end

-- gpu_load reads the fields placement needs; nil if the device is unknown.
local function gpu_load(gkey)
  local f = redis.call('HMGET', gkey, 'mem', 'use', 'healthy', 'aidx', 'fidx', 'ref',
    'alla', 'allf', 'whole', 'mode', 'cpw', 'model')
  if not f[1] then
    return nil
  end
  local amem, acp, n, legacy = gpu_counters(gkey, f[2])
  return {mem = tonumber(f[1]), amem = amem, acp = acp, n = n, legacy = legacy,
    healthy = f[3] == '1', aidx = f[4], fidx = f[5], ref = f[6], alla = f[7], allf = f[8],
    whole = f[9] == '1', mode = f[10] or 'sliced', cpw = tonumber(f[11] or '100'), model = f[12] or ''}
end

-- gpu_load_release reads what gpu_charge needs to un-charge a device:
-- counters, health, whole and the indexes of its current class; nil if the
-- device is unknown. Each field read costs Redis about two thirds of a
-- whole call (measured on Redis 7.0: an HMGET field 0.2-0.25 µs, an HGET
-- call 0.35 µs, each index key also a ~50-byte Lua string), so the
-- indexes of the other class are read only when the release
-- moves the device there (a full device that gets room), in a second HMGET;
-- wholeHint (the record says exclusive or mig: a whole device, which every
-- release empties) reads all four in the first.
local function gpu_load_release(gkey, wholeHint)
  local f
  if wholeHint then
    f = redis.call('HMGET', gkey, 'mem', 'use', 'healthy', 'whole', 'alla', 'aidx', 'allf', 'fidx')
  else
    f = redis.call('HMGET', gkey, 'mem', 'use', 'healthy', 'whole', 'alla', 'aidx')
  end
  if not f[1] then
    return nil
  end
  local amem, acp, n, legacy = gpu_counters(gkey, f[2])
  local g = {mem = tonumber(f[1]), amem = amem, acp = acp, n = n, legacy = legacy,
    healthy = f[3] == '1', whole = f[4] == '1', alla = f[5], aidx = f[6], allf = f[7], fidx = f[8]}
  if not wholeHint and g.alla and g.healthy and (g.whole or g.acp >= 100) then
    local x = redis.call('HMGET', gkey, 'allf', 'fidx')
    g.allf, g.fidx = x[1], x[2]
  end
  return g
end

-- gpu_class is the index class of a loaded device: 'a', 'f' or nil.
local function gpu_class(g)
  if not g.healthy or not g.alla then
    return nil
  end
  if g.whole then
    if g.n == 0 then return 'a' end
    return 'f'
  end
  if g.acp < 100 then
    return 'a'
  end
  return 'f'
end

-- gpu_index moves device uuid into the indexes of its class with its
-- current free memory. was is its previous class, or 'any' when unknown
-- (then it is removed from the indexes of the other class).
local function gpu_index(g, uuid, was)
  local cls = gpu_class(g)
  if g.alla and was ~= cls then
    if was == 'a' or (was == 'any' and cls ~= 'a') then
      redis.call('ZREM', g.alla, uuid)
      redis.call('ZREM', g.aidx, uuid)
    end
    if was == 'f' or (was == 'any' and cls ~= 'f') then
      redis.call('ZREM', g.allf, uuid)
      redis.call('ZREM', g.fidx, uuid)
    end
  end
  local free = tostring(g.mem - g.amem) -- once, not per ZADD
  if cls == 'a' then
    redis.call('ZADD', g.alla, free, uuid)
    redis.call('ZADD', g.aidx, free, uuid)
  elseif cls == 'f' then
    redis.call('ZADD', g.allf, free, uuid)
    redis.call('ZADD', g.fidx, free, uuid)
  end
end

-- gpu_charge adds sign * (mem MiB, cp percent, one allocation) to a loaded
-- device, stores the counters (and shape, an MPS client size, when given)
-- and reindexes it. An MPS GPU that holds nothing any more forgets its
-- client size. g needs the counters (and legacy, gpu_counters), health,
-- whole and the index keys of the classes it leaves and enters
-- (gpu_index).
local function gpu_charge(gkey, g, uuid, mem, cp, sign, shape)
  local was = gpu_class(g)
  g.amem = g.amem + sign * mem
  g.acp = g.acp + sign * cp
  g.n = g.n + sign
  if shape then
    gpu_store(gkey, g, 'shape', shape)
  else
    gpu_store(gkey, g)
  end
  if g.n <= 0 then
    redis.call('HDEL', gkey, 'shape')
  end
  gpu_index(g, uuid, was)
end

-- gpu_set_pool puts a loaded device into mode (and pool, "" for none) with
-- the index keys of that pool and its model, built from the index prefix
-- ip (redisschema.Keys.IndexPrefix) as Go builds them; it leaves the
-- indexes and mode set it was in. mp is the mode-set prefix; physical is
-- false for a MIG instance (in no mode set). whole says how the device is
-- held. It reindexes the device.
local function gpu_set_pool(gkey, g, uuid, ip, mp, physical, mode, pool, whole)
  local old = {g.alla, g.allf, g.aidx, g.fidx}
  local new = {false, false, false, false}
  if pool ~= '' then
    new = {ip .. pool .. ':a:all', ip .. pool .. ':f:all', ip .. pool .. ':a:m:' .. g.model,
      ip .. pool .. ':f:m:' .. g.model}
  end
  for i = 1, 4 do
    if old[i] and old[i] ~= new[i] then
      redis.call('ZREM', old[i], uuid)
    end
  end
  if physical and g.mode ~= mode then
    redis.call('SREM', mp .. g.mode, uuid)
  end
  if physical then
    redis.call('SADD', mp .. mode, uuid)
  end
  g.mode, g.whole = mode, whole
  g.alla, g.allf, g.aidx, g.fidx = new[1], new[2], new[3], new[4]
  redis.call('HSET', gkey, 'mode', mode, 'pool', pool, 'whole', whole and '1' or '0')
  if pool ~= '' then
    redis.call('HSET', gkey, 'alla', new[1], 'allf', new[2], 'aidx', new[3], 'fidx', new[4])
  else
    redis.call('HDEL', gkey, 'alla', 'allf', 'aidx', 'fidx')
  end
  gpu_index(g, uuid, 'any')
end

-- slice_members is the JSON of an allocation's slice, with the trailing
-- comma before the device's ref.
local function slice_members(mem, cp, cl)
  return string.format('"memoryMiB":%d,"computePercent":%d,"computeLimitPercent":%d,', mem, cp, cl)
end

-- usage_load reads the counters of subjects (users and groups) from the
-- usage hash ukey: one field per subject, its field name ("u:<user>",
-- "g:<group>", see keys.go), holding USAGE_FORMAT: 16 bytes, servers
-- (int32), MiB (int64) and compute percent (int32), little-endian
-- (usage_pack; Go's parseUsage); the decimal text of earlier builds is
-- read too, and written back binary. One field per subject keeps the hash
-- small and every subject one lookup; binary counters cost one C call to
-- read and one to write, where decimal text cost a pattern match, three
-- strtod and a format per subject (about a twentieth of a place or
-- release). It returns one {servers, mem, cp} per field, zeros when
-- absent; a malformed field raises an error, so scripts load usage before
-- they write anything.
local function usage_load(ukey, fields)
  local v = redis.call('HMGET', ukey, unpack(fields))
  local out = {}
  for i = 1, #fields do
    local x = v[i]
    local top = x and #x == 16 and string.byte(x, 12)
    if not x then
      out[i] = {0, 0, 0}
    elseif top == 0 or top == 255 then
      local s, m, c = usage_unpack(USAGE_FORMAT, x)
      out[i] = {s, m, c}
    else
      -- The decimal text "<servers> <MiB> <compute percent>" of builds
      -- before the binary counters (none of its bytes is 0 or 255, which
      -- the top byte of any MiB count below 2^56 is): read here, stored
      -- binary by usage_store.
      local s, m, c = string.match(x, '^(%-?%d+) (%-?%d+) (%-?%d+)$')
      if not s then
        error('usage field ' .. fields[i] .. ' is not 16 bytes of counters (servers int32, MiB int64, compute percent int32)')
      end
      out[i] = {tonumber(s), tonumber(m), tonumber(c)}
    end
  end
  return out
end

-- usage_store writes the loaded counters back in one HSET; a subject that
-- holds no server any more has its field deleted.
local function usage_store(ukey, fields, used)
  local set, del = {}, {}
  for i, f in ipairs(fields) do
    local u = used[i]
    if u[1] <= 0 then
      del[#del + 1] = f
    else
      set[#set + 1] = f
      set[#set + 1] = usage_pack(USAGE_FORMAT, u[1], u[2], u[3])
    end
  end
  if #set > 0 then
    redis.call('HSET', ukey, unpack(set))
  end
  if #del > 0 then
    redis.call('HDEL', ukey, unpack(del))
  end
end

-- usage_charge adds sign * (one server, mem MiB, cp percent) to each loaded
-- subject and stores them.
local function usage_charge(ukey, fields, used, mem, cp, sign)
  for _, u in ipairs(used) do
    u[1] = u[1] + sign
    u[2] = u[2] + sign * mem
    u[3] = u[3] + sign * cp
  end
  usage_store(ukey, fields, used)
end
