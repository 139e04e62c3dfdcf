-- lock refresh: extend the lease only while it is still ours.
-- KEYS[1] the lock hash (<prefix>key:<name>)
-- ARGV[1] ownership token, ARGV[2] lease TTL in milliseconds
-- Returns 1 when extended, 0 when the lock expired or belongs to another owner.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
