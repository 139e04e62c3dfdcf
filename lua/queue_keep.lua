-- queue keep: hold a fair waiter's place in its queue (see queue.lua) while it waits, from
-- the renewer's thread, so the place does not lapse when the waiter's own thread is late
-- (it waits for the GIL or the CPU); when its process dies the renewals stop with it.
-- KEYS[1] the queue (<prefix>queue:<kind>:<name>), KEYS[2] its leases
-- (<prefix>queue-alive:<kind>:<name>); ARGV[1] the waiter, ARGV[2] how long its place lives
-- from now, in ms. Its prelude is queue.lua.
-- Returns 1 when the place was renewed; 0 when it is gone (served, left, or lapsed: a lapsed
-- place is not brought back here; the waiter's next attempt takes it again).
local now = queue_now()
local until_ms = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]))
if not (until_ms and until_ms > now and redis.call('ZSCORE', KEYS[1], ARGV[1])) then
  return 0
end
queue_alive(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), now)
return 1
