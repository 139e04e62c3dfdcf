-- queue leave: a fair waiter that gives up takes its place out of the queue at once.
-- KEYS[1] the queue (<prefix>queue:<kind>:<name>), KEYS[2] its leases
-- (<prefix>queue-alive:<kind>:<name>); ARGV[1] the waiter. Returns 1. Its prelude is queue.lua.
queue_leave(KEYS[1], KEYS[2], ARGV[1])
return 1
