-- fence guard: the prologue of every fenced write (a fragment, not run alone).
-- KEYS[1] the fence high-water mark (<name>:fence:applied)
-- ARGV[1] the writer's fencing token, as a decimal string
-- Returns 0 (write skipped) when the token is below 1 or below the mark.
local fence_applied = tonumber(redis.call('GET', KEYS[1]) or '0')
local fence_token = tonumber(ARGV[1])
if fence_token < 1 or fence_token < fence_applied then
  return 0
end
