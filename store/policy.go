package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// PolicyKind is what a Policy does to its key.
type PolicyKind byte

const (
	// Override puts the key in the tier named by the policy's Value.
	Override PolicyKind = 'o'
	// Block denies every request of the key; Value is the reason.
	Block PolicyKind = 'b'
)

// String returns "override" or "block".
func (k PolicyKind) String() string {
	switch k {
	case Override:
		return "override"
	case Block:
		return "block"
	}
	return fmt.Sprintf("PolicyKind(%d)", byte(k))
}

// Policy is an override or a block of one user key, shared by every node
// of a cluster through the store.
type Policy struct {
	Kind  PolicyKind // Override or Block
	Key   string     // the user key it applies to
	Value string     // Override: the tier; Block: the reason
	// Until is when the policy ends, in Unix milliseconds; 0: never.
	Until int64
	// Strikes is, for a block, the key's blocks in a row by Escalate
	// (this one included); 0 for a block set by hand.
	Strikes int
}

// MaxStrikes is the largest strikes count a store keeps: a count read
// larger (another program's write) counts as MaxStrikes, and Escalate
// adds no strike beyond it. Any count past 62 already gives the longest
// block.
const MaxStrikes = 1 << 20

// maxPolicyMs is the largest instant (Unix ms) a policy or Escalate's now
// may hold: 2^52, some 142,000 years, so that an instant plus any two
// time.Durations in ms stays below 2^53, where the Redis store's scripts
// (whose numbers are doubles) still count exactly.
const maxPolicyMs = 1 << 52

// checkPolicy returns an error naming the field of p a store cannot keep.
func checkPolicy(p *Policy) error {
	switch {
	case p.Kind != Override && p.Kind != Block:
		return fmt.Errorf("store: policy of key %q: Kind is %v, want Override or Block", p.Key, p.Kind)
	case p.Until < 0 || p.Until > maxPolicyMs:
		return fmt.Errorf("store: policy of key %q: Until is %d, want 0 (never ends) to %d (Unix ms)", p.Key, p.Until, int64(maxPolicyMs))
	case p.Strikes < 0 || p.Strikes > MaxStrikes:
		return fmt.Errorf("store: policy of key %q: Strikes is %d, want 0 to %d", p.Key, p.Strikes, MaxStrikes)
	}
	return nil
}

// checkEscalate returns an error naming the argument of Escalate that is
// out of its range.
func checkEscalate(key string, now int64, base, max, forget time.Duration) error {
	switch {
	case now < 0 || now > maxPolicyMs:
		return fmt.Errorf("store: block key %q: now is %d, want 0 to %d (Unix ms)", key, now, int64(maxPolicyMs))
	case base < time.Millisecond:
		return fmt.Errorf("store: block key %q: base is %v, want 1ms to max", key, base)
	case max < base:
		return fmt.Errorf("store: block key %q: max is %v, want base (%v) or more", key, max, base)
	case forget < 0:
		return fmt.Errorf("store: block key %q: forget is %v, want 0 or more", key, forget)
	}
	return nil
}

// InForce reports whether p holds at now (Unix ms).
func (p *Policy) InForce(now int64) bool { return p.Until == 0 || p.Until > now }

// PolicyStore is implemented by stores that keep a cluster's policies:
// per-key overrides and blocks, each node caching them and reloading them
// when their version changes. Memory and Redis implement it. Policies
// live under a prefix, as counters do.
type PolicyStore interface {
	// PutPolicy sets p, replacing the policy of the same kind and key,
	// and removes the policies that ended before now (Unix ms).
	PutPolicy(ctx context.Context, prefix string, p Policy, now int64) error
	// DeletePolicy removes the policy of kind for key, if any, and
	// reports whether there was one.
	DeletePolicy(ctx context.Context, prefix string, kind PolicyKind, key string) (bool, error)
	// Escalate blocks key from now (Unix ms) for base doubled by every
	// block Escalate gave it before (its strikes, forgotten once forget
	// has passed since the last block ended), at most max, with reason.
	// If a block of key is in force at now, it is returned unchanged. It
	// returns the block in force.
	Escalate(ctx context.Context, prefix, key, reason string, now int64, base, max, forget time.Duration) (Policy, error)
	// PolicyVersion returns the version of prefix's policies; every
	// change makes it larger. A version never repeats across a loss of
	// the store's data (a restart without persistence, a flush): a change
	// after it gets a version above every version handed out before, so
	// that a node holding one reloads. Memory and Redis take the store's
	// clock in µs as the version, or the version plus one if that is
	// larger: this holds while changes are at least a µs apart on average
	// and the store's clock does not step back across the loss.
	PolicyVersion(ctx context.Context, prefix string) (uint64, error)
	// Policies returns prefix's policies (some may have ended) and the
	// version they are at.
	Policies(ctx context.Context, prefix string) (uint64, []Policy, error)
}

