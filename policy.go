package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybridlimit/store"
)

// Overrides and blocks: per-key policies set at runtime, kept in the store
// (a store.PolicyStore) so that every node applies them, and cached on each
// node. A node reloads its cache when the store's policy version changes,
// which it checks every SyncRate in ModeAsync and every DefaultSyncRate in
// ModeSynchronous (and in Sync), and at once after its own changes. In
// ModeLocal they live in the limiter's memory.

// ErrNoPolicies is returned by the policy methods when the Config's store
// does not keep policies (it does not implement store.PolicyStore).
var ErrNoPolicies = errors.New("hybridlimit: the store does not keep overrides and blocks (store.PolicyStore)")

// Override puts a key in a tier other than its own until Until.
type Override struct {
	Key  string // the key it applies to
	Tier string // the tier whose rules decide the key, a name in Config.Tiers or ""
	// Until is when the override ends; the zero Time: never.
	Until time.Time
}

// Block denies every request of a key until Until.
type Block struct {
	Key    string // the key blocked
	Reason string // what Limiter.Block was given, or the BanPolicy's Reason
	// Until is when the block ends; the zero Time: never.
	Until time.Time
	// Strikes is how many blocks in a row the BanPolicy gave the key, this
	// one included; 0 for a block set with Limiter.Block.
	Strikes int
}

// policies is a node's cache of the store's policies.
type policies struct {
	st     store.PolicyStore // nil: the store keeps none
	prefix string
	tiers  map[string]*tier
	active atomic.Bool // some policy is cached, or tierOf: decisions take Limiter.route
	tierOf bool        // Config.TierOf is set
	// common is whether AllowN may take its common case: direct, no
	// policy cached, no TierOf, and the limiter open. One flag, so that a
	// decision reads one word for all four (setCommon keeps it).
	common atomic.Bool
	direct bool         // decisions may go straight to the table (set by New)
	closed *atomic.Bool // Limiter.closed
	snap   atomic.Pointer[policySnap]

	mu      sync.Mutex // one reload at a time; guards version
	version uint64
	loaded  bool
	// changed is closed, and replaced, each time reload installs a new
	// reading: a WaitN waiting out a block or its tier's limit looks
	// again (nil until changes or reload first sets it).
	changed atomic.Pointer[chan struct{}]
}

// changes returns a channel closed at the next reload that installs a
// reading.
func (p *policies) changes() <-chan struct{} {
	for {
		if c := p.changed.Load(); c != nil {
			return *c
		}
		next := make(chan struct{})
		if p.changed.CompareAndSwap(nil, &next) {
			return next
		}
	}
}

// policySnap is one immutable reading of the store's policies: per key,
// its override and block, in one map so that a decision looks a key up
// once.
type policySnap map[string]*keyPolicy

// keyPolicy is a key's policies.
type keyPolicy struct {
	tier      *tier // the override's tier; nil without one (or for a tier this node lacks)
	overUntil int64 // Unix ms; 0: no end
	block     *store.Policy
}

// setCommon stores common from what it depends on. After Close stores
// closed and then clears common, common stays false whatever setCommon
// runs meanwhile: it reads closed after its store and clears common again.
func (p *policies) setCommon() {
	p.common.Store(p.direct && !p.active.Load() && !p.closed.Load())
	if p.closed.Load() {
		p.common.Store(false)
	}
}

// lookup returns key's policies, or nil.
func (p *policies) lookup(key string) *keyPolicy {
	if s := p.snap.Load(); s != nil {
		return (*s)[key]
	}
	return nil
}

// override returns the override's tier in force at now (ns), or nil.
func (kp *keyPolicy) override(now int64) *tier {
	if kp == nil || kp.tier == nil || (kp.overUntil != 0 && kp.overUntil <= now/int64(time.Millisecond)) {
		return nil
	}
	return kp.tier
}

// blocked returns the block in force at now (ns), or nil.
func (kp *keyPolicy) blocked(now int64) *store.Policy {
	if kp == nil || kp.block == nil || !kp.block.InForce(now/int64(time.Millisecond)) {
		return nil
	}
	return kp.block
}

