-- release: delete the lock only while it is still ours.
-- KEYS[1] the lock (<name>:leader)
-- ARGV[1] instance id
-- Returns 1 when deleted, 0 when the lock is gone or held by another instance.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
