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
-- ARGV[10] the scope of KEYS[3..4]: "all" (the pool's all-model indexes)
--         or "model" (one model's)
-- ARGV[11] mode-set prefix (mode:<mode> = ARGV[11] .. mode), ARGV[12] the
--         asked mode; the GPU sets of the asked mode and of every mode
--         (ALL_MODES, libConsts in scripts.go) are counted only for the capacity refusal,
--         so their keys are built here (same hash tag) rather than passed
--         as keys on every call
-- ARGV[13] k, the number of quota subjects: the user, then its groups
--         (usage fields USER_FIELD .. name and GROUP_FIELD .. name)
-- ARGV[14..13+4k] per subject: name and its caps: servers, mem MiB,
--         compute percent (0 = none)
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
local k = tonumber(ARGV[13])
local prefixes = {USER_FIELD .. ARGV[14]}
for i = 2, k do
  prefixes[i] = GROUP_FIELD .. ARGV[14 + 4 * (i - 1)]
end
local used = usage_load(KEYS[5], prefixes)
local resources = {'servers', 'memoryMiB', 'computePercent'}
local function over(m, c)
  local want = {1, m, c}
  for i = 1, k do
    local base = 14 + 4 * (i - 1)
    local u = used[i]
    for r = 1, 3 do
      local cap = ARGV[base + r]
      local limit = cap ~= '0' and tonumber(cap)
      if limit and limit > 0 and u[r] + want[r] > limit then
        local scope = 'group'
        if i == 1 then scope = 'user' end
        return {'quota', scope, ARGV[base], resources[r], tostring(limit), tostring(u[r]), tostring(want[r])}
      end
    end
  end
  return nil
end
if not whole then
  local q = over(mem, cp)
  if q then return q end
end

-- fits reads a candidate device and keeps it in chosen if it fits: a
-- shared device needs cp percent of compute free (and, for MPS, clients of
-- the asked size or none); its free memory is its index score, which the
-- walk already bounded. Any device in a whole pool's avail index is empty.
-- It reads only the fields the charge needs (one HMGET, a few reply
-- elements: each costs Redis about as much as a whole call): the counters,
-- the ref, the index of the other scope (all-model or model) of the avail
-- class, and per kind the charge of a whole device with its full-class
-- indexes, or an MPS GPU's client size. A device in an index is healthy
-- and of the pool's mode and kind (lib.lua), so neither is read.
local chosen
local byModel = ARGV[10] == 'model'
local other, otherFull = 'aidx', 'fidx'
if byModel then other, otherFull = 'alla', 'allf' end
local function fits(uuid)
  local gkey = gprefix .. uuid
  local f
  if whole then
    f = redis.call('HMGET', gkey, 'mem', 'amem', 'acp', 'n', 'ref', other, 'cpw', otherFull)
  elseif shape ~= '' then
    f = redis.call('HMGET', gkey, 'mem', 'amem', 'acp', 'n', 'ref', other, 'shape')
  else
    f = redis.call('HMGET', gkey, 'mem', 'amem', 'acp', 'n', 'ref', other)
  end
  if not f[1] then return false end
  local g = {mem = tonumber(f[1]), amem = tonumber(f[2]), acp = tonumber(f[3]), n = tonumber(f[4]),
    ref = f[5], healthy = true, whole = whole, mode = ARGV[12]}
  local full = nil
  if whole then
    g.cpw, full = tonumber(f[7] or '100'), f[8]
  else
    if 100 - g.acp < cp then return false end
    if shape ~= '' and f[7] and f[7] ~= shape then return false end
  end
  if byModel then
    g.aidx, g.fidx, g.alla, g.allf = KEYS[3], KEYS[4], f[6], full
  else
    g.alla, g.allf, g.aidx, g.fidx = KEYS[3], KEYS[4], f[6], full
  end
  chosen = g
  return true
end

-- The walk reads pages of first, then batch candidates: the first
-- candidate usually fits, and a one-member reply is the cheapest.
local first, batch = 1, 16
local lo = mem
if whole then lo = '-inf' end

-- binpack: the fitting device with the least free memory; ties in uuid
-- order (a zset orders equal scores by member).
local function binpack(idx)
  local off, n = 0, first
  while true do
    local uuids = redis.call('ZRANGEBYSCORE', idx, lo, '+inf', 'LIMIT', off, n)
    for _, uuid in ipairs(uuids) do
      if fits(uuid) then return uuid end
    end
    if #uuids < n then return nil end
    off, n = off + n, batch
  end
end

-- spread: the fitting device with the most free memory; ties in uuid order.
-- It walks score levels downwards and each level upwards by member.
local function spread(idx)
  local top = redis.call('ZREVRANGEBYSCORE', idx, '+inf', lo, 'WITHSCORES', 'LIMIT', 0, 1)
  if #top == 0 then return nil end
  local level = top[2]
  while true do
    local off, n = 0, first
    while true do
      local uuids = redis.call('ZRANGEBYSCORE', idx, level, level, 'LIMIT', off, n)
      for _, uuid in ipairs(uuids) do
        if fits(uuid) then return uuid end
      end
      if #uuids < n then break end
      off, n = off + n, batch
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
  local modes = tostring(redis.call('SCARD', ARGV[11] .. ARGV[12]))
  local all = 0
  for m in string.gmatch(ALL_MODES, '%S+') do
    all = all + redis.call('SCARD', ARGV[11] .. m)
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
-- A shared device that fills up moves to the full class: read the full
-- index of the other scope that fits skipped (whole devices read it there).
if not whole and g.acp + cp >= 100 then
  local full = redis.call('HGET', gkey, otherFull)
  if byModel then g.allf = full else g.fidx = full end
end
gpu_charge(gkey, g, uuid, mem, cp, 1, shape ~= '' and shape or nil)
usage_charge(KEYS[5], prefixes, used, mem, cp, 1)
local rec = ARGV[3] .. slice_members(mem, cp, cl) .. g.ref .. ',"sharing":"' .. g.mode .. '"}'
redis.call('HSET', KEYS[2], id, rec)
return {'placed', rec}
