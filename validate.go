package hybridlimit

import (
	"fmt"
	"strings"
	"time"

	"github.com/benbjohnson/clock"
)

// Config's validation: the checks New makes, and the defaults it fills in.

// validateRules checks the rules of a tier; field names them in errors.
func validateRules(field string, rules []Rule) error {
	for i, r := range rules {
		if err := r.validate(fmt.Sprintf("%s[%d]", field, i)); err != nil {
			return err
		}
		for j := range i {
			if sameCounters(rules[j], r) {
				return fmt.Errorf("hybridlimit: %s[%d] (%v) counts like %s[%d] (%v); use one rule per window and algorithm", field, i, r, field, j, rules[j])
			}
		}
	}
	return nil
}

// checkAsyncRules checks what ModeAsync asks of a tier's rules.
func checkAsyncRules(field string, rules []Rule, syncRate time.Duration) error {
	for i, r := range rules {
		if r.Type == Bucketed && r.Window/time.Duration(r.Buckets) < syncRate {
			// A sync per bucket at least: a counter keeps the
			// increments of one closed bucket besides the last.
			return fmt.Errorf("hybridlimit: %s[%d] has buckets of %v, shorter than Config.SyncRate %v: in ModeAsync a bucket lasts at least a sync period", field, i, r.Window/time.Duration(r.Buckets), syncRate)
		}
		if (r.Type == Sliding || r.Type == Fixed) && r.Window < syncRate {
			// The same for a window: a counter keeps the increments of one
			// window older than the previous one until a sync takes them,
			// and a faster window would drop admitted increments unpushed.
			return fmt.Errorf("hybridlimit: %s[%d] has a window of %v, shorter than Config.SyncRate %v: in ModeAsync a window lasts at least a sync period", field, i, r.Window, syncRate)
		}
		if r.Type == Log && logBuckets(r.Window, syncRate) < 2 {
			return fmt.Errorf("hybridlimit: %s[%d] is a Log rule of %v: in ModeAsync it counts in at least 2 buckets of at least Config.SyncRate %v each, so its Window must be at least %v (or use ModeSynchronous for an exact log)", field, i, r.Window, syncRate, 2*syncRate)
		}
		if r.Type != Log {
			continue
		}
		// ModeAsync counts a Log rule as a Bucketed rule of its window:
		// it must not share another rule's store keys as that rule.
		as := Rule{Type: Bucketed, Window: r.Window, Buckets: logBuckets(r.Window, syncRate)}
		for j, o := range rules {
			if sameCounters(as, o) {
				return fmt.Errorf("hybridlimit: %s[%d] is a Log rule of %v: in ModeAsync it counts in %d buckets, as %s[%d] (%v) does; use one rule per window and algorithm", field, i, r.Window, as.Buckets, field, j, o)
			}
		}
	}
	return nil
}

// checkTierName checks a tier's name.
func checkTierName(name string) error {
	if len(name) < 1 || len(name) > 64 {
		return fmt.Errorf("tier name %q has %d bytes, want 1 to 64", name, len(name))
	}
	for i := 0; i < len(name); i++ {
		if name[i] < 0x21 || name[i] > 0x7e {
			return fmt.Errorf("tier name %q holds a byte 0x%02x, want printable ASCII without spaces", name, name[i])
		}
	}
	return nil
}

