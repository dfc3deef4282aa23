package hybridlimit

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Mode selects where a Limiter's decisions are made. The zero value is
// ModeLocal.
type Mode uint8

const (
	// ModeLocal decides on this node's own counters. It needs no store and
	// does no I/O; N nodes behind a load balancer admit up to N times the
	// limit between them.
	ModeLocal Mode = iota
	// ModeAsync decides on this node's counters plus the cluster totals
	// merged at the last sync; a background loop pushes this node's
	// increments to the store and pulls the merged totals back every
	// SyncRate. Decisions do no I/O; the cluster can overshoot the limit by
	// what the other nodes admit within two sync periods (a node sees
	// another's admission one to two periods after it), and a node that
	// has not decided a key within the last three sync periods decides it
	// alone until its next sync (see docs/design.md, "The share policy").
	ModeAsync
	// ModeSynchronous decides every request in the store, atomically: one
	// round trip per decision, and never more admitted across the cluster
	// than the rules allow.
	ModeSynchronous
)

// String returns "local", "async" or "synchronous".
func (m Mode) String() string {
	switch m {
	case ModeLocal:
		return "local"
	case ModeAsync:
		return "async"
	case ModeSynchronous:
		return "synchronous"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// AsyncPolicy selects how ModeAsync decides between syncs. The zero value
// is Share.
type AsyncPolicy uint8

const (
	// Share makes each node spend only its share of the quota it believes
	// is free, its share being its part of the key's recent increments,
	// with a correction for what the other nodes admitted but had not yet
	// pushed when it synced. The cluster then admits close to the limit
	// whatever the sync rate (see docs/design.md). Keys with too few
	// requests per node per sync period for a share to mean anything are
	// decided by the Naive rule.
	Share AsyncPolicy = iota
	// Naive decides on the cluster total of the last sync plus this
	// node's own unsynced count (Kong's scheme): each node is blind to what
	// the others admitted since their last push, and the cluster can
	// overshoot by about ((N−1)/N)·τ/W for N nodes each τ behind (sync
	// period plus round trip) with window W.
	Naive
)

// String returns "share" or "naive".
func (p AsyncPolicy) String() string {
	switch p {
	case Share:
		return "share"
	case Naive:
		return "naive"
	}
	return fmt.Sprintf("AsyncPolicy(%d)", uint8(p))
}

// FailurePolicy says what a Limiter decides while its store fails, or while
// its table of keys is full. The zero value is FailOpen.
type FailurePolicy uint8

const (
	// FailOpen keeps deciding on this node's view: its own counts plus the
	// last cluster totals it knew (Kong's fallback). Its increments are
	// kept and pushed when the store answers again.
	FailOpen FailurePolicy = iota
	// FailClosed denies every request until the store answers again.
	FailClosed
)

// String returns "fail-open" or "fail-closed".
func (p FailurePolicy) String() string {
	switch p {
	case FailOpen:
		return "fail-open"
	case FailClosed:
		return "fail-closed"
	}
	return fmt.Sprintf("FailurePolicy(%d)", uint8(p))
}

// Limits of the configuration.
const (
	// MaxRules is the most rules a Config may hold.
	MaxRules = local.MaxRules
	// MaxLimit is the largest Rule.Limit.
	MaxLimit = 1 << 40
	// MaxWindow is the longest Rule.Window.
	MaxWindow = 366 * 24 * time.Hour
	// MaxBuckets is the most buckets of a Bucketed rule.
	MaxBuckets = 64
	// MaxLogLimit is the largest Limit of a Log rule, which keeps 8 bytes
	// per unit of cost per key.
	MaxLogLimit = 1 << 16
	// MaxKeyLenCap is the largest Config.MaxKeyLen.
	MaxKeyLenCap = 1 << 16
	// MaxTiers is the most tiers a Config may hold besides Rules.
	MaxTiers = 64
)

// Defaults of the configuration, used where a field is zero.
const (
	// DefaultSyncRate is Config.SyncRate's default in ModeAsync.
	DefaultSyncRate = 100 * time.Millisecond
	// DefaultMaxKeys is Config.MaxKeys's default.
	DefaultMaxKeys = 1 << 20
	// DefaultMaxKeyLen is Config.MaxKeyLen's default, in bytes.
	DefaultMaxKeyLen = 1024
	// DefaultPrefix is Config.Prefix's default.
	DefaultPrefix = "hl"
	// DefaultStoreTimeout is Config.StoreTimeout's default.
	DefaultStoreTimeout = time.Second
	// DefaultClockSync is Config.ClockSync's default.
	DefaultClockSync = 10 * time.Second
	// DefaultCloseTimeout bounds Close's final push when its context has
	// no deadline.
	DefaultCloseTimeout = 10 * time.Second
)

// Config configures a Limiter. Only Rules is required; every other field's
// zero value selects the documented default. New validates the whole Config
// once and never changes it.
type Config struct {
	// Rules are the limits enforced on every key: a request is admitted
	// only when every rule admits it. 1 to MaxRules rules, no two that
	// count alike (such as a Sliding and a Fixed rule of one Window, or a
	// TokenBucket and a LeakyBucket of one rate and burst, rates compared
	// as the store keeps them: Window/Limit rounded up to a whole
	// microsecond). Rules is the default tier, named "".
	Rules []Rule

	// Tiers are further named sets of rules, each validated as Rules is,
	// for keys that need other limits: a free plan and a paid one, say. A
	// key's tier is the one an override names (Limiter.SetOverride),
	// else the one TierOf names, else the default. At most MaxTiers tiers;
	// names are 1 to 64 printable ASCII characters, without spaces. Each
	// tier holds up to MaxKeys keys. A key's counters in the store are
	// shared by the tiers whose rules count alike, so a key that changes
	// tier keeps what it spent on them (see docs/policies.md).
	Tiers map[string][]Rule

	// TierOf, if set, returns a key's tier: "" for Rules, or a name in
	// Tiers. It is called on every decision of a key without an override,
	// and must be fast and safe for concurrent use. A name that is not a
	// tier makes the decision fail with an error.
	TierOf func(key string) string

	// Ban, when its Denials is set, blocks a key after repeated denials
	// (see BanPolicy).
	Ban BanPolicy

	// Mode is ModeLocal (the zero value), ModeAsync or ModeSynchronous.
	Mode Mode

	// Store is where nodes meet: required in ModeAsync and
	// ModeSynchronous, and must be nil in ModeLocal. See package store.
	Store store.Store

	// SyncRate is how often the async mode pushes this node's increments
	// and pulls the cluster totals: 1ms to 1h, default DefaultSyncRate.
	// Must be zero in the other modes.
	SyncRate time.Duration

	// AsyncPolicy is how ModeAsync decides between syncs: Share (the zero
	// value) or Naive. Ignored in the other modes.
	AsyncPolicy AsyncPolicy

	// FailurePolicy is what decisions do while the store fails or the key
	// table is full: FailOpen (the zero value) or FailClosed.
	FailurePolicy FailurePolicy

	// CountDenied makes denied requests consume quota too (Kong's
	// "penalty"): a client that keeps retrying stays denied. A
	// TokenBucket's or LeakyBucket's debt grows with every denial, up to
	// some 73 years (local.MaxAhead) ahead. By default denied requests
	// cost nothing.
	CountDenied bool

	// MaxKeys bounds the keys tracked at once, 1 to 1<<31, default
	// DefaultMaxKeys. Keys idle for twice their longest window (and whose
	// token and leaky buckets are full again) are evicted by the
	// background loop. While the table is full, a request for a new
	// key is decided by FailurePolicy without being tracked: FailOpen
	// admits it (when its cost fits every limit), FailClosed denies it.
	// Keys already tracked are unaffected.
	MaxKeys int

	// MaxKeyLen bounds the length of a key in bytes, 1 to MaxKeyLenCap,
	// default DefaultMaxKeyLen. Longer keys are an error.
	MaxKeyLen int

	// Prefix namespaces this limiter's counters in the store, so limiters
	// with different rules can share one Redis: at most 64 bytes, no '{',
	// '}' or ':' (braces would break Redis Cluster hash tags). Default
	// DefaultPrefix.
	Prefix string

	// StoreTimeout bounds every store call: 1ms to 1m, default
	// DefaultStoreTimeout. A synchronous decision that times out is
	// decided by FailurePolicy.
	StoreTimeout time.Duration

	// Clock is the time source; nil means the real clock. Tests and
	// simulations inject a github.com/benbjohnson/clock mock.
	Clock clock.Clock

	// ClockResolution trades decision cost for time precision. A positive
	// value (1µs to 1s) makes decisions read a timestamp that a background
	// goroutine refreshes every ClockResolution instead of reading the
	// clock (which costs 30–60 ns on virtual machines). A negative value
	// reads the clock on every decision. Zero means 1ms with the real clock
	// and exact reads with an injected Clock. The timestamp lags the clock
	// by up to ClockResolution, and by more while the process is short of
	// CPU (the goroutine that refreshes it waits for a processor): a
	// decision just after a window boundary may then be counted in the
	// window that ended. Where windows must start to the instant, use a
	// negative value.
	ClockResolution time.Duration

	// ClockSync is how often, in ModeAsync and ModeSynchronous, a node
	// measures its offset to the store's clock (Store.Time): 1s to 1h,
	// default DefaultClockSync. Window boundaries then follow the store's
	// clock on every node, whatever their own clocks say. A read whose
	// round trip exceeds StoreTimeout/4 is imprecise: it is kept only when
	// better than the offset in use, and the clock is read again at the
	// next sync cycle; so it is, with no sync cycle run meanwhile, until a
	// first read succeeds, and synchronous decisions wait for that read
	// (see docs/design.md, "Whose clock"). A negative value keeps each
	// node on its own clock.
	ClockSync time.Duration

	// OnError, if set, is called with every store error, from the
	// background loop or from a synchronous decision. It must not block.
	OnError func(error)

	// OnSync, if set, is called after every push of a sync cycle (a cycle
	// pushes each tier's keys, 4096 at most, in a round trip of their
	// own), with the round trip's duration, the counter operations it
	// carried and its error (nil on success); not after the probes of a
	// failing store. Use it for latency histograms. It runs on the sync
	// loop and must not block.
	OnSync func(latency time.Duration, ops int, err error)

	// Logger, if set, receives store errors and sync cycles slower than
	// SyncRate at level Warn, at most one record per LogEvery (default
	// 10s) with the count of errors since the last record, so an outage
	// does not flood the log. Nil logs nothing.
	Logger *slog.Logger
	// LogEvery is the least time between two error records: 1ms to 1h,
	// default 10s.
	LogEvery time.Duration

	// Seed, when not zero, makes the limiter's random draws (the share
	// policy's dither) repeatable, for simulations and tests. Zero draws a
	// seed at random.
	Seed uint64

	// Manual starts no background sync loop: the caller runs Sync (push and
	// pull), SyncClock and Evict itself. For tests and simulations that
	// drive time by hand. (The coarse clock of ClockResolution still ticks.)
	Manual bool
}

// namedRules is a tier's name, its rules and the field that holds them.
type namedRules struct {
	name, field string
	rules       []Rule
}

// tierList returns the default tier, then the others by name.
func (c *Config) tierList() []namedRules {
	out := []namedRules{{"", "Config.Rules", c.Rules}}
	names := make([]string, 0, len(c.Tiers))
	for name := range c.Tiers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		out = append(out, namedRules{name, fmt.Sprintf("Config.Tiers[%q]", name), c.Tiers[name]})
	}
	return out
}
