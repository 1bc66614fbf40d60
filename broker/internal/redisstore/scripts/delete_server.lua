-- delete_server.lua removes a terminal server record of a given spawn, its
-- event stream and its set memberships.
--
-- KEYS[1] server record, KEYS[2] its event stream,
-- KEYS[3] the user's server-name set, KEYS[4] the all-servers set
-- ARGV[1] spawn id, ARGV[2] server name (member of KEYS[3])
-- Returns one of {"deleted"}, {"absent"}, {"spawn", current spawn},
-- {"live", current state}.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'absent'}
end
local cur = redis.call('HMGET', KEYS[1], 'spawn', 'state')
if cur[1] ~= ARGV[1] then
  return {'spawn', cur[1]}
end
if cur[2] ~= 'stopped' and cur[2] ~= 'failed' then
  return {'live', cur[2]}
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[4], KEYS[1])
return {'deleted'}
