-- lib.lua is prepended to every script that changes GPU usage.
--
-- A GPU hash (gpu:<uuid>) has the fields
--   uuid node model sm   inventory, strings
--   mem                  allocatable memory, MiB
--   healthy              "1" or "0"
--   amem acp n           allocated MiB, allocated guaranteed compute percent,
--                        number of slices
--   aidx fidx            the keys of its model's avail and full indexes
--   ref                  the JSON members "gpu":…,"node":…,"model":… that end an
--                        allocation record on this GPU (built in Go)
--
-- Every healthy GPU is in exactly one class, with score = free MiB
-- (mem - amem, < 0 when overcommitted), in its model's index and the
-- all-GPU index of that class:
--   avail ("a"): acp < 100, placement walks these
--   full  ("f"): acp >= 100, only counted for capacity errors
-- An unhealthy GPU is in no index.

-- gpu_load reads the fields placement needs; nil if the GPU is unknown.
local function gpu_load(gkey)
  local f = redis.call('HMGET', gkey, 'mem', 'amem', 'acp', 'n', 'healthy', 'aidx', 'fidx', 'ref')
  if not f[1] then
    return nil
  end
  return {mem = tonumber(f[1]), amem = tonumber(f[2]), acp = tonumber(f[3]), n = tonumber(f[4]),
    healthy = f[5] == '1', aidx = f[6], fidx = f[7], ref = f[8]}
end

-- gpu_class is the index class of a loaded GPU: 'a', 'f' or nil.
local function gpu_class(g)
  if not g.healthy then
    return nil
  end
  if g.acp < 100 then
    return 'a'
  end
  return 'f'
end

-- gpu_index moves GPU uuid into the indexes of its class with its current
-- free memory. was is its previous class, or 'any' when unknown (then it is
-- removed from every index of the other class). alla and allf are the
-- all-GPU avail and full indexes.
local function gpu_index(g, uuid, was, alla, allf)
  local cls = gpu_class(g)
  if was ~= cls then
    if was == 'a' or (was == 'any' and cls ~= 'a') then
      redis.call('ZREM', alla, uuid)
      redis.call('ZREM', g.aidx, uuid)
    end
    if was == 'f' or (was == 'any' and cls ~= 'f') then
      redis.call('ZREM', allf, uuid)
      redis.call('ZREM', g.fidx, uuid)
    end
  end
  local free = g.mem - g.amem
  if cls == 'a' then
    redis.call('ZADD', alla, free, uuid)
    redis.call('ZADD', g.aidx, free, uuid)
  elseif cls == 'f' then
    redis.call('ZADD', allf, free, uuid)
    redis.call('ZADD', g.fidx, free, uuid)
  end
end

-- gpu_charge adds sign * (mem MiB, cp percent, one slice) to a loaded GPU,
-- stores the counters and reindexes it.
local function gpu_charge(gkey, g, uuid, mem, cp, sign, alla, allf)
  local was = gpu_class(g)
  g.amem = g.amem + sign * mem
  g.acp = g.acp + sign * cp
  g.n = g.n + sign
  redis.call('HSET', gkey, 'amem', g.amem, 'acp', g.acp, 'n', g.n)
  gpu_index(g, uuid, was, alla, allf)
end

-- usage_load reads the counters of subjects (users and groups) from the
-- usage hash ukey: one field per subject, its field name ("u:<user>",
-- "g:<group>", see keys.go), holding "<servers> <MiB> <compute percent>"
-- (decimal integers, one space apart). One field per subject keeps the
-- hash small and every subject one lookup. It returns one {servers, mem,
-- cp} per field, zeros when absent; a malformed field raises an error, so
-- scripts load usage before they write anything.
local function usage_load(ukey, fields)
  local v = redis.call('HMGET', ukey, unpack(fields))
  local out = {}
  for i = 1, #fields do
    local s, m, c = string.match(v[i] or '0 0 0', '^(%-?%d+) (%-?%d+) (%-?%d+)$')
    if not s then
      error('usage field ' .. fields[i] .. ' is not "<servers> <MiB> <compute percent>"')
    end
    out[i] = {tonumber(s), tonumber(m), tonumber(c)}
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
      set[#set + 1] = string.format('%d %d %d', u[1], u[2], u[3])
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
