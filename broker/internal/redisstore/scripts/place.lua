-- place.lua defines place(KEYS, ARGV), which places one server on a device
-- of its sharing mode: quota checks, device choice, charging and the
-- allocation record in one atomic step. Only the indexes of the asked pool
-- are walked, so a server never lands on a device of another mode. The
-- script runs it once (scripts.go) or once per request of a batch
-- (batch.lua); what it defines outside place is made once per script run.
--
-- Shared by every request of a batch (Store.placeShared):
-- KEYS[1] marker             (string; placement refused while absent)
-- KEYS[2] allocs             (hash slice id → allocation JSON)
-- KEYS[3] usage              (hash of user and group counters)
-- ARGV[1] device key prefix (gpu:<uuid> = ARGV[1] .. uuid)
-- ARGV[2] mode-set prefix (mode:<mode> = ARGV[2] .. mode); the GPU sets of
--         the asked mode and of every mode (ALL_MODES, libConsts in
--         scripts.go) are counted only for the capacity refusal, so their
--         keys are built here (same hash tag) rather than passed as keys
-- Each request's own (Store.placeOp):
-- KEYS[4] scope avail index  (zset; the pool's, of the model or of all)
-- KEYS[5] scope full index
-- ARGV[3] slice id
-- ARGV[4] the allocation JSON up to and including the comma before the
--         slice members (recordHead in Go)
-- ARGV[5] memory MiB, ARGV[6] compute percent, ARGV[7] compute limit
--         percent (decimal integers; shared modes; ignored when whole)
-- ARGV[8] policy: "binpack" or "spread"
-- ARGV[9] "share" (sliced, mps: a part of a device) or "whole" (exclusive,
--         mig: one server holds the device, charged all of it)
-- ARGV[10] MPS client size "<MiB>/<percent>": a GPU takes it only if it
--         holds clients of that size or none; "" for other modes
-- ARGV[11] the scope of KEYS[4..5]: "all" (the pool's all-model indexes)
--         or "model" (one model's)
-- ARGV[12] the asked mode
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

-- place_ready: an earlier request of this script run saw the marker.
-- Nothing a place does removes it, so a batch reads it once.
local place_ready = false

local quota_resources = {'servers', 'memoryMiB', 'computePercent'}

-- place_over is the quota refusal for one more server of m MiB and c
-- percent for the k loaded subjects used of ARGV (ARGV[14..]: subjects in
-- order, user first; resources in a fixed order), or nil.
local function place_over(ARGV, k, used, m, c)
  for i = 1, k do
    local base = 10 + 4 * i
    local u = used[i]
    for r = 1, 3 do
      local cap = ARGV[base + r]
      if cap ~= '0' then
        local limit = tonumber(cap)
        local want = c
        if r == 1 then want = 1 elseif r == 2 then want = m end
        if limit > 0 and u[r] + want > limit then
          local scope = 'group'
          if i == 1 then scope = 'user' end
          return {'quota', scope, ARGV[base], quota_resources[r], cap, tostring(u[r]), tostring(want)}
        end
      end
    end
  end
  return nil
end

-- The walk of the request in progress: set by place before each walk, so
-- that the walk's functions are made once per script run, not per request.
--   w_prefix  device key prefix      w_whole  whole pool
--   w_cp      compute percent asked  w_shape  MPS client size or ""
--   w_lo      lowest free MiB that fits (a string: Redis parses it)
--   w_other, w_other_full   the index fields of the other scope
--   w_by_model  the request is scoped to a model
--   w_avail, w_full  the scope's indexes   w_mode  the asked mode
-- fits leaves the device it accepts in w_chosen, its key in w_chosen_key.
local w_prefix, w_whole, w_cp, w_shape, w_lo, w_other, w_other_full
local w_by_model, w_avail, w_full, w_mode, w_chosen, w_chosen_key

-- fits reads a candidate device and keeps it in w_chosen if it fits: a
-- shared device needs w_cp percent of compute free (and, for MPS, clients
-- of the asked size or none); its free memory is its index score, which
-- the walk already bounded. Any device in a whole pool's avail index is
-- empty. It reads only the fields the charge needs (one HMGET: each reply
-- element costs Redis a Lua string and a lookup in the hash): the
-- counters (one binary field, gpu_counters), the ref, the index of the
-- other scope (all-model or model) of
-- the avail class, and per kind the charge of a whole device with its
-- full-class indexes, or an MPS GPU's client size. A device in an index is
-- healthy and of the pool's mode and kind (lib.lua), so neither is read.
local function fits(uuid)
  local gkey = w_prefix .. uuid
  local f
  if w_whole then
    f = redis.call('HMGET', gkey, 'mem', 'use', 'ref', w_other, 'cpw', w_other_full)
  elseif w_shape ~= '' then
    f = redis.call('HMGET', gkey, 'mem', 'use', 'ref', w_other, 'shape')
  else
    f = redis.call('HMGET', gkey, 'mem', 'use', 'ref', w_other)
  end
  if not f[1] then return false end
  local amem, acp, n, legacy = gpu_counters(gkey, f[2])
  local full = nil
  local cpw
  if w_whole then
    cpw, full = tonumber(f[5] or '100'), f[6]
  else
    if 100 - acp < w_cp then return false end
    if w_shape ~= '' and f[5] and f[5] ~= w_shape then return false end
  end
  local g = {mem = tonumber(f[1]), amem = amem, acp = acp, n = n, legacy = legacy,
    ref = f[3], healthy = true, whole = w_whole, mode = w_mode, cpw = cpw}
  if w_by_model then
    g.aidx, g.fidx, g.alla, g.allf = w_avail, w_full, f[4], full
  else
    g.alla, g.allf, g.aidx, g.fidx = w_avail, w_full, f[4], full
  end
  w_chosen, w_chosen_key = g, gkey
  return true
end

-- The walk reads pages of 1, then page candidates: the first candidate
-- usually fits, and a one-member reply is the cheapest.
local page = 16

-- binpack: the fitting device with the least free memory; ties in uuid
-- order (a zset orders equal scores by member).
local function binpack(idx)
  local uuids = redis.call('ZRANGEBYSCORE', idx, w_lo, '+inf', 'LIMIT', '0', '1')
  local off = 0
  while true do
    for _, uuid in ipairs(uuids) do
      if fits(uuid) then return uuid end
    end
    if #uuids < (off == 0 and 1 or page) then return nil end
    off = off + #uuids
    uuids = redis.call('ZRANGEBYSCORE', idx, w_lo, '+inf', 'LIMIT', off, page)
  end
end

-- spread: the fitting device with the most free memory; ties in uuid order.
-- It walks score levels downwards and each level upwards by member.
local function spread(idx)
  local top = redis.call('ZREVRANGEBYSCORE', idx, '+inf', w_lo, 'WITHSCORES', 'LIMIT', '0', '1')
  if #top == 0 then return nil end
  local level = top[2]
  while true do
    local uuids = redis.call('ZRANGEBYSCORE', idx, level, level, 'LIMIT', '0', '1')
    local off = 0
    while true do
      for _, uuid in ipairs(uuids) do
        if fits(uuid) then return uuid end
      end
      if #uuids < (off == 0 and 1 or page) then break end
      off = off + #uuids
      uuids = redis.call('ZRANGEBYSCORE', idx, level, level, 'LIMIT', off, page)
    end
    local nxt = redis.call('ZREVRANGEBYSCORE', idx, '(' .. level, w_lo, 'WITHSCORES', 'LIMIT', '0', '1')
    if #nxt == 0 then return nil end
    level = nxt[2]
  end
end

-- largest returns the score and smallest member at the top of idx, or nil.
local function largest(idx)
  local top = redis.call('ZREVRANGEBYSCORE', idx, '+inf', '-inf', 'WITHSCORES', 'LIMIT', '0', '1')
  if #top == 0 then return nil end
  local first = redis.call('ZRANGEBYSCORE', idx, top[2], top[2], 'LIMIT', '0', '1')
  return tonumber(top[2]), first[1]
end

-- capacity is the capacity refusal of a request that found no device.
local function capacity(ARGV, avail, full)
  local modes = tostring(redis.call('SCARD', ARGV[2] .. ARGV[12]))
  local all = 0
  for m in string.gmatch(ALL_MODES, '%S+') do
    all = all + redis.call('SCARD', ARGV[2] .. m)
  end
  local candidates = redis.call('ZCARD', avail) + redis.call('ZCARD', full)
  if candidates == 0 then
    return {'capacity', '0', '', '', '', modes, tostring(all)}
  end
  local free, best = largest(avail)
  local ffree, fbest = largest(full)
  if ffree and (not free or ffree > free or (ffree == free and fbest < best)) then
    free, best = ffree, fbest
  end
  local f = redis.call('HMGET', ARGV[1] .. best, 'node', 'use')
  local _, acp = gpu_counters(ARGV[1] .. best, f[2])
  return {'capacity', tostring(candidates), tostring(free), tostring(100 - acp), f[1], modes, tostring(all)}
end

local function place(KEYS, ARGV)
  local id = ARGV[3]
  local existing = redis.call('HGET', KEYS[2], id)
  if existing then
    return {'exists', existing}
  end
  if not place_ready then
    if redis.call('EXISTS', KEYS[1]) == 0 then
      return {'notready'}
    end
    place_ready = true
  end

  local whole = ARGV[9] == 'whole'
  local shape = ARGV[10]

  -- Quotas: subjects in order (user first), resources in a fixed order.
  local k = tonumber(ARGV[13])
  local fields = {USER_FIELD .. ARGV[14]}
  for i = 2, k do
    fields[i] = GROUP_FIELD .. ARGV[10 + 4 * i]
  end
  local used = usage_load(KEYS[3], fields)
  local mem, cp, cl
  if not whole then
    mem, cp = tonumber(ARGV[5]), tonumber(ARGV[6])
    local q = place_over(ARGV, k, used, mem, cp)
    if q then return q end
  end

  w_prefix, w_whole, w_shape, w_mode = ARGV[1], whole, shape, ARGV[12]
  w_cp, w_lo = cp, ARGV[5]
  if whole then w_lo = '-inf' end
  w_by_model = ARGV[11] == 'model'
  w_avail, w_full = KEYS[4], KEYS[5]
  w_other, w_other_full = 'aidx', 'fidx'
  if w_by_model then w_other, w_other_full = 'alla', 'allf' end
  w_chosen = nil
  local uuid
  if ARGV[8] == 'spread' then
    uuid = spread(KEYS[4])
  else
    uuid = binpack(KEYS[4])
  end
  if not uuid then
    return capacity(ARGV, KEYS[4], KEYS[5])
  end

  local gkey = w_chosen_key
  local g = w_chosen
  local members
  if whole then
    mem, cp, cl = g.mem, g.cpw, g.cpw
    local q = place_over(ARGV, k, used, mem, cp)
    if q then return q end
    members = slice_members(mem, cp, cl)
  else
    -- Go's decimal integers as they are: no number formatting in Lua.
    members = '"memoryMiB":' .. ARGV[5] .. ',"computePercent":' .. ARGV[6] .. ',"computeLimitPercent":' .. ARGV[7] .. ','
    -- A shared device that fills up moves to the full class: read the
    -- full index of the other scope that fits skipped (whole devices read
    -- it there).
    if g.acp + cp >= 100 then
      local full = redis.call('HGET', gkey, w_other_full)
      if w_by_model then g.allf = full else g.fidx = full end
    end
  end
  gpu_charge(gkey, g, uuid, mem, cp, 1, shape ~= '' and shape or nil)
  usage_charge(KEYS[3], fields, used, mem, cp, 1)
  local rec = ARGV[4] .. members .. g.ref .. ',"sharing":"' .. g.mode .. '"}'
  redis.call('HSET', KEYS[2], id, rec)
  return {'placed', rec}
end
