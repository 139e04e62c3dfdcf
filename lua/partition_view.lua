-- partition view: a group's live members and who holds each partition, read atomically.
-- KEYS[1] the live members (<name>:members, a sorted set: member -> expiry in server ms),
-- KEYS[2..] partition leases (<name>:p:<partition>:leader, each an elector's lease), none
-- to read the members alone
-- Returns {members, holders, pttls}: the live members' ids (soonest expiry first); per lease
-- key, in order, the holder's id ('' when free) and the lease's remaining ms (-2 when free).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local members = {}
if redis.call('TYPE', KEYS[1])['ok'] == 'zset' then
  members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
end
local holders, pttls = {}, {}
for i = 2, #KEYS do
  local holder = redis.call('GET', KEYS[i])
  if holder then
    holders[i - 1] = holder
    pttls[i - 1] = redis.call('PTTL', KEYS[i])
  else
    holders[i - 1] = ''
    pttls[i - 1] = -2
  end
end
return {members, holders, pttls}
