-- evict: end the current term at Redis, for an operator (redlease.evict).
-- KEYS[1] the lock (<name>:leader), KEYS[2] the fence counter (<name>:fence),
-- KEYS[3] the fence high-water mark (<name>:fence:applied)
-- ARGV[1] "1" to send the notice in the key's slot (SPUBLISH, Redis Cluster 7+)
-- Returns {mark, holder}: with a holder, the lease is deleted and the mark raised above
-- every token granted so far (so the evicted term's fenced writes are rejected from now on,
-- its next renewal finds the lease gone, and the next term's token is greater still);
-- mark is the new high-water mark and holder the evicted instance id. Without one, nothing
-- changes: mark is the current high-water mark (0 when none) and holder is "".
-- The contenders are told at once (notify.lua, its prelude), as on a release.
local holder = redis.call('GET', KEYS[1])
if not holder then
  return {tonumber(redis.call('GET', KEYS[3]) or '0'), ''}
end
redis.call('DEL', KEYS[1])
-- The mark goes above the counter and the old mark both; copied as a string and
-- incremented by Redis, so large values are stored verbatim.
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
local applied = tonumber(redis.call('GET', KEYS[3]) or '0')
if counter > applied then
  redis.call('SET', KEYS[3], redis.call('GET', KEYS[2]))
end
local mark = redis.call('INCR', KEYS[3])
notify_released(KEYS[1], nil, 0, holder, ARGV[1] == '1')
return {mark, holder}
