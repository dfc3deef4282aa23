package store

import "github.com/redis/go-redis/v9"

// The Redis store's two Lua scripts, which both begin with prelude.

// luaScript is a script and its text, which a call sends when the server
// does not know its hash.
type luaScript struct {
	*redis.Script
	src string
}

func newScript(src string) luaScript { return luaScript{redis.NewScript(src), src} }

// prelude begins both scripts: Redis 3.2 to 4 replicate their effects
// (the default since Redis 5), which reading TIME before writing needs;
// maxahead is local.MaxAhead in µs, the furthest past now an arrival time
// runs; exact tells a number Lua holds exactly as an integer (below 2^53
// in magnitude), what a counter the library wrote holds.
const prelude = `if redis.replicate_commands then redis.replicate_commands() end
local maxahead = 2305843009213693
local function exact(x) return x ~= nil and x % 1 == 0 and x < 9007199254740992 and x > -9007199254740992 end`

// pushScript applies one or more Batches, each at most once, in order.
//
//	KEYS: the first batch's keys: the node's push marker of its group,
//	      then one counter per op: the ops on a window's count first,
//	      then those on an arrival time
//	ARGV: the marker TTL (ms), then per batch: its number of ops n, seq,
//	      the number of count ops, the largest delta of a count op, the
//	      seq of the batch of its group before it in the pipeline (0:
//	      none); for every batch but the first, its n+1 keys as in KEYS;
//	      then per op its delta, and per arrival-time op its rate (µs)
//	reply: per batch an array: applied before (0 or 1), then per op the
//	counter's value, or an error for a counter that holds something
//	other than an integer of magnitude below 2^53 (a foreign value, which
//	the op leaves as it is; the batch's other ops are applied); or an
//	error, for a batch the script refused whole
//
// A batch not applied before whose predecessor in the pipeline was not
// applied either (the marker is below its seq) is refused, and changes
// nothing: the marker must never pass a batch of the group that did not
// run. In a Redis Cluster the server checks only the keys a call
// declares, the first batch's, before the script runs; a later batch's
// keys, in one slot as every batch's, are checked by one EXISTS of them
// all first, which fails when their slot is served elsewhere or moves
// away with some of them missing: such a batch is refused too, before it
// changes anything, and one call carries the batches of many slots.
//
// A count the batch creates expires once no window counts it
// (store.ExpireAt), computed from the window, span and id at the end of its
// key. An arrival time moves delta intervals past max(itself, TIME), at
// most local.MaxAhead past TIME (maxahead, µs), and expires a minute after
// it has passed. A count op takes one argument, not two: the server
// parses a batch's arguments before the script runs, and a second one per
// op cost about a tenth of the script's time.
var pushScript = newScript(prelude + `
local call, pcall = redis.call, redis.pcall
local ttl = ARGV[1]
local now
-- read returns a counter's value, or an error (a table) when the key holds
-- something else than an integer below 2^53 in magnitude: a foreign value
-- fails its own op, never the script, which would leave the ops before it
-- applied and the batch reported failed.
local function read(key)
  local s = pcall('GET', key)
  if not s then return 0 end
  if type(s) == 'table' then return s end
  local v = tonumber(s)
  if exact(v) then return v end
  return {err = 'counter holds a value that is not an integer'}
end
-- push applies the batch whose arguments begin at ARGV[a]; keys[k] is its
-- marker, keys[k + j] the counter of its j-th op; its deltas begin at
-- ARGV[d].
local function push(keys, k, a, d)
  local n, seq = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local counts, maxd = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if keys ~= KEYS then
    local e = pcall('EXISTS', unpack(keys, k, k + n))
    if type(e) == 'table' then return e end
  end
  local m = tonumber(call('GET', keys[k]) or '0') or 0
  local dup = m >= seq
  if not dup and m < tonumber(ARGV[a + 4]) then
    return redis.error_reply('ERR the batch before this one in its group was not applied')
  end
  local out = {dup and 1 or 0}
  for j = 1, counts do
    -- The delta goes to INCRBY as the string it came as: a Lua number would
    -- be formatted back into one, which costs more than the INCRBY.
    local key, ds = keys[k + j], ARGV[d + j - 1]
    local v
    if dup or ds == '0' then
      v = read(key)
    else
      v = pcall('INCRBY', key, ds)
      if type(v) ~= 'number' then
        -- an error reply: a foreign value, left as it is
      elseif v >= 9007199254740992 or v <= -9007199254740992 then
        -- (an integer reply: exact but for its magnitude)
        call('DECRBY', key, ds) -- a foreign count: leave it as it was
        v = {err = 'counter holds an integer out of range'}
      elseif v <= maxd and v == tonumber(ds) then
        -- A new counter (one above maxd held counts before: no need to
        -- parse the delta).
        local w, span, id = string.match(key, ':(%d+)x?(%d*):(%-?%d+)$')
        local sp = tonumber(span) or 1
        call('PEXPIREAT', key, (tonumber(id) + 1 + sp) * tonumber(w) + 60000)
      end
    end
    out[1 + j] = v
  end
  for j = counts + 1, n do
    local key, ds = keys[k + j], ARGV[d + j - 1]
    local v
    if dup or ds == '0' then
      v = read(key)
    else
      local dl, rate = tonumber(ds), tonumber(ARGV[d + n + j - counts - 1])
      if not now then
        local t = call('TIME')
        now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      local tat = read(key)
      if type(tat) == 'number' then
        if dl > 0 and tat < now then tat = now end
        tat = math.min(math.max(tat + dl * rate, now - maxahead), now + maxahead)
        call('SET', key, tat, 'PX', math.floor(math.max(tat - now, 0) / 1000) + 60000)
      end
      v = tat
    end
    out[1 + j] = v
  end
  -- A batch sent again renews the marker: the call writes, so WAIT on its
  -- connection covers the first run's writes (from Redis 7.2 a connection's
  -- offset moves only with commands that write).
  if not dup then call('SET', keys[k], ARGV[a + 1], 'PX', ttl) else call('PEXPIRE', keys[k], ttl) end
  return out
end
local replies = {}
local a = 2
while a <= #ARGV do
  local n, counts = tonumber(ARGV[a]), tonumber(ARGV[a + 2])
  local keys, k, d = KEYS, 1, a + 5
  if a > 2 then keys, k, d = ARGV, a + 5, a + n + 6 end
  replies[#replies + 1] = push(keys, k, a, d)
  a = d + n + n - counts
end
return replies
`)

