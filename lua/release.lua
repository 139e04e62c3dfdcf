-- release: delete the lock only while it is still ours, and tell the waiting
-- contenders at once so one of them takes over without waiting for its poll.
-- KEYS[1] the lock (<name>:leader)
-- ARGV[1] instance id; ARGV[2] "1" to send the notice in the key's slot
-- (SPUBLISH, Redis Cluster 7+), anything else for a plain PUBLISH
-- Returns 1 when deleted, 0 when the lock is gone or held by another instance.
-- The notice goes to the channel <lock>:released; contenders that do not
-- listen (older versions, other languages) keep polling as before.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local channel = KEYS[1] .. ':released'
  if ARGV[2] ~= '1' or not pcall(redis.call, 'SPUBLISH', channel, ARGV[1]) then
    redis.call('PUBLISH', channel, ARGV[1])
  end
  return 1
end
return 0
