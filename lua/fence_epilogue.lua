-- fence epilogue: runs after the write succeeded (a fragment, not run alone).
-- KEYS[1] the fence high-water mark, ARGV[1] the writer's token
-- Advances the mark to the token, stored verbatim, and returns 1 (applied).
redis.call('SET', KEYS[1], ARGV[1])
return 1
