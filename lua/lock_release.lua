-- lock release: delete the lock only while it is still ours, leave an acknowledgement,
-- and tell the waiting acquirers at once.
-- KEYS[1] the lock hash (<prefix>key:<name>), KEYS[2] the acknowledgement (<prefix>ack:<owner>)
-- ARGV[1] ownership token, ARGV[2] acknowledgement TTL in milliseconds,
-- ARGV[3] "1" to send the notice in the key's slot (SPUBLISH, Redis Cluster 7+)
-- KEYS[3] (optional) the lock's fair-waiting queue (see queue.lua): its first waiter is
-- told too, on <queue>:<waiter>:released (the others wait for their turn, not a wake-up)
-- Returns 1 when deleted, or when this owner's release already deleted it (a replay);
-- 2 when deleted but the server refused a notice (the user may not publish to the
-- channel); 0 when the lock expired or belongs to another owner, whose lock is left
-- untouched. The notice goes to <lock>:released (only on the delete itself, never on a
-- replay), sent by notify.lua, its prelude.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
  return notify_released(KEYS[1], KEYS[3], 1, '1', ARGV[3] == '1')
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
return 0
