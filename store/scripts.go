package store

import "github.com/redis/go-redis/v9"

// The Redis store's two Lua scripts. Both begin with
// redis.replicate_commands() so that Redis 3.2 to 4 replicate their effects
// (the default since Redis 5), which reading TIME before writing needs.

// pushScript applies one Batch at most once.
//
//	KEYS: the node's push marker of the group, then one counter per op
//	ARGV: seq, marker TTL (ms), then one delta per op
//	reply: applied before (0 or 1), then per op the counter's value, or
//	an error for a counter that holds something other than an integer
//
// A counter the batch creates expires after its window stops counting
// (store.ExpireAt), computed from the window size and id at the end of its
// key.
var pushScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local seq = tonumber(ARGV[1])
local m = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local dup = m >= seq
local out = {dup and 1 or 0}
for i = 2, #KEYS do
  local d = tonumber(ARGV[i + 1])
  local v
  if dup or d == 0 then
    local s = redis.call('GET', KEYS[i])
    v = tonumber(s or '0')
    if v == nil then v = {err = 'counter holds a value that is not an integer'} end
  else
    v = redis.pcall('INCRBY', KEYS[i], d)
    if v == d then
      local w, id = string.match(KEYS[i], ':(%d+):(%-?%d+)$')
      redis.call('PEXPIREAT', KEYS[i], (tonumber(id) + 2) * tonumber(w) + 60000)
    end
  end
  out[i] = v
end
if not dup then redis.call('SET', KEYS[1], seq, 'PX', ARGV[2]) end
return out
`)

// takeScript decides the TakeRequests of one group, in order, each
// atomically, and at most once: a call sent again (a client retry) returns
// the first run's outcomes.
//
//	KEYS: the node's take marker of the group, then per request and rule
//	      the current window's counter and the previous one's
//	ARGV: seq, marker TTL (ms), deadline (µs), requests, rules, then per
//	      rule: limit, window (ms), fixed (0 or 1), then per request:
//	      cost, flags (1 peek, 2 count denied), now (µs)
//	reply: status (0 decided, 1 decided before, 2 past the deadline,
//	       3 outcome lost), then per request: allowed, then per rule cur
//	       and prev
var takeScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local seq = tonumber(ARGV[1])
local nreq, nrules = tonumber(ARGV[4]), tonumber(ARGV[5])
local ra = 6
local rb = ra + 3 * nrules
local done
local m = redis.call('GET', KEYS[1])
if m then
  local ms, bits = string.match(m, '^(%d+):(.*)$')
  if tonumber(ms) == seq then done = bits elseif tonumber(ms or '0') > seq then return {3} end
end
local status = 0
if done then
  status = 1
else
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000000 + tonumber(t[2]) > tonumber(ARGV[3]) then return {2} end
end
local out = {status}
local bits = {}
local k = 1
for q = 0, nreq - 1 do
  local cost = tonumber(ARGV[rb + 3 * q])
  local flags = tonumber(ARGV[rb + 3 * q + 1])
  local now = tonumber(ARGV[rb + 3 * q + 2])
  local peek, penalty = flags % 2 == 1, math.floor(flags / 2) % 2 == 1
  local cur, prev = {}, {}
  local ok = 1
  for i = 0, nrules - 1 do
    local limit, w, fixed = tonumber(ARGV[ra + 3 * i]), tonumber(ARGV[ra + 3 * i + 1]) * 1000, ARGV[ra + 3 * i + 2] == '1'
    local c = tonumber(redis.call('GET', KEYS[k + 2 * i + 1]) or '0') or 0
    local p = 0
    if not fixed then p = tonumber(redis.call('GET', KEYS[k + 2 * i + 2]) or '0') or 0 end
    cur[i], prev[i] = c, p
    local est = c
    if p > 0 then est = est + p * (w - now % w) / w end
    if est + cost > limit + 1e-9 then ok = 0 end
  end
  if done then
    ok = tonumber(string.sub(done, q + 1, q + 1)) or 0
  elseif not peek and (ok == 1 or penalty) then
    for i = 0, nrules - 1 do
      local key = KEYS[k + 2 * i + 1]
      local v = redis.call('INCRBY', key, cost)
      if v == cost then
        local w = tonumber(ARGV[ra + 3 * i + 1])
        redis.call('PEXPIREAT', key, (math.floor(now / 1000 / w) + 2) * w + 60000)
      end
      cur[i] = v
    end
  end
  bits[#bits + 1] = ok
  out[#out + 1] = ok
  for i = 0, nrules - 1 do
    out[#out + 1] = cur[i]
    out[#out + 1] = prev[i]
  end
  k = k + 2 * nrules
end
if not done then redis.call('SET', KEYS[1], seq .. ':' .. table.concat(bits), 'PX', ARGV[2]) end
return out
`)
