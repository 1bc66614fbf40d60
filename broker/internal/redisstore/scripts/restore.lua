-- restore.lua records an allocation that a pod proves exists, without
-- quota or capacity refusal, charging the device, user and groups.
--
-- KEYS[1] allocs, KEYS[2] device key
-- KEYS[3] usage (hash of user and group counters)
-- ARGV[1] slice id, ARGV[2] device uuid
-- ARGV[3] memory MiB, ARGV[4] compute percent, ARGV[5] compute limit percent
-- ARGV[6] the allocation JSON up to the comma before the slice members
-- ARGV[7] the ref to end it with, "" for the device's own (its node)
-- ARGV[8] the allocation's sharing mode (the pod's word)
-- ARGV[9] its MPS client size "<MiB>/<percent>", "" unless mps
-- ARGV[10..] usage fields of the user and its groups (lib.lua)
-- Returns one of
--   {"restored", allocation JSON}
--   {"overcommit", allocation JSON, allocated MiB, memory MiB, allocated compute}
--                            recorded, but the device is now overcommitted
--   {"mixed", allocation JSON, device mode}
--                            recorded, but the device is in another mode
--   {"exists", allocation JSON}   an allocation with this id is stored
--   {"nogpu"}                     the device is not registered

local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then
  return {'exists', existing}
end
local g = gpu_load(KEYS[2])
if not g then
  return {'nogpu'}
end
local mem, cp, cl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local fields = {}
for i = 10, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local used = usage_load(KEYS[3], fields)
gpu_charge(KEYS[2], g, ARGV[2], mem, cp, 1)
if ARGV[9] ~= '' and g.n == 1 then
  redis.call('HSET', KEYS[2], 'shape', ARGV[9])
end
usage_charge(KEYS[3], fields, used, mem, cp, 1)
local ref = ARGV[7]
if ref == '' then
  ref = g.ref
end
local rec = ARGV[6] .. slice_members(mem, cp, cl) .. ref .. ',"sharing":"' .. ARGV[8] .. '"}'
redis.call('HSET', KEYS[1], ARGV[1], rec)
if ARGV[8] ~= g.mode then
  return {'mixed', rec, g.mode}
end
if g.amem > g.mem or g.acp > 100 or (g.whole and g.n > 1) then
  return {'overcommit', rec, tostring(g.amem), tostring(g.mem), tostring(g.acp)}
end
return {'restored', rec}