// takeScript decides the TakeRequests of one group, in order, each
// atomically, and at most once: a call sent again (a client retry) returns
// the first run's outcomes. Instants and windows are in microseconds.
//
//	KEYS: the node's take marker of the group, then per request and rule:
//	      kind 0 (sliding): the current window's counter, the previous
//	      one's and the next one's; 1 (fixed): the current one's; 2
//	      (buckets): the window's buckets, oldest first, then the next
//	      bucket; 3 (log): the key's log; 4 (gcra, leaky): the arrival
//	      time
//	ARGV: seq, marker TTL (ms), deadline, requests, rules, then per rule:
//	      kind, limit, w (the counter's window; gcra: the interval),
//	      span (buckets: their number; log: the length kept; gcra: the
//	      burst), the longest log window (its newest entry no longer
//	      counts after it; the log expires a minute later); then per
//	      request: cost, flags
//	      (1 peek, 2 count denied), now
//	reply: status (0 decided, 1 decided before, 2 past the deadline,
//	       3 outcome lost), then per request: allowed (2: not decided, a
//	       counter or log holds a foreign value), then per rule:
//	       sliding: cur, prev, late; fixed: cur; buckets: the counts,
//	       late; log: the count, the wait until the request fits, until
//	       the newest leaves; gcra: the arrival time minus now
//
// A request is late for a sliding or bucketed rule when the next window
// (bucket) past its instant already holds counts: a node whose clock is
// ahead, or a request sent earlier but stamped later, counted there. It is
// then decided at the start of that window (bucket), on the counts there
// (late 1 in the reply), and counted in it: decided at its own instant, it
// would miss those counts and admit past the limit. (A node's clock behind
// the others' by more than a window or bucket still would.)
// A decision moves an arrival time at most local.MaxAhead (maxahead, µs)
// past now. A request whose counters or log hold something the script
// cannot count on (a string that is not an integer of magnitude below
// 2^53, a log that is not a list of numbers, a counter INCRBY refuses) is
// not decided and changes nothing; the other requests of the call are
// decided. A hash or list at a counter reads as absent (MGET): a decision
// that only reads it, or an arrival time, which SET replaces, treats it so.
var takeScript = newScript(prelude + `
-- The client's numbers are converted by arithmetic (ARGV[i] + 0), which
-- costs the server half what a call of tonumber does; what the store
-- holds, which may be foreign, goes through tonumber. A call builds as few
-- tables as it can: each costs the server about as much as counting a
-- request.
local call, pcall = redis.call, redis.pcall
local seq = ARGV[1] + 0
local nreq, nrules = ARGV[4] + 0, ARGV[5] + 0
local ra = 6
local rb = ra + 5 * nrules
local done
local m = call('GET', KEYS[1])
if m then
  local ms, bits = string.match(m, '^(%d+):(.*)$')
  local mseq = tonumber(ms) or 0
  if mseq == seq then done = bits elseif mseq > seq then return {3} end
end
local status = 0
if done then
  status = 1
else
  local t = call('TIME')
  if t[1] * 1000000 + t[2] > ARGV[3] + 0 then return {2} end
end
-- The rules' parameters, in one table (sized for one rule): rule i's from
-- o = 7 * (i - 1) on, kind at o + 1, limit o + 2, w o + 3, span o + 4, the
-- longest log window o + 5, its number of keys o + 6, and o + 7 where the
-- request being decided has its values for the rule in out. nk: the keys
-- of a request; later: a rule written after the counts (log, gcra).
local rule = {0, 0, 0, 0, 0, 0, 0}
local haslog, later, nk, b = false, false, 0, ra
for o = 0, 7 * (nrules - 1), 7 do
  local kd, sp = ARGV[b] + 0, ARGV[b + 3] + 0
  local n = 1
  if kd == 0 then n = 3 elseif kd == 2 then n = sp + 1 end
  if kd == 3 then haslog = true end
  if kd >= 3 then later = true end
  nk = nk + n
  rule[o + 1], rule[o + 2], rule[o + 3], rule[o + 4] = kd, ARGV[b + 1] + 0, ARGV[b + 2] + 0, sp
  rule[o + 5], rule[o + 6], rule[o + 7] = ARGV[b + 4] + 0, n, 0
  b = b + 5
end
local last = 7 * (nrules - 1)
-- Every counter of the call (not the logs) is read by MGET at once, a
-- command per 256 keys rather than per key, into got, which the call's
-- writes keep current.
local got = {}
local list, from, to = KEYS, 2, #KEYS
if haslog then
  local kk = 2
  list, from, to = {}, 1, 0
  for _ = 1, nreq do
    for o = 0, last, 7 do
      local nk = rule[o + 6]
      if rule[o + 1] ~= 3 then
        for j = 0, nk - 1 do to = to + 1; list[to] = KEYS[kk + j] end
      end
      kk = kk + nk
    end
  end
end
for a = from, to, 256 do
  local b = a + 255
  if b > to then b = to end
  local v = call('MGET', unpack(list, a, b))
  for j = 1, b - a + 1 do
    local s, x = v[j], 0
    if s then
      x = tonumber(s)
      if not (x and x % 1 == 0 and x < 9007199254740992 and x > -9007199254740992) then
        x = false -- read as 0, and fails the requests that read it
      end
    end
    got[list[a + j - 1]] = x
  end
end
local failed
-- Per rule (by o): 1 when the request is late for it (counted in the next
-- window or bucket), and the counter the request increments.
local late, incd = {}, {}
-- A request's reply goes straight into out: its outcome at op, then each
-- rule's values from rule[o + 7] on (a table per request and rule costs
-- the server more than the counting).
local out, no = {status}, 1
-- The outcomes as digits (not formatted from numbers), for the marker: in
-- marks when the call carries several requests, else in mark.
local marks, mark = nreq > 1 and {}, ''
local k = 2
for q = 0, nreq - 1 do
  -- The cost goes to INCRBY as the string it came as, and the flags (0
  -- to 3) are compared as strings: a Lua number formatted back into a
  -- string, or a string parsed, costs more than the INCRBY.
  local cs, fs = ARGV[rb + 3 * q], ARGV[rb + 3 * q + 1]
  local cost, now = cs + 0, ARGV[rb + 3 * q + 2] + 0
  local peek, penalty = fs == '1' or fs == '3', fs == '2' or fs == '3'
  local ok = 1
  no = no + 1
  local op = no
  out[op] = 0
  local kk = k
  failed = false
  for o = 0, last, 7 do
    local kd, L, w = rule[o + 1], rule[o + 2], rule[o + 3]
    rule[o + 7] = no + 1
    if kd == 0 or kd == 1 then
      local c, p = got[KEYS[kk]], 0
      local at, sh = now, 0
      if kd == 0 then
        p = got[KEYS[kk + 1]]
        local nx = got[KEYS[kk + 2]]
        if nx and nx > 0 then sh, at, p, c = 1, (math.floor(now / w) + 1) * w, c, nx end
      end
      late[o] = sh
      if not (c and p) then failed, c, p = true, c or 0, p or 0 end
      -- The estimate as local.Rule.Admits computes it, operation for
      -- operation in doubles (in ns: the window, the time left in it, the
      -- inverse of the window), so that both decide alike to the last bit
      -- also where a limit is too large for the slack to absorb rounding.
      local est = c
      if p > 0 then est = p * ((w - at % w) * 1000) * (1 / (w * 1000)) + c end
      if est + cost > L + 1e-9 then ok = 0 end
      out[no + 1] = c
      if kd == 0 then out[no + 2], out[no + 3], no = p, sh, no + 3 else no = no + 1 end
    elseif kd == 2 then
      local sum, sp, sh = 0, rule[o + 4], 0
      local nx = got[KEYS[kk + sp]]
      if nx and nx > 0 then sh = 1 end
      late[o] = sh
      for j = 1, sp do
        local v = got[KEYS[kk + j - 1 + sh]]
        if not v then failed, v = true, 0 end
        out[no + j] = v
        sum = sum + v
      end
      out[no + sp + 1] = sh
      no = no + sp + 1
      if sum + cost > L then ok = 0 end
    elseif kd == 3 then
      local key = KEYS[kk]
      local since = now - w
      local lo, hi = 0, pcall('LLEN', key)
      local expire, reset = 0, 0
      if type(hi) ~= 'number' then failed, hi = true, 0 end
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local x = tonumber(call('LINDEX', key, mid))
        if not x then failed, hi = true, lo elseif x > since then lo = mid + 1 else hi = mid end
      end
      if lo + cost > L and not failed then
        ok = 0
        local x = tonumber(call('LINDEX', key, L - cost))
        if x then expire = x + w - now else failed = true end
      end
      if lo > 0 and not failed then
        local x = tonumber(call('LINDEX', key, 0))
        if x then reset = x + w - now else failed = true end
      end
      out[no + 1], out[no + 2], out[no + 3], no = lo, expire, reset, no + 3
    else
      local tat = got[KEYS[kk]]
      if not tat then failed, tat = true, 0 end
      if math.max(tat, now) + cost * w - now > rule[o + 4] * w then ok = 0 end
      out[no + 1], no = tat - now, no + 1
    end
    kk = kk + rule[o + 6]
  end
  if done then
    ok = tonumber(string.sub(done, q + 1, q + 1)) or 0
  elseif failed then
    ok = 2
  elseif not peek and (ok == 1 or penalty) then
    -- The counts first, the only writes that can fail (a hash or list
    -- reads as absent, an INCRBY can overflow): one that does takes back
    -- the request's others, and the request changes nothing.
    kk = k
    for o = 0, last, 7 do
      local kd = rule[o + 1]
      if kd <= 2 then
        local key, sp, sh = KEYS[kk], 1, late[o] or 0
        if kd == 2 then sp = rule[o + 4]; key = KEYS[kk + sp - 1 + sh] elseif sh == 1 then key = KEYS[kk + 2] end
        incd[o] = key
        local v = pcall('INCRBY', key, cs)
        if type(v) ~= 'number' then
          -- The rules before this one counted: take their counts back.
          for ob = 0, o - 7, 7 do
            if rule[ob + 1] <= 2 then
              got[incd[ob]] = call('INCRBY', incd[ob], -cost)
            end
          end
          ok = 2
          break
        end
        got[key] = v
        if v == cost then
          local w = rule[o + 3]
          call('PEXPIREAT', key, (math.floor(now / w) + sh + 1 + sp) * (w / 1000) + 60000)
        end
        out[rule[o + 7] + sp - 1] = v
      end
      kk = kk + rule[o + 6]
    end
    -- Then the writes that cannot fail (log, gcra), when a rule has them
    -- and the counts were written.
    if later and ok ~= 2 then
      local logged = false
      kk = k
      for o = 0, last, 7 do
        local kd = rule[o + 1]
        if kd <= 2 then
          -- counted above
        elseif kd == 3 then
          local w, L = rule[o + 3], rule[o + 2]
          if not logged then
            local key, at = KEYS[kk], now
            local head = tonumber(call('LINDEX', key, 0))
            if head and head > at then at = head end
            for _ = 1, cost do call('LPUSH', key, at) end
            call('LTRIM', key, 0, rule[o + 4] - 1)
            -- Kept a minute past the instant its newest entry stops
            -- counting, as counters are: a node's clock ahead of the
            -- server's, or a slow caller, must not see it vanish early.
            call('PEXPIRE', key, math.floor((rule[o + 5] + at - now) / 1000) + 60000)
            logged = true
          end
          local a = rule[o + 7]
          out[a] = out[a] + cost
          out[a + 2] = w
          if ok == 0 then
            -- A denied request charged by CountDenied waits for its own
            -- entries to leave too: until the (limit - cost + 1)-th newest
            -- has left the window.
            local e = 0
            if out[a] + cost > L then
              local x = tonumber(call('LINDEX', KEYS[kk], L - cost))
              if x then e = x + w - now end
            end
            out[a + 1] = e
          end
        else
          local key, w = KEYS[kk], rule[o + 3]
          local tat = math.min(math.max(got[key], now) + cost * w, now + maxahead)
          call('SET', key, tat, 'PX', math.floor((tat - now) / 1000) + 60000)
          got[key] = tat
          out[rule[o + 7]] = tat - now
        end
        kk = kk + rule[o + 6]
      end
    end
  end
  local d = '2'
  if ok == 1 then d = '1' elseif ok == 0 then d = '0' end
  if marks then marks[q + 1] = d else mark = d end
  out[op] = ok
  k = k + nk
end
if done then
  call('PEXPIRE', KEYS[1], ARGV[2]) -- a call sent again writes, as in the push script
else
  if marks then mark = table.concat(marks) end
  call('SET', KEYS[1], ARGV[1] .. ':' .. mark, 'PX', ARGV[2])
end
return out
`)