// reload reads the store's policies if their version changed since the
// last reading (or always, when force).
func (p *policies) reload(ctx context.Context, force bool) error {
	if p.st == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !force && p.loaded {
		v, err := p.st.PolicyVersion(ctx, p.prefix)
		if err != nil {
			return err
		}
		if v == p.version {
			return nil
		}
	}
	v, ps, err := p.st.Policies(ctx, p.prefix)
	if err != nil {
		return err
	}
	s := policySnap{}
	for _, x := range ps {
		kp := s[x.Key]
		if kp == nil {
			kp = &keyPolicy{}
			s[x.Key] = kp
		}
		switch x.Kind {
		case store.Override:
			// An override naming a tier this node lacks (nodes configured
			// apart) leaves the key in its usual tier.
			kp.tier, kp.overUntil = p.tiers[x.Value], x.Until
		case store.Block:
			b := x
			kp.block = &b
		}
	}
	p.snap.Store(&s)
	p.active.Store(len(ps) > 0 || p.tierOf)
	p.setCommon()
	p.version, p.loaded = v, true
	next := make(chan struct{})
	if old := p.changed.Swap(&next); old != nil {
		close(*old)
	}
	return nil
}

// policyStore returns the store of policies, or ErrNoPolicies.
func (l *Limiter) policyStore() (store.PolicyStore, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if l.pol.st == nil {
		return nil, ErrNoPolicies
	}
	return l.pol.st, nil
}

// until returns the Unix ms at which a policy of length d from now ends;
// 0 (never) for d = 0. It rounds up, so that a policy holds for at least
// d (at most 1ms more), and never returns 0 for d > 0.
func (l *Limiter) until(d time.Duration) int64 {
	if d == 0 {
		return 0
	}
	if u := ceilMs(l.clock.now() + int64(d)); u != 0 {
		return u
	}
	return 1
}

// ceilMs returns ns (Unix ns) in Unix ms, rounded up.
func ceilMs(ns int64) int64 {
	ms := ns / int64(time.Millisecond)
	if ns%int64(time.Millisecond) > 0 {
		ms++
	}
	return ms
}

// checkPolicyKey checks the key of a policy method.
func (l *Limiter) checkPolicyKey(op, key string) error {
	switch {
	case len(key) == 0:
		return &inputError{fmt.Sprintf("hybridlimit: %s: empty key; want 1 to Config.MaxKeyLen (%d) bytes", op, l.cfg.MaxKeyLen), ErrEmptyKey}
	case len(key) > l.cfg.MaxKeyLen:
		return &inputError{fmt.Sprintf("hybridlimit: %s: key of %d bytes exceeds Config.MaxKeyLen %d", op, len(key), l.cfg.MaxKeyLen), ErrKeyTooLong}
	}
	return nil
}

// SetOverride puts key in the named tier ("" for Rules) on every node, for
// ttl (0: until RemoveOverride), replacing any override of key. Other
// nodes apply it within one sync period (see Config.Tiers); this node at
// once, or, when ctx ends or the store fails between storing the override
// and reloading this node's policies, at its next check (the store's
// error goes to Config.OnError): nil means the override is stored. The
// key starts its new tier with the counts its counters there
// already hold in the store (those it shares with its old tier, see
// docs/policies.md); in ModeLocal, with no store, afresh.
func (l *Limiter) SetOverride(ctx context.Context, key, tier string, ttl time.Duration) error {
	st, err := l.policyStore()
	if err != nil {
		return err
	}
	if err := l.checkPolicyKey("SetOverride", key); err != nil {
		return err
	}
	if _, ok := l.byName[tier]; !ok {
		return &inputError{fmt.Sprintf("hybridlimit: SetOverride: tier %q is not in Config.Tiers; want one of %q", tier, l.Tiers()), ErrUnknownTier}
	}
	if ttl < 0 || ttl > MaxWindow {
		return fmt.Errorf("hybridlimit: SetOverride: ttl is %v, want 0 (no end) to %v", ttl, MaxWindow)
	}
	now := l.clock.now() / int64(time.Millisecond)
	if err := st.PutPolicy(ctx, l.cfg.Prefix, store.Policy{Kind: store.Override, Key: key, Value: tier, Until: l.until(ttl)}, now); err != nil {
		return err
	}
	l.applyPolicies(ctx)
	return nil
}

// RemoveOverride removes key's override on every node, and reports whether
// it had one. This node applies it as SetOverride's.
func (l *Limiter) RemoveOverride(ctx context.Context, key string) (bool, error) {
	return l.deletePolicy(ctx, "RemoveOverride", store.Override, key)
}

