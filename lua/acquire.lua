-- acquire: try to start a leadership term for ARGV[1].
-- KEYS[1] the lock (<name>:leader), KEYS[2] the fence counter (<name>:fence),
-- KEYS[3] the fence high-water mark (<name>:fence:applied)
-- ARGV[1] instance id, ARGV[2] lease TTL in milliseconds
-- Returns {token, pttl, holder}: token >= 1, pttl = the TTL and holder = ARGV[1]
-- when a term starts; token 0, the holder's remaining PTTL and the holder's
-- instance id when another instance holds the lock (so a follower learns who
-- leads without another round trip).
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.call('GET', KEYS[1])
  if holder ~= ARGV[1] then
    return {0, redis.call('PTTL', KEYS[1]), holder}
  end
  -- Our own leftover lock (a release that never arrived, a restart with a
  -- fixed id): take it over at once, as a new term with a fresh token.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
-- Heal the counter if it fell behind the mark (lost, evicted or reset), so
-- the new token is never below a write that was already applied.
local applied = tonumber(redis.call('GET', KEYS[3]) or '0')
if applied and applied > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], redis.call('GET', KEYS[3]))
end
local token = redis.call('INCR', KEYS[2])
-- Copy the counter as a string so large tokens are stored verbatim.
redis.call('SET', KEYS[3], redis.call('GET', KEYS[2]))
return {token, tonumber(ARGV[2]), ARGV[1]}
