-- save_policy.lua saves a new version of the reclaim policy if the edit
-- started from the current one, keeps it in the history and audits it, in
-- one atomic step.
--
-- KEYS[1] reclaim:policy          (string; JSON of the current policy)
-- KEYS[2] reclaim:policy:version  (string; the current version, absent = 0)
-- KEYS[3] reclaim:policy:history  (hash version → JSON)
-- KEYS[4] audit                   (stream; field "entry" = JSON of the entry)
-- ARGV[1] base version (the new policy is version base+1)
-- ARGV[2] the new policy's JSON
-- ARGV[3] the audit entry's JSON
-- ARGV[4] history versions kept
-- ARGV[5] audit MAXLEN (approximate)
-- Returns {1, new version} when saved, {0, current version} when the base
-- is not the current version (nothing is written then).

local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
if cur ~= tonumber(ARGV[1]) then
  return {0, cur}
end
local v = cur + 1
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], v)
redis.call('HSET', KEYS[3], tostring(v), ARGV[2])
local old = v - tonumber(ARGV[4])
if old > 0 then
  redis.call('HDEL', KEYS[3], tostring(old))
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'entry', ARGV[3])
return {1, v}
