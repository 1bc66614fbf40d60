-- release.lua frees one slice and un-charges its GPU, user and groups.
--
-- KEYS[1] allocs (hash slice id → allocation JSON)
-- KEYS[2] all healthy index, KEYS[3] all avail index
-- ARGV[1] gpu key prefix, ARGV[2] user key prefix, ARGV[3] group key prefix
-- ARGV[4] slice id
-- Returns 1 when an allocation was freed, 0 when there was none.

local rec = redis.call('HGET', KEYS[1], ARGV[4])
if not rec then
  return 0
end
local a = cjson.decode(rec)
local gkey = ARGV[1] .. a.gpu
-- A GPU record never disappears today; the check keeps a hand-deleted one
-- from being recreated as a half hash.
if redis.call('EXISTS', gkey) == 1 then
  charge_gpu(gkey, a.gpu, a.memoryMiB, a.computePercent, -1, KEYS[2], KEYS[3])
end
charge_subject(ARGV[2] .. a.user, a.memoryMiB, a.computePercent, -1)
for _, g in ipairs(a.groups) do
  charge_subject(ARGV[3] .. g, a.memoryMiB, a.computePercent, -1)
end
redis.call('HDEL', KEYS[1], ARGV[4])
return 1
