-- release_lock.lua deletes a lock only if it still holds the caller's
-- token, so a lock that expired and was taken by another replica is kept.
--
-- KEYS[1] the lock (string; e.g. web:<sha256(id)>:refresh)
-- ARGV[1] the caller's token
-- Returns 1 when the lock was deleted, 0 otherwise.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
