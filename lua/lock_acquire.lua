-- lock acquire: take the lock for one acquisition and allocate its fencing token.
-- KEYS[1] the lock hash (<prefix>key:<name>), KEYS[2] the fencing counter (<prefix>fencing)
-- ARGV[1] ownership token (random, one per acquisition), ARGV[2] lease TTL in milliseconds,
-- ARGV[3] (optional) the holder's label, for people: stored as the hash's 'holder' field,
-- never used for ownership
-- Fair waiting (see queue.lua, its prelude): KEYS[3] the queue, KEYS[4] its leases,
-- ARGV[4] how long the waiter's place lives without an attempt, in ms, ARGV[5] (optional)
-- how long it has been waiting, in microseconds (its arrival is back-dated by that): the
-- lock goes to the queue's first waiter only.
-- Returns {fencing token, pttl}: token >= 1 and pttl = the TTL when the lock is ours;
-- token 0 and the holder's remaining PTTL when another owner holds it.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  -- A replay of an acquisition that already succeeded (its reply was lost):
  -- the same lease, so the original token, never a false conflict.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {tonumber(redis.call('HGET', KEYS[1], 'fencing')), tonumber(ARGV[2])}
end
local fair = KEYS[4] ~= nil
local turn = not fair or queue_turn(KEYS[3], KEYS[4], ARGV[1], tonumber(ARGV[4]), 1, ARGV[5])
if owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
if not turn then
  return {0, 0}
end
if fair then
  queue_leave(KEYS[3], KEYS[4], ARGV[1])
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fencing', token)
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'holder', ARGV[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {token, tonumber(ARGV[2])}
