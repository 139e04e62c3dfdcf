-- partition heartbeat: keep a member live in its group (the renewer sends it, like a renewal).
-- KEYS[1] the live members (<name>:members, a sorted set: member -> expiry in server ms),
-- KEYS[2] the group's partition set (<name>:partitions)
-- ARGV[1] member id, ARGV[2] heartbeat TTL in milliseconds
-- Returns 1 when renewed; 0 when the member is no longer live (its heartbeat lapsed, or it
-- left): a lapsed member is not brought back here, it joins again (partition_join.lua),
-- which checks its partition set and tells the group.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if not expiry or expiry <= now then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
redis.call('PEXPIRE', KEYS[2], tonumber(last[2]) - now)
return 1
