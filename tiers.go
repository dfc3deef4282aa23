package hybridlimit

import (
	"fmt"
	"math"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// tier is one set of rules and the table that counts its keys: Rules (the
// default tier, named "") or one of Config.Tiers.
type tier struct {
	name    string
	field   string       // where its rules are configured, for errors
	cfg     []Rule       // as configured
	rules   []local.Rule // as package local counts them
	minCost int64        // the largest valid cost: the smallest limit or burst
	minRule int
	longest time.Duration
	table   *local.Table
}

// newTier compiles rules for cfg's mode.
func newTier(cfg *Config, name, field string, rules []Rule) *tier {
	t := &tier{name: name, field: field, cfg: rules, minCost: math.MaxInt64}
	for i, r := range rules {
		spec := r.spec()
		if r.Type == Log && cfg.Mode == ModeAsync {
			// A log cannot be merged across nodes by increments: count in
			// buckets of at least a sync period (docs/algorithms.md).
			spec.Kind, spec.Buckets = local.Buckets, logBuckets(r.Window, cfg.SyncRate)
		}
		t.rules = append(t.rules, local.NewRule(spec))
		t.longest = max(t.longest, r.Window)
		if r.maxCost() < t.minCost {
			t.minCost, t.minRule = r.maxCost(), i
		}
	}
	return t
}

// costError reports a cost no rule of t can admit.
func (t *tier) costError(op string, n int64) error {
	if n < 1 {
		return &inputError{fmt.Sprintf("hybridlimit: %s(n=%d): cost must be at least 1", op, n), ErrCost}
	}
	field := "Limit"
	if ty := t.cfg[t.minRule].Type; ty == TokenBucket || ty == LeakyBucket {
		field = "Burst"
	}
	return &inputError{fmt.Sprintf("hybridlimit: %s(n=%d) exceeds %s[%d].%s %d: it can never be admitted", op, n, t.field, t.minRule, field, t.minCost), ErrCost}
}

// result turns a decision on t into a Result.
func (t *tier) result(d local.Decision) Result {
	r := &t.cfg[d.Rule]
	return Result{
		Allowed:    d.Allowed,
		Rule:       d.Rule,
		Limit:      r.Limit,
		Window:     r.Window,
		Remaining:  d.Remaining,
		RetryAfter: time.Duration(d.RetryAfter),
		ResetAfter: time.Duration(d.ResetAfter),
		Delay:      time.Duration(d.Delay),
		Tier:       t.name,
	}
}

// fresh returns the result for a key of t with no counts: the tightest
// rule, untouched.
func (t *tier) fresh() Result {
	r := &t.cfg[t.minRule]
	return Result{Allowed: true, Rule: t.minRule, Limit: r.Limit, Window: r.Window, Remaining: r.maxCost(), Tier: t.name}
}

// plain reports whether key and n are valid and the decision can take
// AllowN's common case: a direct decision (see policies.direct) of the
// default tier, no policy, the limiter open. route's answer is then
// (l.def, nil, nil). It is inlined in AllowN.
func (l *Limiter) plain(key string, n int64) bool {
	return l.pol.common.Load() && uint(len(key)-1) < uint(l.cfg.MaxKeyLen) && uint64(n-1) < uint64(l.def.minCost)
}

// route checks key and n and returns the tier that decides key (the tier
// of its override, if any, else the one Config.TierOf names, else the
// default) and key's policies (nil when it has none).
func (l *Limiter) route(key string, n int64, op string) (*tier, *keyPolicy, error) {
	if l.closed.Load() || uint(len(key)-1) >= uint(l.cfg.MaxKeyLen) {
		return nil, nil, l.keyError(key)
	}
	t := l.def
	var kp *keyPolicy
	if l.pol.active.Load() {
		var err error
		if t, kp, err = l.policyRoute(key); err != nil {
			return nil, nil, err
		}
	}
	if uint64(n-1) >= uint64(t.minCost) {
		return nil, nil, t.costError(op, n)
	}
	return t, kp, nil
}

// keyError returns route's error for key (or for a closed limiter).
func (l *Limiter) keyError(key string) error {
	switch {
	case l.closed.Load():
		return ErrClosed
	case len(key) == 0:
		return &inputError{fmt.Sprintf("hybridlimit: empty key; want 1 to Config.MaxKeyLen (%d) bytes", l.cfg.MaxKeyLen), ErrEmptyKey}
	}
	return &inputError{fmt.Sprintf("hybridlimit: key of %d bytes exceeds Config.MaxKeyLen %d", len(key), l.cfg.MaxKeyLen), ErrKeyTooLong}
}

// policyRoute returns key's tier and policies when some are cached or
// Config.TierOf is set.
func (l *Limiter) policyRoute(key string) (*tier, *keyPolicy, error) {
	var t *tier
	var kp *keyPolicy
	if kp = l.pol.lookup(key); kp != nil {
		t = kp.override(l.clock.now())
	}
	if t == nil {
		var err error
		if t, err = l.tierOf(key); err != nil {
			return nil, nil, err
		}
	}
	return t, kp, nil
}

// tierOf returns the tier Config.TierOf names for key, or the default.
func (l *Limiter) tierOf(key string) (*tier, error) {
	if l.cfg.TierOf == nil {
		return l.def, nil
	}
	name := l.cfg.TierOf(key)
	if name == "" {
		return l.def, nil
	}
	t := l.byName[name]
	if t == nil {
		return nil, &inputError{fmt.Sprintf("hybridlimit: Config.TierOf returned %q for a key, which is not in Config.Tiers", name), ErrUnknownTier}
	}
	return t, nil
}

// Tiers returns the names of the configured tiers, "" (Rules) first, then
// Config.Tiers' in order.
func (l *Limiter) Tiers() []string {
	names := make([]string, len(l.tiers))
	for i, t := range l.tiers {
		names[i] = t.name
	}
	return names
}

// TierRules returns a copy of the rules of the named tier ("" for Rules),
// and false if there is no such tier.
func (l *Limiter) TierRules(name string) ([]Rule, bool) {
	t := l.byName[name]
	if t == nil {
		return nil, false
	}
	return append([]Rule(nil), t.cfg...), true
}
