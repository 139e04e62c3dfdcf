-- semaphore force release: take one live permit of a semaphore away from its holder, for an
-- operator (redlease locks --release NAME --permit TOKEN).
-- KEYS[1] the permits (<prefix>sem:<name>, a sorted set: owner -> expiry in server ms),
-- KEYS[2] their details (<prefix>sem-info:<name>: 'permits', 'f:<owner>' the fencing token,
-- 'h:<owner>' the holder's label), KEYS[3] the fencing counter (<prefix>fencing)
-- ARGV[1] the fencing token of the permit to take, ARGV[2] "1" to send the notice in the
-- key's slot (SPUBLISH, Redis Cluster 7+)
-- KEYS[4] (optional) the semaphore's fair-waiting queue (see queue.lua): its first waiters,
-- as many as permits are free, are told too
-- Returns {mark, holder}: with a live permit of that token, the permit is removed (its
-- holder's refresh and release find it gone, and it leaves no acknowledgement, so that
-- release reports the permit lost) and the fencing counter moved past its token; mark is
-- the counter's new value and holder the permit's label, or its ownership token when it has
-- none. Without one, nothing changes: mark is the counter's value (0 when none), holder "".
-- Waiters are told at once (notify.lua, its prelude), as on a release.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = tonumber(ARGV[1])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for _, owner in ipairs(live) do
  if tonumber(redis.call('HGET', KEYS[2], 'f:' .. owner)) == token then
    local holder = redis.call('HGET', KEYS[2], 'h:' .. owner)
    if not holder or holder == '' then
      holder = owner
    end
    redis.call('ZREM', KEYS[1], owner)
    redis.call('HDEL', KEYS[2], 'f:' .. owner, 'h:' .. owner)
    local free = (tonumber(redis.call('HGET', KEYS[2], 'permits')) or 1) - (#live - 1)
    if redis.call('ZCARD', KEYS[1]) == 0 then
      redis.call('DEL', KEYS[2])
    end
    local mark = redis.call('INCR', KEYS[3])
    notify_released(KEYS[1], KEYS[4], math.max(free, 0), '1', ARGV[2] == '1')
    return {mark, holder}
  end
end
return {tonumber(redis.call('GET', KEYS[3]) or '0'), ''}
