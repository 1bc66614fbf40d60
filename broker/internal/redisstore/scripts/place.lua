-- place.lua places one slice: quota checks, GPU choice, charging and the
-- allocation record in one atomic step.
--
-- KEYS[1] marker             (string; placement refused while absent)
-- KEYS[2] allocs             (hash slice id → allocation JSON)
-- KEYS[3] scope avail index  (zset; the model's or all GPUs')
-- KEYS[4] scope full index
-- KEYS[5] all avail index, KEYS[6] all full index
-- KEYS[7] usage              (hash of user and group counters)
-- ARGV[1] gpu key prefix (gpu:<uuid> = ARGV[1] .. uuid)
-- ARGV[2] slice id
-- ARGV[3] the allocation JSON up to and including the comma before the
--         GPU's ref (see lib.lua)
-- ARGV[4] memory MiB, ARGV[5] compute percent
-- ARGV[6] policy: "binpack" or "spread"
-- ARGV[7] k, the number of quota subjects (the user, then its groups)
-- ARGV[8..7+6k] per subject: scope ("user"/"group"), name, usage field
--         (lib.lua), and its caps: servers, mem MiB, compute percent (0 = none)
-- Returns one of
--   {"placed", allocation JSON}    a new allocation
--   {"exists", allocation JSON}    the slice id was already allocated
--   {"notready"}                   the marker is missing
--   {"quota", scope, name, resource, limit, used, want}
--   {"capacity", candidates, largest free MiB, its free compute, its node}
--                                  (candidates "0": the other fields are "")

local id = ARGV[2]
local existing = redis.call('HGET', KEYS[2], id)
if existing then
  return {'exists', existing}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'notready'}
end

local gprefix = ARGV[1]
local mem = tonumber(ARGV[4])
local cp = tonumber(ARGV[5])

-- Quotas: subjects in order (user first), resources in a fixed order.
local k = tonumber(ARGV[7])
local prefixes = {}
for i = 1, k do
  prefixes[i] = ARGV[8 + 6 * (i - 1) + 2]
end
local used = usage_load(KEYS[7], prefixes)
local resources = {'servers', 'memoryMiB', 'computePercent'}
local want = {1, mem, cp}
for i = 1, k do
  local base = 8 + 6 * (i - 1)
  local u = used[i]
  for r = 1, 3 do
    local limit = tonumber(ARGV[base + 2 + r])
    if limit > 0 and u[r] + want[r] > limit then
      return {'quota', ARGV[base], ARGV[base + 1], resources[r], tostring(limit), tostring(u[r]), tostring(want[r])}
    end
  end
end

-- fits loads a candidate GPU and keeps it in chosen if it has cp percent
-- of guaranteed compute free; its free memory is its index score, which the
-- walk already bounded. Loading the whole record here saves the chosen
-- GPU a second read.
local chosen
local function fits(uuid)
  local g = gpu_load(gprefix .. uuid)
  if g and 100 - g.acp >= cp then
    chosen = g
    return true
  end
  return false
end

-- batch is the walk's page: the first candidate usually fits, so a short
-- page builds fewer Lua strings.
local batch = 8

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

-- largest returns the score and smallest member at the top of idx, or nil.
local function largest(idx)
  local top = redis.call('ZREVRANGEBYSCORE', idx, '+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #top == 0 then return nil end
  local first = redis.call('ZRANGEBYSCORE', idx, top[2], top[2], 'LIMIT', 0, 1)
  return tonumber(top[2]), first[1]
end

local uuid
if ARGV[6] == 'spread' then
  uuid = spread(KEYS[3])
else
  uuid = binpack(KEYS[3])
end

if not uuid then
  local candidates = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
  if candidates == 0 then
    return {'capacity', '0', '', '', ''}
  end
  local free, best = largest(KEYS[3])
  local ffree, fbest = largest(KEYS[4])
  if ffree and (not free or ffree > free or (ffree == free and fbest < best)) then
    free, best = ffree, fbest
  end
  local f = redis.call('HMGET', gprefix .. best, 'node', 'acp')
  return {'capacity', tostring(candidates), tostring(free), tostring(100 - tonumber(f[2])), f[1]}
end

local gkey = gprefix .. uuid
local g = chosen
gpu_charge(gkey, g, uuid, mem, cp, 1, KEYS[5], KEYS[6])
usage_charge(KEYS[7], prefixes, used, mem, cp, 1)
local rec = ARGV[3] .. g.ref .. '}'
redis.call('HSET', KEYS[2], id, rec)
return {'placed', rec}
