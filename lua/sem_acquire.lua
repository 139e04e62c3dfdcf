-- semaphore acquire: take one of N permits of a name, each a lease of its own with its own
-- fencing token.
-- KEYS[1] the permits (<prefix>sem:<name>, a sorted set: owner -> expiry in server ms),
-- KEYS[2] their details (<prefix>sem-info:<name>, a hash: 'permits', 'f:<owner>' the
-- fencing token, 'h:<owner>' the holder's label), KEYS[3] the fencing counter (<prefix>fencing)
-- ARGV[1] ownership token (random, one per acquisition), ARGV[2] lease TTL in milliseconds,
-- ARGV[3] permits (N >= 1), ARGV[4] the holder's label
-- Fair waiting (see queue.lua, its prelude): KEYS[4] the queue, KEYS[5] its leases,
-- ARGV[5] how long the waiter's place lives without an attempt, in ms, ARGV[6] (optional)
-- how long it has been waiting, in microseconds (its arrival is back-dated by that): free
-- permits go to the queue's first waiters only.
-- Returns {fencing token, ttl} when a permit is ours; {0, ms until the first permit expires}
-- when all N are taken; {-1, N'} when the live permits were taken with another N'.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local permits = tonumber(ARGV[3])
-- Expired permits free their places: their leases ended at their TTL.
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)) do
  redis.call('ZREM', KEYS[1], gone)
  redis.call('HDEL', KEYS[2], 'f:' .. gone, 'h:' .. gone)
end
local live = redis.call('ZCARD', KEYS[1])
local stored = tonumber(redis.call('HGET', KEYS[2], 'permits'))
if live > 0 and stored and stored ~= permits then
  return {-1, stored}
end
local token = tonumber(redis.call('HGET', KEYS[2], 'f:' .. ARGV[1]))
if not (token and redis.call('ZSCORE', KEYS[1], ARGV[1])) then
  local fair = KEYS[5] ~= nil
  local free = permits - live
  local turn = not fair or queue_turn(KEYS[4], KEYS[5], ARGV[1], tonumber(ARGV[5]), free, ARGV[6])
  if free <= 0 then
    local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, tonumber(first[2]) - now}
  end
  if not turn then
    return {0, 0}
  end
  if fair then
    queue_leave(KEYS[4], KEYS[5], ARGV[1])
  end
  -- A new permit (else a replay of one granted already: the same token).
  token = redis.call('INCR', KEYS[3])
  redis.call('HSET', KEYS[2], 'permits', permits, 'f:' .. ARGV[1], token, 'h:' .. ARGV[1], ARGV[4])
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
-- Both keys live as long as the longest permit.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], tonumber(last[2]) - now)
redis.call('PEXPIRE', KEYS[2], tonumber(last[2]) - now)
return {token, ttl}
