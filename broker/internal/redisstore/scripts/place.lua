-- place.lua places one server on a device of its sharing mode: quota
-- checks, device choice, charging and the allocation record in one atomic
-- step. Only the indexes of the asked pool are walked, so a server never
-- lands on a device of another mode.
--
-- KEYS[1] marker             (string; placement refused while absent)
-- KEYS[2] allocs             (hash slice id → allocation JSON)
-- KEYS[3] scope avail index  (zset; the pool's, of the model or of all)
-- KEYS[4] scope full index
-- KEYS[5] usage              (hash of user and group counters)
-- KEYS[6] the asked mode's GPU set; KEYS[7..10] every mode's GPU set
--         (only counted for the capacity refusal)
-- ARGV[1] device key prefix (gpu:<uuid> = ARGV[1] .. uuid)
-- ARGV[2] slice id
-- ARGV[3] the allocation JSON up to and including the comma before the
--         slice members (recordHead in Go)
-- ARGV[4] memory MiB, ARGV[5] compute percent, ARGV[6] compute limit
--         percent (shared modes; ignored when whole)
-- ARGV[7] policy: "binpack" or "spread"
-- ARGV[8] "share" (sliced, mps: a part of a device) or "whole" (exclusive,
--         mig: one server holds the device, charged all of it)
-- ARGV[9] MPS client size "<MiB>/<percent>": a GPU takes it only if it
--         holds clients of that size or none; "" for other modes
-- ARGV[10] k, the number of quota subjects (the user, then its groups)
-- ARGV[11..10+6k] per subject: scope ("user"/"group"), name, usage field
--         (lib.lua), and its caps: servers, mem MiB, compute percent (0 = none)
-- Returns one of
--   {"placed", allocation JSON}    a new allocation
--   {"exists", allocation JSON}    the slice id was already allocated
--   {"notready"}                   the marker is missing
--   {"quota", scope, name, resource, limit, used, want}
--   {"capacity", candidates, largest free MiB, its free compute, its node,
--    GPUs in the asked mode, all GPUs}
--                                  (candidates "0": fields 2..4 are "")

local id = ARGV[2]
local existing = redis.call('HGET', KEYS[2], id)
if existing then
  return {'exists', existing}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'notready'}
end

local gprefix = ARGV[1]
local mem, cp, cl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local whole = ARGV[8] == 'whole'
local shape = ARGV[9]

-- Quotas: subjects in order (user first), resources in a fixed order.
local k = tonumber(ARGV[10])
local prefixes = {}
for i = 1, k do
  prefixes[i] = ARGV[11 + 6 * (i - 1) + 2]
end
local used = usage_load(KEYS[5], prefixes)
local resources = {'servers', 'memoryMiB', 'computePercent'}
local function over(m, c)
  local want = {1, m, c}
  for i = 1, k do
    local base = 11 + 6 * (i - 1)
    local u = used[i]
    for r = 1, 3 do
      local limit = tonumber(ARGV[base + 2 + r])
      if limit > 0 and u[r] + want[r] > limit then
        return {'quota', ARGV[base], ARGV[base + 1], resources[r], tostring(limit), tostring(u[r]), tostring(want[r])}
      end
    end
  end
  return nil
end
if not whole then
  local q = over(mem, cp)
  if q then return q end
end

-- fits loads a candidate device and keeps it in chosen if it fits: a
-- shared device needs cp percent of compute free (and, for MPS, clients of
-- the asked size or none); its free memory is its index score, which the
-- walk already bounded. Any device in a whole pool's avail index is empty.
-- Loading the whole record here saves the chosen device a second read.
local chosen
local function fits(uuid)
  local g = gpu_load(gprefix .. uuid)
  if not g then return false end
  if not whole then
    if 100 - g.acp < cp then return false end
    if shape ~= '' then
      local s = redis.call('HGET', gprefix .. uuid, 'shape')
      if s and s ~= shape then return false end
    end
  end
  chosen = g
  return true
end

-- batch is the walk's page: the first candidate usually fits, so a short
-- page builds fewer Lua strings.
local batch = 8
local lo = mem
if whole then lo = '-inf' end

-- binpack: the fitting device with the least free memory; ties in uuid
-- order (a zset orders equal scores by member).
local function binpack(idx)
  local off = 0
  while true do
    local uuids = redis.call('ZRANGEBYSCORE', idx, lo, '+inf', 'LIMIT', off, batch)
    for _, uuid in ipairs(uuids) do
      if fits(uuid) then return uuid end
    end
    if #uuids < batch then return nil end
    off = off + batch
  end
end

-- spread: the fitting device with the most free memory; ties in uuid order.
-- It walks score levels downwards and each level upwards by member.
local function spread(idx)
  local top = redis.call('ZREVRANGEBYSCORE', idx, '+inf', lo, 'WITHSCORES', 'LIMIT', 0, 1)
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
    local nxt = redis.call('ZREVRANGEBYSCORE', idx, '(' .. level, lo, 'WITHSCORES', 'LIMIT', 0, 1)
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
if ARGV[7] == 'spread' then
  uuid = spread(KEYS[3])
else
  uuid = binpack(KEYS[3])
end

if not uuid then
  local modes = tostring(redis.call('SCARD', KEYS[6]))
  local all = 0
  for i = 7, 10 do
    all = all + redis.call('SCARD', KEYS[i])
  end
  local candidates = redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
  if candidates == 0 then
    return {'capacity', '0', '', '', '', modes, tostring(all)}
  end
  local free, best = largest(KEYS[3])
  local ffree, fbest = largest(KEYS[4])
  if ffree and (not free or ffree > free or (ffree == free and fbest < best)) then
    free, best = ffree, fbest
  end
  local f = redis.call('HMGET', gprefix .. best, 'node', 'acp')
  return {'capacity', tostring(candidates), tostring(free), tostring(100 - tonumber(f[2])), f[1], modes, tostring(all)}
end

local gkey = gprefix .. uuid
local g = chosen
if whole then
  mem, cp, cl = g.mem, g.cpw, g.cpw
  local q = over(mem, cp)
  if q then return q end
end
gpu_charge(gkey, g, uuid, mem, cp, 1)
if shape ~= '' then
  redis.call('HSET', gkey, 'shape', shape)
end
usage_charge(KEYS[5], prefixes, used, mem, cp, 1)
local rec = ARGV[3] .. slice_members(mem, cp, cl) .. g.ref .. ',"sharing":"' .. g.mode .. '"}'
redis.call('HSET', KEYS[2], id, rec)
return {'placed', rec}