// validate checks c and returns a copy with the defaults filled in.
func (c Config) validate() (Config, error) {
	if len(c.Rules) == 0 || len(c.Rules) > MaxRules {
		return c, fmt.Errorf("hybridlimit: Config.Rules has %d rules, want 1 to %d", len(c.Rules), MaxRules)
	}
	c.Rules = append([]Rule(nil), c.Rules...)
	if err := validateRules("Config.Rules", c.Rules); err != nil {
		return c, err
	}
	if len(c.Tiers) > MaxTiers {
		return c, fmt.Errorf("hybridlimit: Config.Tiers has %d tiers, want at most %d", len(c.Tiers), MaxTiers)
	}
	tiers := make(map[string][]Rule, len(c.Tiers))
	for name, rules := range c.Tiers {
		if err := checkTierName(name); err != nil {
			return c, fmt.Errorf("hybridlimit: Config.Tiers: %w", err)
		}
		field := fmt.Sprintf("Config.Tiers[%q]", name)
		if len(rules) == 0 || len(rules) > MaxRules {
			return c, fmt.Errorf("hybridlimit: %s has %d rules, want 1 to %d", field, len(rules), MaxRules)
		}
		rules = append([]Rule(nil), rules...)
		if err := validateRules(field, rules); err != nil {
			return c, err
		}
		tiers[name] = rules
	}
	c.Tiers = tiers
	if err := c.Ban.validate(); err != nil {
		return c, err
	}
	switch c.Mode {
	case ModeLocal:
		if c.Store != nil {
			return c, fmt.Errorf("hybridlimit: Config.Store is set but Config.Mode is local; use ModeAsync or ModeSynchronous")
		}
	case ModeAsync, ModeSynchronous:
		if c.Store == nil {
			return c, fmt.Errorf("hybridlimit: Config.Store is nil, want a store in Config.Mode %v", c.Mode)
		}
	default:
		return c, fmt.Errorf("hybridlimit: Config.Mode is %v, want ModeLocal, ModeAsync or ModeSynchronous", c.Mode)
	}
	if c.Mode == ModeAsync {
		if c.SyncRate == 0 {
			c.SyncRate = DefaultSyncRate
		}
		if c.SyncRate < time.Millisecond || c.SyncRate > time.Hour {
			return c, fmt.Errorf("hybridlimit: Config.SyncRate is %v, want 1ms to 1h", c.SyncRate)
		}
		for _, tier := range c.tierList() {
			if err := checkAsyncRules(tier.field, tier.rules, c.SyncRate); err != nil {
				return c, err
			}
		}
	} else if c.SyncRate != 0 {
		return c, fmt.Errorf("hybridlimit: Config.SyncRate is %v, but only ModeAsync syncs periodically; leave it zero in Config.Mode %v", c.SyncRate, c.Mode)
	}
	if c.AsyncPolicy > Naive {
		return c, fmt.Errorf("hybridlimit: Config.AsyncPolicy is %v, want Share or Naive", c.AsyncPolicy)
	}
	if c.FailurePolicy > FailClosed {
		return c, fmt.Errorf("hybridlimit: Config.FailurePolicy is %v, want FailOpen or FailClosed", c.FailurePolicy)
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.MaxKeys < 1 || int64(c.MaxKeys) > 1<<31 {
		return c, fmt.Errorf("hybridlimit: Config.MaxKeys is %d, want 1 to %d", c.MaxKeys, int64(1)<<31)
	}
	if c.MaxKeyLen == 0 {
		c.MaxKeyLen = DefaultMaxKeyLen
	}
	if c.MaxKeyLen < 1 || c.MaxKeyLen > MaxKeyLenCap {
		return c, fmt.Errorf("hybridlimit: Config.MaxKeyLen is %d, want 1 to %d", c.MaxKeyLen, MaxKeyLenCap)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if len(c.Prefix) > 64 || strings.ContainsAny(c.Prefix, "{}:") {
		return c, fmt.Errorf("hybridlimit: Config.Prefix is %q, want at most 64 bytes without '{', '}' or ':'", c.Prefix)
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.StoreTimeout < time.Millisecond || c.StoreTimeout > time.Minute {
		return c, fmt.Errorf("hybridlimit: Config.StoreTimeout is %v, want 1ms to 1m", c.StoreTimeout)
	}
	if c.ClockResolution == 0 {
		c.ClockResolution = -1
		if c.Clock == nil {
			c.ClockResolution = time.Millisecond
		}
	}
	if c.ClockResolution > 0 && (c.ClockResolution < time.Microsecond || c.ClockResolution > time.Second) {
		return c, fmt.Errorf("hybridlimit: Config.ClockResolution is %v, want 1µs to 1s, or negative for exact reads", c.ClockResolution)
	}
	if c.ClockSync == 0 {
		c.ClockSync = DefaultClockSync
	}
	if c.ClockSync > 0 && (c.ClockSync < time.Second || c.ClockSync > time.Hour) {
		return c, fmt.Errorf("hybridlimit: Config.ClockSync is %v, want 1s to 1h, or negative to keep node clocks", c.ClockSync)
	}
	if c.LogEvery == 0 {
		c.LogEvery = 10 * time.Second
	}
	if c.LogEvery < time.Millisecond || c.LogEvery > time.Hour {
		return c, fmt.Errorf("hybridlimit: Config.LogEvery is %v, want 1ms to 1h", c.LogEvery)
	}
	if c.Clock == nil {
		c.Clock = clock.New()
	}
	return c, nil
}
