-- renew many: renew several leases of one server in one call, each exactly as its own
-- renewal would (renew.lua for an elector's lease, lock_refresh.lua for a lock's).
-- Leases are given in order; lease i is the triple ARGV[3i-2] (its kind: 's', a string
-- lease holding its owner; 'h', a lock hash whose 'owner' field holds it), ARGV[3i-1]
-- (its owner) and ARGV[3i] (its TTL in milliseconds).
-- Its key: KEYS[i] where the keys may be declared (one server, or one Cluster slot); on a
-- Cluster node renewing the leases of several of its slots, no key is declared and lease
-- i's key is ARGV[3n+i] (n leases, 4n arguments). A key the node does not serve answers
-- that lease alone with an error, and the client renews it again on its own.
-- Returns one reply per lease, in order: 1 renewed, 0 gone or held by another owner, or
-- the error reply that lease's own renewal would have had.
local n = #KEYS
local keys = KEYS
local base = 0
if n == 0 then
  n = #ARGV / 4
  base = 3 * n
  keys = nil
end
local out = {}
for i = 1, n do
  local key = keys and keys[i] or ARGV[base + i]
  local kind, owner = ARGV[3 * i - 2], ARGV[3 * i - 1]
  local held
  if kind == 'h' then
    held = redis.pcall('HGET', key, 'owner')
  else
    held = redis.pcall('GET', key)
  end
  if type(held) == 'table' then
    out[i] = held
  elseif held == owner then
    local set = redis.pcall('PEXPIRE', key, ARGV[3 * i])
    if kind == 'h' and type(set) ~= 'table' then
      set = 1
    end
    out[i] = set
  else
    out[i] = 0
  end
end
return out
