-- extend_idle.lua grants an extension of a spawn's idle clock if the
-- spawn's total extension stays within the limit. It owns the fields "ext"
-- and "extuntil" of the idle state; the reclaimer's cycle never writes
-- them, so a cycle cannot undo an extension granted while it ran.
--
-- KEYS[1] reclaim:spawn:<spawnID>  (hash; the spawn's idle state)
-- ARGV[1] now, Unix ms (the broker's clock)
-- ARGV[2] the extension, ms
-- ARGV[3] the limit of the total extension, ms
-- ARGV[4] the state's TTL, ms
-- Returns {1, extended-until ms, total ms} when granted, {0, total ms}
-- when the limit would be passed (nothing is written then).

local total = tonumber(redis.call('HGET', KEYS[1], 'ext') or '0')
local d = tonumber(ARGV[2])
if total + d > tonumber(ARGV[3]) then
  return {0, total}
end
local now = tonumber(ARGV[1])
local untilMs = tonumber(redis.call('HGET', KEYS[1], 'extuntil') or '0')
if untilMs < now then untilMs = now end
untilMs = untilMs + d
redis.call('HSET', KEYS[1], 'ext', total + d, 'extuntil', untilMs)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, untilMs, total + d}
