-- queue: fair waiting, a prelude of the acquire scripts (lock_acquire, sem_acquire).
-- A fair waiter's place is a member of a sorted set by arrival (<prefix>queue:<kind>:<name>)
-- and a short lease of its own (<prefix>queue-alive:<kind>:<name>, member -> alive until,
-- in server ms) that each of its attempts renews: a waiter that gives up or dies leaves the
-- queue when that lease ends, so no dead waiter holds the others up for longer.
local function queue_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), tonumber(t[2]) % 1000
end

-- Joins (or renews) ``waiter`` in the queue; true when it is among the first ``slots``.
local function queue_turn(queue, alive, waiter, alive_ms, slots)
  local now, micros = queue_now()
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('ZREM', queue, gone)
    redis.call('ZREM', alive, gone)
  end
  if not redis.call('ZSCORE', queue, waiter) then
    redis.call('ZADD', queue, now * 1000 + micros, waiter)
  end
  redis.call('ZADD', alive, now + alive_ms, waiter)
  local last = redis.call('ZRANGE', alive, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', queue, tonumber(last[2]) - now)
  redis.call('PEXPIRE', alive, tonumber(last[2]) - now)
  return redis.call('ZRANK', queue, waiter) < slots
end

local function queue_leave(queue, alive, waiter)
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', alive, waiter)
end