// Block denies every request of key on every node for d (0: until
// Unblock), with reason, replacing any block of key. Other nodes apply it
// within one sync period; this node at once, or, when ctx ends or the
// store fails between storing the block and reloading this node's
// policies, at its next check (the store's error goes to Config.OnError):
// nil means the block is stored. A blocked key's requests are
// denied before any rule counts them: Result.Blocked is set and RetryAfter
// is the time left.
func (l *Limiter) Block(ctx context.Context, key string, d time.Duration, reason string) error {
	st, err := l.policyStore()
	if err != nil {
		return err
	}
	if err := l.checkPolicyKey("Block", key); err != nil {
		return err
	}
	if d < 0 || d > MaxWindow {
		return fmt.Errorf("hybridlimit: Block: d is %v, want 0 (no end) to %v", d, MaxWindow)
	}
	now := l.clock.now() / int64(time.Millisecond)
	if err := st.PutPolicy(ctx, l.cfg.Prefix, store.Policy{Kind: store.Block, Key: key, Value: reason, Until: l.until(d)}, now); err != nil {
		return err
	}
	l.applyPolicies(ctx)
	return nil
}

// Unblock lifts key's block on every node, and reports whether it had one.
// The key's strikes (BanPolicy) are kept. This node applies it as Block's.
func (l *Limiter) Unblock(ctx context.Context, key string) (bool, error) {
	return l.deletePolicy(ctx, "Unblock", store.Block, key)
}

// deletePolicy removes key's policy of kind, for the method op.
func (l *Limiter) deletePolicy(ctx context.Context, op string, kind store.PolicyKind, key string) (bool, error) {
	st, err := l.policyStore()
	if err != nil {
		return false, err
	}
	if err := l.checkPolicyKey(op, key); err != nil {
		return false, err
	}
	ok, err := st.DeletePolicy(ctx, l.cfg.Prefix, kind, key)
	if err != nil {
		return false, err
	}
	l.applyPolicies(ctx)
	return ok, nil
}

// applyPolicies reloads this node's policies after a change it stored.
// The change is made whatever happens here: when the reload fails (ctx
// ended, or the store failed, which goes to OnError), the node reloads at
// its next check. In ModeLocal, with no next check, the store is the
// limiter's memory: the reload ignores ctx's end and cannot fail.
func (l *Limiter) applyPolicies(ctx context.Context) {
	if l.cfg.Mode == ModeLocal {
		ctx = context.WithoutCancel(ctx)
	}
	if err := l.pol.reload(ctx, true); err != nil && ctx.Err() == nil && l.loop != nil {
		l.loop.ReportError(err)
	}
}

// Overrides returns the overrides in force, by key, as the store holds
// them now.
func (l *Limiter) Overrides(ctx context.Context) ([]Override, error) {
	ps, err := l.inForce(ctx, store.Override)
	out := make([]Override, 0, len(ps))
	for _, p := range ps {
		out = append(out, Override{Key: p.Key, Tier: p.Value, Until: unixMs(p.Until)})
	}
	return out, err
}

// Blocks returns the blocks in force, by key, as the store holds them now.
func (l *Limiter) Blocks(ctx context.Context) ([]Block, error) {
	ps, err := l.inForce(ctx, store.Block)
	out := make([]Block, 0, len(ps))
	for _, p := range ps {
		out = append(out, Block{Key: p.Key, Reason: p.Value, Until: unixMs(p.Until), Strikes: p.Strikes})
	}
	return out, err
}

func (l *Limiter) inForce(ctx context.Context, kind store.PolicyKind) ([]store.Policy, error) {
	st, err := l.policyStore()
	if err != nil {
		return nil, err
	}
	_, ps, err := st.Policies(ctx, l.cfg.Prefix)
	if err != nil {
		return nil, err
	}
	now := l.clock.now() / int64(time.Millisecond)
	var out []store.Policy
	for _, p := range ps {
		if p.Kind == kind && p.InForce(now) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

func unixMs(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// blocked returns the Result of a request of key, blocked at now, on t.
func (t *tier) blocked(b *store.Policy, now int64) Result {
	res := t.fresh()
	res.Allowed, res.Blocked, res.Remaining = false, true, 0
	const ms = int64(time.Millisecond)
	switch {
	case b.Until > math.MaxInt64/ms:
		// An end another program wrote far ahead: the longest wait,
		// rather than a product that wraps.
		res.RetryAfter = math.MaxInt64
	case b.Until != 0:
		left := b.Until*ms - now
		if now < 0 && left < 0 { // wrapped: a clock before 1970
			left = math.MaxInt64
		}
		res.RetryAfter = max(time.Duration(left), time.Millisecond)
	default:
		res.RetryAfter = MaxWindow
	}
	res.ResetAfter = res.RetryAfter
	return res
}
