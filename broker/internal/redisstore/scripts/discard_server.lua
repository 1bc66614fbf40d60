-- discard_server.lua undoes a start that was refused before anything of it
-- existed outside Redis (no slice held, no pod): the new spawn's record
-- and its events go, and the record it replaced, if any, comes back.
--
-- KEYS[1] server record, KEYS[2] its event stream,
-- KEYS[3] the user's server-name set, KEYS[4] the all-servers set,
-- KEYS[5] the kept previous record (see create_server.lua)
-- ARGV[1] spawn id of the refused start, ARGV[2] server name
-- ARGV[3] record TTL ms for a restored (terminal) record
-- Returns one of {"restored"} (the previous record is back), {"deleted"}
-- (there was none), {"absent"}, {"spawn", current spawn},
-- {"live", current state} (past its refusable steps).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'absent'}
end
local cur = redis.call('HMGET', KEYS[1], 'spawn', 'state')
if cur[1] ~= ARGV[1] then
  return {'spawn', cur[1]}
end
if cur[2] ~= 'pending' and cur[2] ~= 'placing' and cur[2] ~= 'creating' then
  return {'live', cur[2]}
end
redis.call('DEL', KEYS[1])
-- The refused spawn's few events are the newest ones.
for _, e in ipairs(redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 32)) do
  local f = e[2]
  for i = 1, #f, 2 do
    if f[i] == 'spawn' then
      if f[i + 1] == ARGV[1] then
        redis.call('XDEL', KEYS[2], e[1])
      end
      break
    end
  end
end
if redis.call('EXISTS', KEYS[5]) == 1 then
  redis.call('RENAME', KEYS[5], KEYS[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'restored'}
end
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('SREM', KEYS[4], KEYS[1])
if redis.call('XLEN', KEYS[2]) == 0 then
  redis.call('DEL', KEYS[2])
end
return {'deleted'}
