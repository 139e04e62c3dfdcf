-- partition release: give partitions back to the group, and tell it at once.
-- KEYS[1] the live members (<name>:members: the group's notices go to <members>:released),
-- KEYS[2..] the partition leases to give back (<name>:p:<partition>:leader)
-- ARGV[1] member id, ARGV[2] "1" to send the notice in the key's slot (SPUBLISH, Redis
-- Cluster 7+), anything else for a plain PUBLISH
-- Deletes each lease only while ARGV[1] holds it (one that expired or moved is left as it
-- is). When any was deleted, the group is told (payload: the member id; sent by notify.lua,
-- its prelude), so the members that take them over do so within milliseconds.
-- Returns {leases deleted, 1 told | 2 the server refused the notice | 0 nothing to tell}.
local released = 0
for i = 2, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('DEL', KEYS[i])
    released = released + 1
  end
end
if released == 0 then
  return {0, 0}
end
return {released, notify_released(KEYS[1], nil, 0, ARGV[1], ARGV[2] == '1')}
