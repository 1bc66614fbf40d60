-- place.lua places one slice: quota checks, GPU choice, charging and the
-- allocation record in one atomic step.
--
-- KEYS[1] marker             (string; placement refused while absent)
-- KEYS[2] allocs             (hash slice id → allocation JSON)
-- KEYS[3] scope avail index  (zset; model index or all)
-- KEYS[4] scope healthy index
-- KEYS[5] all healthy index
-- KEYS[6] all avail index
-- KEYS[7] user counters      (hash servers/mem/cp)
-- KEYS[8..] group counters, in the order of the names in ARGV[4]
-- ARGV[1] gpu key prefix (gpu:<uuid> = ARGV[1] .. uuid)
-- ARGV[2] slice id
-- ARGV[3] user
-- ARGV[4] groups, JSON array of names (sorted)
-- ARGV[5] memory MiB, ARGV[6] compute percent, ARGV[7] compute limit percent
-- ARGV[8] policy: "binpack" or "spread"
-- ARGV[9..11] user limits: servers, mem MiB, compute percent (0 = unlimited)
-- ARGV[12..] the same three limits per group, in KEYS order
-- Returns one of
--   {"placed", allocation JSON}    a new allocation
--   {"exists", allocation JSON}    the slice id was already allocated
--   {"notready"}                   the marker is missing
--   {"quota", scope, name, resource, limit, used, want}
--   {"capacity", candidates, largest free MiB, its free compute, its node}
--                                  (candidates 0: the other fields are "")

local id = ARGV[2]
local existing = redis.call('HGET', KEYS[2], id)
if existing then
  return {'exists', existing}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'notready'}
end

local gprefix = ARGV[1]
local mem = tonumber(ARGV[5])
local cp = tonumber(ARGV[6])
local groups = cjson.decode(ARGV[4])

-- Quotas: user first, then groups in order; resources in a fixed order.
local want = {1, mem, cp}
local resources = {'servers', 'memoryMiB', 'computePercent'}
local function check(key, scope, name, argi)
  local used = redis.call('HMGET', key, 'servers', 'mem', 'cp')
  for r = 1, 3 do
    local limit = tonumber(ARGV[argi + r - 1])
    local u = tonumber(used[r] or '0')
    if limit > 0 and u + want[r] > limit then
      return {'quota', scope, name, resources[r], tostring(limit), tostring(u), tostring(want[r])}
    end
  end
  return nil
end
local refused = check(KEYS[7], 'user', ARGV[3], 9)
if refused then return refused end
for i, g in ipairs(groups) do
  refused = check(KEYS[7 + i], 'group', g, 12 + (i - 1) * 3)
  if refused then return refused end
end

-- fits reports whether the GPU has cp percent of guaranteed compute free;
-- its free memory is its index score, which the walk already bounded.
local function fits(uuid)
  local acp = tonumber(redis.call('HGET', gprefix .. uuid, 'acp'))
  return 100 - acp >= cp
end

local batch = 32

-- binpack: the fitting GPU with the least free memory; ties in uuid order
-- (a zset orders equal scores by member).
local function binpack(idx)
  local off = 0
  while true do
    local uuids = redis.call('ZRANGEBYSCORE', idx, mem, '+inf', 'LIMIT', off, batch)
    for _, uuid in ipairs(uuids) do
      if fits(uuid) then return uuid end
    end
    if #uuids < batch then return nil end
    off = off + batch
  end
end

-- spread: the fitting GPU with the most free memory; ties in uuid order.
-- It walks score levels downwards and each level upwards by member.
local function spread(idx)
  local top = redis.call('ZREVRANGEBYSCORE', idx, '+inf', mem, 'WITHSCORES', 'LIMIT', 0, 1)
  if #top == 0 then return nil end
  local level = top[2]
  while true do
    local off = 0
    while true do
      local uuids = redis.call('ZRANGEBYSCORE', idx, level, level, 'LIMIT', off, batch)
      for _, uuid in ipairs(uuids) do
        if fits(uuid) then return uuid end
      end
      if #uuids < batch then break end
      off = off + batch
    end
    local nxt = redis.call('ZREVRANGEBYSCORE', idx, '(' .. level, mem, 'WITHSCORES', 'LIMIT', 0, 1)
    if #nxt == 0 then return nil end
    level = nxt[2]
  end
end

local uuid
if ARGV[8] == 'spread' then
  uuid = spread(KEYS[3])
else
  uuid = binpack(KEYS[3])
end

if not uuid then
  local candidates = redis.call('ZCARD', KEYS[4])
  if candidates == 0 then
    return {'capacity', '0', '', '', ''}
  end
  local top = redis.call('ZREVRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  local first = redis.call('ZRANGEBYSCORE', KEYS[4], top[2], top[2], 'LIMIT', 0, 1)
  local f = redis.call('HMGET', gprefix .. first[1], 'node', 'acp')
  return {'capacity', tostring(candidates), top[2], tostring(100 - tonumber(f[2])), f[1]}
end

local gkey = gprefix .. uuid
charge_gpu(gkey, uuid, mem, cp, 1, KEYS[5], KEYS[6])
charge_subject(KEYS[7], mem, cp, 1)
for i = 1, #groups do
  charge_subject(KEYS[7 + i], mem, cp, 1)
end
local node = redis.call('HGET', gkey, 'node')
local rec = alloc_json(id, ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], uuid, node)
redis.call('HSET', KEYS[2], id, rec)
return {'placed', rec}
