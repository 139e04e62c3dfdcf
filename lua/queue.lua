-- queue: fair waiting, a prelude of the acquire scripts (lock_acquire, sem_acquire).
-- A fair waiter's place is a member of a sorted set by arrival (<prefix>queue:<kind>:<name>,
-- scored in server microseconds) and a short lease of its own
-- (<prefix>queue-alive:<kind>:<name>, member -> alive until, in server ms) that each of its
-- attempts renews. The lease is max(3 x the waiter's retry interval, 100 ms), set by the
-- client: a waiter late by up to two attempts (its thread waited for the GIL or the CPU)
-- keeps its place, one that gives up leaves at once (queue_leave), and one that dies leaves
-- when its lease ends, so no dead waiter holds the others up for longer.
-- A waiter's arrival is when it began waiting: the server's time of its attempt less the
-- microseconds the waiter says it had waited when it sent it (measured on its own monotonic
-- clock), so a waiter whose first attempt was late still queues ahead of those who began
-- after it, and one whose place lapsed while it was stalled comes back to that place.
local function queue_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), tonumber(t[2]) % 1000
end

-- ``waiter``'s place lives ``alive_ms`` from ``now``; both keys live as long as the last place.
local function queue_alive(queue, alive, waiter, alive_ms, now)
  redis.call('ZADD', alive, now + alive_ms, waiter)
  local last = redis.call('ZRANGE', alive, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', queue, tonumber(last[2]) - now)
  redis.call('PEXPIRE', alive, tonumber(last[2]) - now)
end

-- Joins (or renews) ``waiter`` in the queue; true when it is among the first ``slots``.
-- ``waited_us``: how long it has been waiting, in microseconds (0 when not told).
local function queue_turn(queue, alive, waiter, alive_ms, slots, waited_us)
  local now, micros = queue_now()
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', alive, '-inf', now)) do
    redis.call('ZREM', queue, gone)
    redis.call('ZREM', alive, gone)
  end
  if not redis.call('ZSCORE', queue, waiter) then
    local waited = math.max(0, math.floor(tonumber(waited_us) or 0))
    redis.call('ZADD', queue, now * 1000 + micros - waited, waiter)
  end
  queue_alive(queue, alive, waiter, alive_ms, now)
  return redis.call('ZRANK', queue, waiter) < slots
end

local function queue_leave(queue, alive, waiter)
  redis.call('ZREM', queue, waiter)
  redis.call('ZREM', alive, waiter)
end
