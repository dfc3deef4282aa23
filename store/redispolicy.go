package store

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// A prefix's policies are one hash and a version counter, both in the hash
// slot of the prefix (so that one script changes both, also in a Redis
// Cluster): "<prefix>:pol:{<prefix>}" and "<prefix>:polv:{<prefix>}".
//
// A change sets the version to the server's TIME in µs, or to the version
// plus one if that is larger (changes less than a µs apart). A server
// runs one script at a time, each longer than a µs, so a version is never
// above its change's instant: after the counter is lost (a restart
// without persistence, a flush), the next change's version is above every
// version handed out before, where a plain INCR would start again from 1
// and repeat versions that nodes still hold.

func policyKeys(prefix string) []string {
	return []string{prefix + ":pol:{" + prefix + "}", prefix + ":polv:{" + prefix + "}"}
}

// bumpPolicyLua sets KEYS[2], the version, to the server's time in µs or
// to the version plus one, whichever is larger, and returns it. A version
// at or past the time (one past 2^53, written by another program, among
// them) is incremented by INCR, which counts it exactly. A script that
// reads TIME and then writes needs effects replication, the default from
// Redis 5, which the first line asks of Redis 3.2 to 4 (as prelude does).
const bumpPolicyLua = `if redis.replicate_commands then redis.replicate_commands() end
local function bump()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local cur = tonumber(redis.call('GET', KEYS[2]) or '0')
  if cur and cur < now then
    redis.call('SET', KEYS[2], string.format('%d', now))
    return now
  end
  return redis.call('INCR', KEYS[2])
end
`

// prunePolicyLua removes the fields of KEYS[1] that ended before now.
const prunePolicyLua = `
local function prune(now)
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local u = tonumber(string.match(all[i + 1], '^(%d+)|'))
    if u and u ~= 0 and u <= now then redis.call('HDEL', KEYS[1], all[i]) end
  end
end
`

// putPolicyScript: ARGV field, value, now (ms). Returns the new version.
var putPolicyScript = redis.NewScript(bumpPolicyLua + prunePolicyLua + `
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
prune(tonumber(ARGV[3]))
return bump()
`)

// deletePolicyScript: ARGV field. Returns 1 if it was there.
var deletePolicyScript = redis.NewScript(bumpPolicyLua + `
local n = redis.call('HDEL', KEYS[1], ARGV[1])
if n > 0 then bump() end
return n
`)

// escalateScript: ARGV key, reason, now, base, max, forget (ms). Returns
// the block in force: until, strikes, reason.
// Counts another program wrote saturate to 0 to MaxStrikes, as the Go
// side reads them; an until past 2^63 is not a block, as it fails Go's
// ParseInt. Checked arguments: base ≥ 1 ms, so the doubling ends. Numbers
// are written with %d: Lua's own conversion writes one of 15 digits or
// more (an until from 10^14 ms on) in exponent form, which no reader parses.
var escalateScript = redis.NewScript(bumpPolicyLua + prunePolicyLua + `
local now, base, max, forget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function count(n)
  n = tonumber(n)
  if n < 0 then return 0 end
  if n > ` + strconv.Itoa(MaxStrikes) + ` then return ` + strconv.Itoa(MaxStrikes) + ` end
  return n
end
local cur = redis.call('HGET', KEYS[1], 'b:' .. ARGV[1])
if cur then
  local u, n, r = string.match(cur, '^(%d+)|(-?%d+)|(.*)$')
  if u and tonumber(u) < 2^63 and (tonumber(u) == 0 or tonumber(u) > now) then return {tonumber(u), count(n), r} end
end
local strikes = 0
local s = redis.call('HGET', KEYS[1], 's:' .. ARGV[1])
if s then
  local u, n = string.match(s, '^(%d+)|(-?%d+)|')
  if u and tonumber(u) > now then strikes = count(n) end
end
if strikes < ` + strconv.Itoa(MaxStrikes) + ` then strikes = strikes + 1 end
local d = base
for _ = 2, strikes do
  if d >= max then break end
  d = d * 2
end
if d > max then d = max end
local untl = now + d
redis.call('HSET', KEYS[1], 'b:' .. ARGV[1], string.format('%d|%d|', untl, strikes) .. ARGV[2])
redis.call('HSET', KEYS[1], 's:' .. ARGV[1], string.format('%d|%d|', untl + forget, strikes))
prune(now)
bump()
return {untl, strikes, ARGV[2]}
`)

// policiesScript returns the version, then the hash's fields and values.
var policiesScript = redis.NewScript(`
local v = tonumber(redis.call('GET', KEYS[2]) or '0')
local out = {v}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all do out[#out + 1] = all[i] end
return out
`)

// PutPolicy implements PolicyStore.
func (s *Redis) PutPolicy(ctx context.Context, prefix string, p Policy, now int64) error {
	if err := checkPolicy(&p); err != nil {
		return err
	}
	s.calls.Add(1)
	_, err := boundedCall(s, ctx, func() (any, error) {
		return nil, putPolicyScript.Run(ctx, s.c, policyKeys(prefix), policyField(p.Kind, p.Key), policyValue(&p), now).Err()
	})
	if err != nil {
		return fmt.Errorf("store: redis: put %v of key %q: %w", p.Kind, p.Key, err)
	}
	return nil
}

