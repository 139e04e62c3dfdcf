-- semaphore refresh: extend one permit's lease only while it is still live and ours.
-- KEYS[1] the permits (<prefix>sem:<name>), KEYS[2] their details (<prefix>sem-info:<name>)
-- ARGV[1] ownership token, ARGV[2] lease TTL in milliseconds
-- Returns 1 when extended, 0 when the permit expired or was never ours.
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
