-- release.lua defines release(KEYS, ARGV), which frees one slice and
-- un-charges its device, user and groups. The script runs it once
-- (scripts.go) or once per request of a batch (batch.lua).
--
-- Shared by every request of a batch (Store.releaseShared):
-- KEYS[1] allocs (hash slice id → allocation JSON)
-- KEYS[2] usage (hash of user and group counters)
-- ARGV[1] device key prefix
-- Each request's own: ARGV[2] slice id
-- A subject's usage field is USER_FIELD or GROUP_FIELD .. its name (lib.lua).
-- Returns 1 when an allocation was freed, 0 when there was none.

local function release(KEYS, ARGV)
  local rec = redis.call('HGET', KEYS[1], ARGV[2])
  if not rec then
    return 0
  end
  local a = cjson.decode(rec)
  local fields = {USER_FIELD .. a.user}
  for _, grp in ipairs(a.groups) do
    fields[#fields + 1] = GROUP_FIELD .. grp
  end
  local used = usage_load(KEYS[2], fields)
  local gkey = ARGV[1] .. a.gpu
  -- A device record never disappears today; the check keeps a hand-deleted
  -- one from being recreated as a half hash.
  local g = gpu_load_release(gkey, a.sharing == 'exclusive' or a.sharing == 'mig')
  if g then
    gpu_charge(gkey, g, a.gpu, a.memoryMiB, a.computePercent, -1)
  end
  usage_charge(KEYS[2], fields, used, a.memoryMiB, a.computePercent, -1)
  redis.call('HDEL', KEYS[1], ARGV[2])
  return 1
end
