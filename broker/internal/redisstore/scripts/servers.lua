-- servers.lua is prepended to the server record scripts.
--
-- A server hash (srv:<user>:<name>) has the fields
--   user name profile spawn idem state msg pod url   strings
--   reqsum                                            hex SHA-256 of the create request
--   slice alloc                                       JSON ("" alloc = not placed)
--   created updated                                   Unix nanoseconds
-- Its event stream has entries {spawn, state, msg, time (Unix ns)}.

-- append_event adds one event to the stream at key, trims it to about
-- maxlen entries and renews its TTL (ttl_ms). It returns the entry id.
local function append_event(key, spawn, state, msg, now, maxlen, ttl_ms)
  local id = redis.call('XADD', key, 'MAXLEN', '~', maxlen, '*',
    'spawn', spawn, 'state', state, 'msg', msg, 'time', now)
  redis.call('PEXPIRE', key, ttl_ms)
  return id
end

-- set_record_ttl gives a terminal record its garbage-collection TTL, or
-- removes any TTL from a live one (ttl_ms "0").
local function set_record_ttl(key, ttl_ms)
  if ttl_ms == '0' then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, ttl_ms)
  end
end
