-- partition join: a member enters its group, or comes back after its heartbeat lapsed.
-- KEYS[1] the live members (<name>:members, a sorted set: member -> expiry in server ms),
-- KEYS[2] the group's partition set (<name>:partitions, its sorted names as one JSON list)
-- ARGV[1] member id, ARGV[2] heartbeat TTL in milliseconds, ARGV[3] this member's partition
-- set (as KEYS[2] holds it), ARGV[4] "1" to send the notice in the key's slot (SPUBLISH,
-- Redis Cluster 7+), anything else for a plain PUBLISH
-- A group keeps one partition set while any other member is live: a member with another
-- set is refused; once no other member is live, the newcomer's set replaces the stored one.
-- Both keys live as long as the longest heartbeat. A newcomer tells the group on
-- <members>:released (payload: its id; sent by notify.lua, its prelude), so every member
-- rebalances at once instead of at its next poll.
-- Returns {1, 1} when joined (and told, if it was not a member already), {1, 2} when joined
-- but the server refused the notice (the user may not publish to the channel), or
-- {0, the stored set} when refused: the other live members share another set.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local present = redis.call('ZSCORE', KEYS[1], ARGV[1])
local others = redis.call('ZCARD', KEYS[1]) - (present and 1 or 0)
local stored = redis.call('GET', KEYS[2])
if stored and stored ~= ARGV[3] and others > 0 then
  return {0, stored}
end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
redis.call('PEXPIRE', KEYS[2], tonumber(last[2]) - now)
if present then
  return {1, 1}
end
return {1, notify_released(KEYS[1], nil, 0, ARGV[1], ARGV[4] == '1')}
