-- restore.lua records an allocation that a pod proves exists, without
-- quota or capacity refusal, charging the GPU, user and groups.
--
-- KEYS[1] allocs, KEYS[2] gpu key
-- KEYS[3] all avail index, KEYS[4] all full index
-- KEYS[5] usage (hash of user and group counters)
-- ARGV[1] slice id, ARGV[2] gpu uuid
-- ARGV[3] memory MiB, ARGV[4] compute percent
-- ARGV[5] the allocation JSON up to the comma before the GPU's ref
-- ARGV[6] the ref to end it with, "" for the GPU's own (its node)
-- ARGV[7..] usage fields of the user and its groups (lib.lua)
-- Returns one of
--   {"restored", allocation JSON}
--   {"overcommit", allocation JSON, allocated MiB, memory MiB, allocated compute}
--                            recorded, but the GPU is now overcommitted
--   {"exists", allocation JSON}   an allocation with this id is stored
--   {"nogpu"}                     the GPU is not registered

local existing = redis.call('HGET', KEYS[1], ARGV[1])
if existing then
  return {'exists', existing}
end
local g = gpu_load(KEYS[2])
if not g then
  return {'nogpu'}
end
local mem = tonumber(ARGV[3])
local cp = tonumber(ARGV[4])
local fields = {}
for i = 7, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
local used = usage_load(KEYS[5], fields)
gpu_charge(KEYS[2], g, ARGV[2], mem, cp, 1, KEYS[3], KEYS[4])
usage_charge(KEYS[5], fields, used, mem, cp, 1)
local ref = ARGV[6]
if ref == '' then
  ref = g.ref
end
local rec = ARGV[5] .. ref .. '}'
redis.call('HSET', KEYS[1], ARGV[1], rec)
if g.amem > g.mem or g.acp > 100 then
  return {'overcommit', rec, tostring(g.amem), tostring(g.mem), tostring(g.acp)}
end
return {'restored', rec}
