-- release: delete the lock only while it is still ours, and tell the waiting
-- contenders at once so one of them takes over without waiting for its poll.
-- KEYS[1] the lock (<name>:leader)
-- ARGV[1] instance id; ARGV[2] "1" to send the notice in the key's slot
-- (SPUBLISH, Redis Cluster 7+), anything else for a plain PUBLISH
-- Returns 1 when deleted, 2 when deleted but the server refused the notice (the
-- user may not publish to the channel), 0 when the lock is gone or held by
-- another instance. The notice goes to the channel <lock>:released; contenders
-- that do not listen (older versions, other languages) keep polling as before.
-- The notice is sent by notify.lua, its prelude.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return notify_released(KEYS[1], nil, 0, ARGV[1], ARGV[2] == '1')
end
return 0
