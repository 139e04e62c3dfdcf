-- fenced SET body (wrapped in fence_guard + body + fence_epilogue).
-- KEYS[2] the key, ARGV[2] the value
redis.call('SET', KEYS[2], ARGV[2])
