-- lock force release: take a lock away from its holder, for an operator
-- (RedisLocker.force_release).
-- KEYS[1] the lock hash (<prefix>key:<name>), KEYS[2] the fencing counter (<prefix>fencing)
-- ARGV[1] "1" to send the notice in the key's slot (SPUBLISH, Redis Cluster 7+)
-- KEYS[3] (optional) the lock's fair-waiting queue (see queue.lua): its first waiter is
-- told too
-- Returns {mark, holder}: with a holder, the lock is deleted and the fencing counter moved
-- past the evicted holder's token (the holder's refresh and release find it gone; every
-- later token is greater); mark is the counter's new value and holder the evicted holder's
-- label, or its ownership token when it has none. Without one, nothing changes: mark is the
-- counter's value (0 when none) and holder is "".
-- Waiters are told at once (notify.lua, its prelude), as on a release.
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  return {tonumber(redis.call('GET', KEYS[2]) or '0'), ''}
end
local holder = redis.call('HGET', KEYS[1], 'holder') or owner
redis.call('DEL', KEYS[1])
local mark = redis.call('INCR', KEYS[2])
notify_released(KEYS[1], KEYS[3], 1, '1', ARGV[1] == '1')
return {mark, holder}