// escalation returns a block's length for its strike n (1-based): base
// doubled n−1 times, at most max. It saturates at max rather than wrap,
// and takes at most 63 steps whatever n is.
func escalation(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d > 0 && d < max; i++ {
		if d > max/2 {
			return max
		}
		d *= 2
	}
	return min(d, max)
}

// Policies are kept as hash fields "<kind>:<key>" (and "s:<key>", a key's
// strikes) whose values are "<until>|<strikes>|<value>".

func policyField(kind PolicyKind, key string) string { return string(kind) + ":" + key }

func policyValue(p *Policy) string {
	return strconv.FormatInt(p.Until, 10) + "|" + strconv.Itoa(p.Strikes) + "|" + p.Value
}

// parsePolicy reads a hash field and its value; ok is false for strikes
// records and malformed entries.
func parsePolicy(field, value string) (Policy, bool) {
	kind, key, ok := strings.Cut(field, ":")
	if !ok || len(kind) != 1 || (kind[0] != byte(Override) && kind[0] != byte(Block)) {
		return Policy{}, false
	}
	until, rest, ok1 := strings.Cut(value, "|")
	strikes, v, ok2 := strings.Cut(rest, "|")
	u, err1 := strconv.ParseInt(until, 10, 64)
	n, ok3 := parseStrikeCount(strikes)
	if !ok1 || !ok2 || err1 != nil || !ok3 {
		return Policy{}, false
	}
	return Policy{Kind: PolicyKind(kind[0]), Key: key, Value: v, Until: u, Strikes: n}, true
}

// PutPolicy implements PolicyStore.
func (s *Memory) PutPolicy(ctx context.Context, prefix string, p Policy, now int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkPolicy(&p); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.policyHash(prefix)
	h[policyField(p.Kind, p.Key)] = policyValue(&p)
	prunePolicies(h, now)
	s.bumpPolicies(prefix)
	return nil
}

// DeletePolicy implements PolicyStore.
func (s *Memory) DeletePolicy(ctx context.Context, prefix string, kind PolicyKind, key string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.policyHash(prefix)
	f := policyField(kind, key)
	_, ok := h[f]
	if ok {
		delete(h, f)
		s.bumpPolicies(prefix)
	}
	return ok, nil
}

// Escalate implements PolicyStore.
func (s *Memory) Escalate(ctx context.Context, prefix, key, reason string, now int64, base, max, forget time.Duration) (Policy, error) {
	if err := ctx.Err(); err != nil {
		return Policy{}, err
	}
	if err := checkEscalate(key, now, base, max, forget); err != nil {
		return Policy{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.policyHash(prefix)
	if b, ok := parsePolicy(policyField(Block, key), h[policyField(Block, key)]); ok && b.InForce(now) {
		return b, nil
	}
	strikes := 0
	if st, ok := h["s:"+key]; ok {
		if until, n, ok := parseStrikes(st); ok && until > now {
			strikes = n
		}
	}
	p := Policy{Kind: Block, Key: key, Value: reason, Strikes: min(strikes+1, MaxStrikes)}
	p.Until = now + escalation(base, max, p.Strikes).Milliseconds()
	h[policyField(Block, key)] = policyValue(&p)
	h["s:"+key] = strconv.FormatInt(p.Until+forget.Milliseconds(), 10) + "|" + strconv.Itoa(p.Strikes) + "|"
	prunePolicies(h, now)
	s.bumpPolicies(prefix)
	return p, nil
}

// PolicyVersion implements PolicyStore.
func (s *Memory) PolicyVersion(ctx context.Context, prefix string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.polVer[prefix], nil
}

// Policies implements PolicyStore.
func (s *Memory) Policies(ctx context.Context, prefix string) (uint64, []Policy, error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ps []Policy
	for f, v := range s.policyHash(prefix) {
		if p, ok := parsePolicy(f, v); ok {
			ps = append(ps, p)
		}
	}
	return s.polVer[prefix], ps, nil
}

// bumpPolicies changes prefix's version as the Redis store does: to the
// store's clock in µs, or to the version plus one if that is larger. Call
// with s.mu held.
func (s *Memory) bumpPolicies(prefix string) {
	v := s.polVer[prefix] + 1
	if now := s.clock.Now().UnixMicro(); now > 0 && uint64(now) > v {
		v = uint64(now)
	}
	s.polVer[prefix] = v
}

// policyHash returns prefix's policies. Call with s.mu held.
func (s *Memory) policyHash(prefix string) map[string]string {
	if s.pol == nil {
		s.pol, s.polVer = map[string]map[string]string{}, map[string]uint64{}
	}
	h := s.pol[prefix]
	if h == nil {
		h = map[string]string{}
		s.pol[prefix] = h
	}
	return h
}

// prunePolicies removes from h the policies and strikes records that ended
// before now.
func prunePolicies(h map[string]string, now int64) {
	for f, v := range h {
		until, _, _ := strings.Cut(v, "|")
		if u, err := strconv.ParseInt(until, 10, 64); err == nil && u != 0 && u <= now {
			delete(h, f)
		}
	}
}

// parseStrikes reads a strikes record: until when it is remembered, and
// the strikes.
func parseStrikes(v string) (int64, int, bool) {
	until, rest, ok := strings.Cut(v, "|")
	n, _, ok2 := strings.Cut(rest, "|")
	u, err1 := strconv.ParseInt(until, 10, 64)
	k, ok3 := parseStrikeCount(n)
	return u, k, ok && ok2 && err1 == nil && ok3
}

// parseStrikeCount reads a strikes count, which only another program can
// have made negative or larger than MaxStrikes: it saturates to 0 to
// MaxStrikes. ok is false when v is not an integer.
func parseStrikeCount(v string) (int, bool) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) { // out of range: n is ±MaxInt64
		return 0, false
	}
	return clampStrikes(n), true
}

