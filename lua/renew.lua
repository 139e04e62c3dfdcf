-- renew: extend the lease only while it is still ours.
-- KEYS[1] the lock (<name>:leader)
-- ARGV[1] instance id, ARGV[2] lease TTL in milliseconds
-- Returns 1 when renewed, 0 when the lock is gone or held by another instance.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
