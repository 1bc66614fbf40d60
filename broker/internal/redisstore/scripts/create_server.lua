-- create_server.lua stores a new spawn of a server unless a live one exists.
--
-- KEYS[1] server record, KEYS[2] its event stream,
-- KEYS[3] the user's server-name set, KEYS[4] the all-servers set,
-- KEYS[5] where the replaced (stopped or failed) record is kept
-- KEYS[6] the reconcile marker (string; no new spawn while it is absent)
-- ARGV[1] idempotency key ("" never matches)
-- ARGV[2] now (Unix ns), ARGV[3] event MAXLEN, ARGV[4] event TTL ms
-- ARGV[5] server name (member of KEYS[3])
-- ARGV[6] spawn id, ARGV[7] message of the pending event
-- ARGV[8] TTL ms of the kept previous record
-- ARGV[9..] field/value pairs of the new record (state pending)
-- Returns one of
--   {"created", HGETALL of the record}
--   {"exists", HGETALL}   a record with the same idempotency key
--   {"conflict", state, spawn}   a live spawn with another key
--   {"notready"}   no record is live with the key and the marker is
--                  missing: Redis lost its data, and a server whose record
--                  went with it may still run its pod, which the rebuild
--                  restores; a new spawn recorded meanwhile would make that
--                  pod look like a replaced spawn's, which the reconciler
--                  deletes (the server would be lost)

if redis.call('EXISTS', KEYS[1]) == 1 then
  local cur = redis.call('HMGET', KEYS[1], 'idem', 'state', 'spawn')
  if ARGV[1] ~= '' and cur[1] == ARGV[1] then
    return {'exists', redis.call('HGETALL', KEYS[1])}
  end
  if cur[2] ~= 'stopped' and cur[2] ~= 'failed' then
    return {'conflict', cur[2], cur[3]}
  end
end
if redis.call('EXISTS', KEYS[6]) == 0 then
  return {'notready'}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  -- Kept until the new start is past its refusable steps: a refused
  -- start puts it back (discard_server.lua).
  redis.call('RENAME', KEYS[1], KEYS[5])
  redis.call('PEXPIRE', KEYS[5], ARGV[8])
end
local fields = {}
for i = 9, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('SADD', KEYS[3], ARGV[5])
redis.call('SADD', KEYS[4], KEYS[1])
append_event(KEYS[2], ARGV[6], 'pending', ARGV[7], ARGV[2], ARGV[3], ARGV[4])
return {'created', redis.call('HGETALL', KEYS[1])}
