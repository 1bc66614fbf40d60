-- mark_reconciled.lua sets the reconcile marker on the condition that the
-- reconcile epoch is still the one the pass read first, so a pass that
-- began before Redis lost its data never marks the empty data rebuilt.
--
-- KEYS[1] marker epoch (string), KEYS[2] marker (string)
-- ARGV[1] the pass's epoch, ARGV[2] the time to store in the marker
-- Returns 1 when it set the marker, 0 when the epoch changed.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2])
return 1
