-- leader: who holds the lease now, read atomically with its remaining time.
-- KEYS[1] the lock (<name>:leader)
-- Returns {instance id, pttl in ms}, or nil when nobody holds it.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return nil
end
return {holder, redis.call('PTTL', KEYS[1])}
