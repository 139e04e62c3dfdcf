-- partition leave: a stopping member gives back its partitions and leaves its group at once.
-- KEYS[1] the live members (<name>:members, a sorted set: member -> expiry in server ms),
-- KEYS[2] the group's partition set (<name>:partitions), KEYS[3..] the partition leases it
-- holds (<name>:p:<partition>:leader)
-- ARGV[1] member id, ARGV[2] "1" to send the notice in the key's slot (SPUBLISH, Redis
-- Cluster 7+), anything else for a plain PUBLISH
-- Deletes each lease only while ARGV[1] holds it, takes the member out of the live members
-- (the last one to leave takes the partition set with it), and tells the group (payload:
-- the member id; sent by notify.lua, its prelude), so the others rebalance within
-- milliseconds instead of when the heartbeat would have lapsed.
-- Returns {leases deleted, 1 told | 2 the server refused the notice}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local released = 0
for i = 3, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
end
return {released, notify_released(KEYS[1], nil, 0, ARGV[1], ARGV[2] == '1')}
