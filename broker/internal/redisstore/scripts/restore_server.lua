-- restore_server.lua writes a server record rebuilt from its pod, only if
-- no record exists.
--
-- KEYS[1] server record, KEYS[2] its event stream,
-- KEYS[3] the user's server-name set, KEYS[4] the all-servers set
-- ARGV[1] now (Unix ns), ARGV[2] event MAXLEN, ARGV[3] event TTL ms
-- ARGV[4] server name, ARGV[5] spawn id, ARGV[6] state, ARGV[7] event message
-- ARGV[8] record TTL ms ("0" = none)
-- ARGV[9..] field/value pairs of the record
-- Returns 1 when written, 0 when a record existed.

if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local fields = {}
for i = 9, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
set_record_ttl(KEYS[1], ARGV[8])
redis.call('SADD', KEYS[3], ARGV[4])
redis.call('SADD', KEYS[4], KEYS[1])
append_event(KEYS[2], ARGV[5], ARGV[6], ARGV[7], ARGV[1], ARGV[2], ARGV[3])
return 1
