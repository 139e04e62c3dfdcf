-- semaphore refresh: extend one lease of a sorted set of leases (member -> expiry by the
-- server's clock) only while it is still live, and keep the set and its companion key
-- alive as long as its longest lease. Two users: a semaphore's permit (KEYS[1] the permits,
-- <prefix>sem:<name>; KEYS[2] their details, <prefix>sem-info:<name>) and a partition
-- group member's heartbeat (KEYS[1] the live members, <name>:members; KEYS[2] the group's
-- partition set, <name>:partitions).
-- ARGV[1] the member (a permit's ownership token, a group member's id), ARGV[2] the lease's
-- TTL in milliseconds
-- Returns 1 when extended, 0 when the lease expired or was never there: a lapsed group
-- member is not brought back here, it joins again (partition_join.lua), which checks its
-- partition set and tells the group.
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
