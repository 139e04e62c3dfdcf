-- fenced HSET body (wrapped in fence_guard + body + fence_epilogue).
-- KEYS[2] the hash, ARGV[2] the field, ARGV[3] the value
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
