-- notify: release notices, a prelude of the release scripts (release, lock_release,
-- sem_release). A notice goes to the channel in the key's slot (SPUBLISH) when ``sharded``
-- (Redis Cluster 7+), else (or when SPUBLISH is refused) by PUBLISH. A notice the server
-- refuses (an ACL user without the channel) is skipped: the release stands, its waiters
-- poll, and the script's reply says so.

-- True when the notice was sent.
local function announce(channel, payload, sharded)
  if sharded and pcall(redis.call, 'SPUBLISH', channel, payload) then
    return true
  end
  return (pcall(redis.call, 'PUBLISH', channel, payload))
end

-- Tells ``key``'s channel (<key>:released) and, with a fair-waiting ``queue`` (see
-- queue.lua), its first ``first_n`` waiters (<queue>:<waiter>:released).
-- Returns 1 when every notice was sent, 2 when the server refused one.
local function notify_released(key, queue, first_n, payload, sharded)
  local channels = {key .. ':released'}
  if queue and first_n > 0 then
    for _, waiter in ipairs(redis.call('ZRANGE', queue, 0, first_n - 1)) do
      channels[#channels + 1] = queue .. ':' .. waiter .. ':released'
    end
  end
  local told = 1
  for _, channel in ipairs(channels) do
    if not announce(channel, payload, sharded) then
      told = 2
    end
  end
  return told
end