// clampStrikes returns n within 0 to MaxStrikes.
func clampStrikes(n int64) int { return int(min(max(n, 0), MaxStrikes)) }

// TagCount is a tag and the cost counted for it.
type TagCount struct {
	Tag   string // a tag given to hybridlimit.Limiter.AllowTagged
	Count int64  // its cost counted
}

// TagStore is implemented by stores that keep the tags that contributed to
// a key's requests near its limit, merged from every node (see
// hybridlimit.Limiter.AllowTagged). Memory and Redis implement it.
type TagStore interface {
	// AddTags adds tags' counts to key's, keeps the keep most counted, and
	// makes them expire ttl after this addition.
	AddTags(ctx context.Context, prefix, key string, tags []TagCount, keep int, ttl time.Duration) error
	// Tags returns key's n most counted tags, most first.
	Tags(ctx context.Context, prefix, key string, n int) ([]TagCount, error)
}

// TagsKey returns the store key of key's tags under prefix.
func TagsKey(prefix, key string) string {
	return string(append(keyBase(prefix, key), "tags"...))
}

// AddTags implements TagStore.
func (s *Memory) AddTags(ctx context.Context, prefix, key string, tags []TagCount, keep int, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tags == nil {
		s.tags = map[string]*memTags{}
	}
	k := TagsKey(prefix, key)
	now := s.clock.Now().UnixMilli()
	t := s.tags[k]
	if t == nil || t.exp <= now {
		t = &memTags{m: map[string]int64{}}
		s.tags[k] = t
	}
	for _, tc := range tags {
		if c := t.m[tc.Tag]; c > math.MaxInt64-tc.Count {
			t.m[tc.Tag] = math.MaxInt64 // saturate, as a float score in Redis cannot wrap
		} else {
			t.m[tc.Tag] = c + tc.Count
		}
	}
	for len(t.m) > keep {
		low := ""
		for tag, n := range t.m {
			if low == "" || n < t.m[low] || n == t.m[low] && tag > low {
				low = tag
			}
		}
		delete(t.m, low)
	}
	t.exp = now + ttl.Milliseconds()
	return nil
}

// Tags implements TagStore.
func (s *Memory) Tags(ctx context.Context, prefix, key string, n int) ([]TagCount, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tags[TagsKey(prefix, key)]
	if t == nil || t.exp <= s.clock.Now().UnixMilli() {
		return nil, nil
	}
	out := make([]TagCount, 0, len(t.m))
	for tag, c := range t.m {
		out = append(out, TagCount{tag, c})
	}
	sortTags(out)
	if len(out) > n {
		out = out[:n]
	}
	return out, nil
}

// memTags is a key's tags in a Memory store.
type memTags struct {
	m   map[string]int64
	exp int64 // Unix ms
}

func sortTags(ts []TagCount) {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Count != ts[j].Count {
			return ts[i].Count > ts[j].Count
		}
		return ts[i].Tag < ts[j].Tag
	})
}
