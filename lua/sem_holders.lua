-- semaphore holders: every live permit of a name, read atomically.
-- KEYS[1] the permits (<prefix>sem:<name>), KEYS[2] their details (<prefix>sem-info:<name>)
-- Returns an array of {holder label, fencing token, pttl in ms}, one per live permit,
-- soonest to expire first (empty when none is live).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('TYPE', KEYS[1])['ok'] ~= 'zset' then
  return {}
end
local found = {}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local owner = live[i]
  local token = tonumber(redis.call('HGET', KEYS[2], 'f:' .. owner))
  if token then
    local label = redis.call('HGET', KEYS[2], 'h:' .. owner) or ''
    found[#found + 1] = {label, token, tonumber(live[i + 1]) - now}
  end
end
return found
