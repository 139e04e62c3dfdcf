-- lock holder: who holds a lock now, read atomically with its fencing token and remaining time.
-- KEYS[1] the lock hash (<prefix>key:<name>)
-- Returns {holder label, fencing token, pttl in ms}, or nil when nobody holds it
-- (no key, or a key that is not a live lease of ours). A lease written without a
-- label reads with an empty one.
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then
  return nil
end
local fields = redis.call('HMGET', KEYS[1], 'owner', 'fencing', 'holder')
local token = tonumber(fields[2])
local pttl = redis.call('PTTL', KEYS[1])
if not fields[1] or not token or pttl < 0 then
  return nil
end
return {fields[3] or '', token, pttl}
