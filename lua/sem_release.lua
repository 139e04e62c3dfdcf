-- semaphore release: give one permit back only while it is still live and ours, leave an
-- acknowledgement, and tell the waiting acquirers at once.
-- KEYS[1] the permits (<prefix>sem:<name>), KEYS[2] their details (<prefix>sem-info:<name>),
-- KEYS[3] the acknowledgement (<prefix>ack:<owner>)
-- ARGV[1] ownership token, ARGV[2] acknowledgement TTL in milliseconds,
-- ARGV[3] "1" to send the notice in the key's slot (SPUBLISH, Redis Cluster 7+)
-- KEYS[4] (optional) the semaphore's fair-waiting queue (see queue.lua): its first
-- waiters, as many as permits are free, are told too, on <queue>:<waiter>:released
-- Returns 1 when given back, or when this owner's release already did (a replay); 2 when
-- given back but the server refused a notice (the user may not publish to the channel);
-- 0 when the permit expired or was never ours.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))
if expiry and expiry > now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], 'f:' .. ARGV[1], 'h:' .. ARGV[1])
  local live = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
  local free = (tonumber(redis.call('HGET', KEYS[2], 'permits')) or 1) - live
  if redis.call('ZCARD', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[2])
  end
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
  return notify_released(KEYS[1], KEYS[4], math.max(free, 0), '1', ARGV[3] == '1')
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 1
end
return 0