// DeletePolicy implements PolicyStore.
func (s *Redis) DeletePolicy(ctx context.Context, prefix string, kind PolicyKind, key string) (bool, error) {
	s.calls.Add(1)
	n, err := boundedCall(s, ctx, func() (int64, error) {
		return deletePolicyScript.Run(ctx, s.c, policyKeys(prefix), policyField(kind, key)).Int64()
	})
	if err != nil {
		return false, fmt.Errorf("store: redis: delete %v of key %q: %w", kind, key, err)
	}
	return n > 0, nil
}

// Escalate implements PolicyStore.
func (s *Redis) Escalate(ctx context.Context, prefix, key, reason string, now int64, base, max, forget time.Duration) (Policy, error) {
	if err := checkEscalate(key, now, base, max, forget); err != nil {
		return Policy{}, err
	}
	s.calls.Add(1)
	v, err := boundedCall(s, ctx, func() ([]any, error) {
		return escalateScript.Run(ctx, s.c, policyKeys(prefix), key, reason, now,
			base.Milliseconds(), max.Milliseconds(), forget.Milliseconds()).Slice()
	})
	if err == nil && len(v) != 3 {
		err = fmt.Errorf("escalate replied %d values, want 3", len(v))
	}
	if err != nil {
		return Policy{}, fmt.Errorf("store: redis: block key %q: %w", key, err)
	}
	until, _ := v[0].(int64)
	n, _ := v[1].(int64)
	r, _ := v[2].(string)
	return Policy{Kind: Block, Key: key, Value: r, Until: until, Strikes: clampStrikes(n)}, nil
}

// PolicyVersion implements PolicyStore.
func (s *Redis) PolicyVersion(ctx context.Context, prefix string) (uint64, error) {
	s.calls.Add(1)
	v, err := boundedCall(s, ctx, func() (string, error) { return s.c.Get(ctx, policyKeys(prefix)[1]).Result() })
	if err == redis.Nil {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("store: redis: policy version: %w", err)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("store: redis: policy version %q: %w", v, err)
	}
	return n, nil
}

// Policies implements PolicyStore.
func (s *Redis) Policies(ctx context.Context, prefix string) (uint64, []Policy, error) {
	s.calls.Add(1)
	v, err := boundedCall(s, ctx, func() ([]any, error) { return policiesScript.Run(ctx, s.c, policyKeys(prefix)).Slice() })
	if err == nil && len(v)%2 != 1 {
		err = fmt.Errorf("policies replied %d values", len(v))
	}
	if err != nil {
		return 0, nil, fmt.Errorf("store: redis: policies: %w", err)
	}
	ver, _ := v[0].(int64)
	var ps []Policy
	for i := 1; i+1 < len(v); i += 2 {
		f, _ := v[i].(string)
		val, _ := v[i+1].(string)
		if p, ok := parsePolicy(f, val); ok {
			ps = append(ps, p)
		}
	}
	return uint64(ver), ps, nil
}

// addTagsScript: KEYS[1] the tags; ARGV keep, ttl (ms), then tag, count
// pairs.
var addTagsScript = redis.NewScript(`
for i = 3, #ARGV, 2 do redis.call('ZINCRBY', KEYS[1], ARGV[i + 1], ARGV[i]) end
local keep = tonumber(ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(keep + 1))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 0
`)

// AddTags implements TagStore.
func (s *Redis) AddTags(ctx context.Context, prefix, key string, tags []TagCount, keep int, ttl time.Duration) error {
	argv := make([]any, 0, 2+2*len(tags))
	argv = append(argv, keep, max(ttl.Milliseconds(), 1))
	for _, t := range tags {
		argv = append(argv, t.Tag, t.Count)
	}
	s.calls.Add(1)
	if _, err := boundedCall(s, ctx, func() (any, error) {
		return nil, addTagsScript.Run(ctx, s.c, []string{TagsKey(prefix, key)}, argv...).Err()
	}); err != nil {
		return fmt.Errorf("store: redis: add tags of key %q: %w", key, err)
	}
	return nil
}

// Tags implements TagStore.
func (s *Redis) Tags(ctx context.Context, prefix, key string, n int) ([]TagCount, error) {
	s.calls.Add(1)
	zs, err := boundedCall(s, ctx, func() ([]redis.Z, error) {
		return s.c.ZRevRangeWithScores(ctx, TagsKey(prefix, key), 0, int64(n)-1).Result()
	})
	if err != nil {
		return nil, fmt.Errorf("store: redis: tags of key %q: %w", key, err)
	}
	out := make([]TagCount, 0, len(zs))
	for _, z := range zs {
		tag, _ := z.Member.(string)
		count := int64(math.MaxInt64) // a score at or past 2^63 does not convert
		if z.Score < 0x1p63 {
			count = int64(z.Score)
		}
		out = append(out, TagCount{Tag: tag, Count: count})
	}
	sortTags(out)
	return out, nil
}
