-- transition.lua moves a server's current spawn to a new state.
--
-- KEYS[1] server record, KEYS[2] its event stream
-- ARGV[1] spawn id the caller acts for
-- ARGV[2] target state, ARGV[3] message
-- ARGV[4] now (Unix ns), ARGV[5] event MAXLEN, ARGV[6] event TTL ms
-- ARGV[7] record TTL ms ("0" = none; set for terminal targets)
-- ARGV[8] "stay" (a record in the target state already takes the message
--         and patch) or "move" (it is left as it is: {"state", target})
-- ARGV[9] number p of patch fields, then p field/value pairs
-- ARGV[10 + 2p ..] the states the target may be reached from (none: the
--         record must be in the target state already)
-- Returns one of
--   {"moved", HGETALL}      state changed, event appended
--   {"updated", HGETALL}    already in the target state ("stay"); message or
--                           patch applied (event appended only if the message
--                           changed)
--   {"notfound"}
--   {"spawn", current spawn}   the caller's spawn is not the current one
--   {"state", current state}   the target is not reachable from the current
--                              state (or is it, and "move" was asked)

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'notfound'}
end
local cur = redis.call('HMGET', KEYS[1], 'spawn', 'state', 'msg')
if cur[1] ~= ARGV[1] then
  return {'spawn', cur[1]}
end
local to = ARGV[2]
local p = tonumber(ARGV[9])
local patch = {}
for i = 10, 9 + 2 * p do
  patch[#patch + 1] = ARGV[i]
end

if cur[2] == to then
  if ARGV[8] ~= 'stay' then
    return {'state', cur[2]}
  end
  local changed = cur[3] ~= ARGV[3]
  if not changed and p == 0 then
    return {'updated', redis.call('HGETALL', KEYS[1])}
  end
  redis.call('HSET', KEYS[1], 'msg', ARGV[3], 'updated', ARGV[4])
  if p > 0 then
    redis.call('HSET', KEYS[1], unpack(patch))
  end
  if changed then
    append_event(KEYS[2], ARGV[1], to, ARGV[3], ARGV[4], ARGV[5], ARGV[6])
  end
  return {'updated', redis.call('HGETALL', KEYS[1])}
end

local allowed = false
for i = 10 + 2 * p, #ARGV do
  if ARGV[i] == cur[2] then
    allowed = true
    break
  end
end
if not allowed then
  return {'state', cur[2]}
end
redis.call('HSET', KEYS[1], 'state', to, 'msg', ARGV[3], 'updated', ARGV[4])
if p > 0 then
  redis.call('HSET', KEYS[1], unpack(patch))
end
set_record_ttl(KEYS[1], ARGV[7])
append_event(KEYS[2], ARGV[1], to, ARGV[3], ARGV[4], ARGV[5], ARGV[6])
return {'moved', redis.call('HGETALL', KEYS[1])}
