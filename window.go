package hybridlimit

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/local"
)

// Windows. This file holds what a user configures about windows (Rule and
// Algorithm) and when a decision happens: the instant every node reads,
// on one clock for the whole cluster. How much a window holds — the
// counts, the sliding estimate, remaining, retry-after and reset — is
// computed in package local, next to the counters (local/window.go), so
// that every formula is defined once and a counter's state changes in one
// package.
//
// Windows of size W are aligned to multiples of W since the Unix epoch (a
// minute window starts on the minute, a day window at 00:00 UTC) on the
// store's clock: in ModeAsync and ModeSynchronous every node measures its
// offset to the store's clock (Store.Time) every Config.ClockSync and adds
// it to its own clock, so that all nodes agree on window boundaries
// whatever their own clocks say.

// Algorithm selects how a Rule counts. The zero value is Sliding.
type Algorithm uint8

const (
	// Sliding estimates the count over the last Window as the current
	// window's count plus the previous window's count weighted by how much
	// of it the last Window still covers: 42 requests in the previous
	// minute and 18 in this one, 15 s in, estimate 42·45/60 + 18 = 49.5.
	Sliding Algorithm = iota
	// Fixed counts requests in windows aligned to multiples of Window since
	// the Unix epoch; the count restarts at zero at every boundary.
	Fixed
	// Bucketed divides Window into Rule.Buckets sub-windows, each with its
	// own counter, and counts the last Buckets of them, the current one
	// included: exact to a bucket, a knob between Sliding's two-window
	// estimate and Log. In ModeAsync a bucket must last at least SyncRate.
	Bucketed
	// Log counts exactly the cost admitted in the last Window, keeping the
	// instant of every unit of cost: Limit × 8 bytes per key, Limit at most
	// MaxLogLimit. A denied request learns exactly when it fits: when the
	// oldest counted cost leaves the window. In ModeAsync, where a log
	// cannot be merged cheaply, a Log rule counts like Bucketed with
	// buckets of two sync periods where Window allows, and Window must be
	// at least 2×SyncRate (see docs/algorithms.md).
	Log
	// TokenBucket admits Limit per Window as a steady rate, with bursts of
	// up to Rule.Burst (the generic cell rate algorithm, GCRA): the same
	// requests as golang.org/x/time/rate with the same rate and burst.
	TokenBucket
	// LeakyBucket queues requests so that they proceed at Limit per Window:
	// an admitted request may have to wait Result.Delay for its turn, and
	// the queue holds Rule.Burst units of cost, the one proceeding now
	// included: a request of cost n that would wait for more than
	// Burst − n units ahead of it is denied (with Burst 3, three requests
	// at once are admitted, with delays of 0, 1 and 2 intervals, and a
	// fourth is denied).
	// WaitN waits the delay; the HTTP middleware holds the request for it.
	LeakyBucket
)

// String returns "sliding", "fixed", "bucketed", "log", "token-bucket" or
// "leaky-bucket".
func (a Algorithm) String() string {
	switch a {
	case Sliding:
		return "sliding"
	case Fixed:
		return "fixed"
	case Bucketed:
		return "bucketed"
	case Log:
		return "log"
	case TokenBucket:
		return "token-bucket"
	case LeakyBucket:
		return "leaky-bucket"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Rule admits at most Limit units of cost per Window for each key, counted
// by its Type. The zero value is not a valid rule.
type Rule struct {
	// Limit is the cost admitted per window, 1 to MaxLimit (a Log rule:
	// at most MaxLogLimit). For TokenBucket and LeakyBucket, Limit per
	// Window is the rate, at most one per microsecond (Window/Limit ≥
	// 1µs).
	Limit int64
	// Window is the window size: a whole number of milliseconds from 1ms
	// to MaxWindow, and in ModeAsync at least Config.SyncRate for a
	// Sliding or Fixed rule, Buckets × Config.SyncRate for a Bucketed
	// rule (each bucket at least Config.SyncRate), and 2 × Config.SyncRate
	// for a Log rule. Windows are aligned to multiples of Window
	// since the Unix epoch (a day window starts at 00:00 UTC).
	Window time.Duration
	// Type is the algorithm: Sliding (the default), Fixed, Bucketed, Log,
	// TokenBucket or LeakyBucket.
	Type Algorithm
	// Buckets is the number of sub-windows of a Bucketed rule: 2 to
	// MaxBuckets, dividing Window into whole milliseconds. Zero for the
	// other types.
	Buckets int
	// Burst is a TokenBucket's size, or a LeakyBucket's queue, in units
	// of cost: 1 to MaxLimit, default (zero) Limit, and at most what
	// refills within MaxWindow (Burst·Window/Limit ≤ MaxWindow). Zero for
	// the other types.
	Burst int64
}

// String returns the rule in the form "100/1m0s sliding" (with the buckets
// or the burst when they apply).
func (r Rule) String() string {
	switch r.Type {
	case Bucketed:
		return fmt.Sprintf("%d/%v %v×%d", r.Limit, r.Window, r.Type, r.Buckets)
	case TokenBucket, LeakyBucket:
		return fmt.Sprintf("%d/%v %v burst %d", r.Limit, r.Window, r.Type, r.burst())
	}
	return fmt.Sprintf("%d/%v %v", r.Limit, r.Window, r.Type)
}

// burst returns a bucket rule's burst, Limit by default.
func (r Rule) burst() int64 {
	if r.Burst == 0 {
		return r.Limit
	}
	return r.Burst
}

// maxCost returns the largest cost the rule can ever admit.
func (r Rule) maxCost() int64 {
	if r.Type == TokenBucket || r.Type == LeakyBucket {
		return r.burst()
	}
	return r.Limit
}

// spec returns the rule as package local counts it.
func (r Rule) spec() local.Spec {
	s := local.Spec{Limit: r.Limit, Window: r.Window, Buckets: r.Buckets, Burst: r.Burst}
	switch r.Type {
	case Fixed:
		s.Kind = local.Fixed
	case Bucketed:
		s.Kind = local.Buckets
	case Log:
		s.Kind = local.Log
	case TokenBucket:
		s.Kind = local.GCRA
	case LeakyBucket:
		s.Kind = local.Leaky
	}
	return s
}

// logBuckets returns the buckets a Log rule of window w counts with in
// ModeAsync: the most, up to MaxBuckets, that divide w into whole
// milliseconds of at least two sync periods, or else of one. A bucket of
// one period is over before the nodes have heard of each other's
// admissions in it: with go run ./sim -rules 1000/1s:buckets=10 the
// cluster admits 4 % over the log, with buckets=5 under 1 %. It returns 1
// when w is too short for two buckets of a period.
func logBuckets(w, syncRate time.Duration) int {
	ms := int64(w / time.Millisecond)
	for _, least := range []time.Duration{2 * syncRate, syncRate} {
		for b := int64(MaxBuckets); b > 1; b-- {
			if ms%b == 0 && time.Duration(ms/b)*time.Millisecond >= least {
				return int(b)
			}
		}
	}
	return 1
}

// validate checks a rule of a Config; field names it in errors
// ("Config.Rules[1]").
func (r Rule) validate(field string) error {
	max := int64(MaxLimit)
	if r.Type == Log {
		max = MaxLogLimit
	}
	switch {
	case r.Type > LeakyBucket:
		return fmt.Errorf("hybridlimit: %s.Type is %v, want Sliding, Fixed, Bucketed, Log, TokenBucket or LeakyBucket", field, r.Type)
	case r.Limit < 1 || r.Limit > max:
		return fmt.Errorf("hybridlimit: %s.Limit is %d, want 1 to %d for a %v rule", field, r.Limit, max, r.Type)
	case r.Window < time.Millisecond || r.Window > MaxWindow:
		return fmt.Errorf("hybridlimit: %s.Window is %v, want 1ms to %v", field, r.Window, MaxWindow)
	case r.Window%time.Millisecond != 0:
		return fmt.Errorf("hybridlimit: %s.Window is %v, want a whole number of milliseconds", field, r.Window)
	case r.Type == Bucketed && (r.Buckets < 2 || r.Buckets > MaxBuckets):
		return fmt.Errorf("hybridlimit: %s.Buckets is %d, want 2 to %d for a Bucketed rule", field, r.Buckets, MaxBuckets)
	case r.Type == Bucketed && r.Window.Milliseconds()%int64(r.Buckets) != 0:
		return fmt.Errorf("hybridlimit: %s.Buckets is %d, which does not divide Window %v into whole milliseconds", field, r.Buckets, r.Window)
	case r.Type != Bucketed && r.Buckets != 0:
		return fmt.Errorf("hybridlimit: %s.Buckets is %d, but only a Bucketed rule has buckets; leave it zero", field, r.Buckets)
	case (r.Type == TokenBucket || r.Type == LeakyBucket) && (r.Burst < 0 || r.Burst > MaxLimit):
		return fmt.Errorf("hybridlimit: %s.Burst is %d, want 1 to %d (0: Limit)", field, r.Burst, int64(MaxLimit))
	case (r.Type == TokenBucket || r.Type == LeakyBucket) && r.Window/time.Duration(r.Limit) < time.Microsecond:
		return fmt.Errorf("hybridlimit: %s is %d per %v, faster than one per microsecond, the most a %v admits", field, r.Limit, r.Window, r.Type)
	case (r.Type == TokenBucket || r.Type == LeakyBucket) && !r.refillsInMaxWindow():
		return fmt.Errorf("hybridlimit: %s.Burst is %d: at %d per %v the bucket refills in longer than MaxWindow %v", field, r.burst(), r.Limit, r.Window, MaxWindow)
	case r.Type != TokenBucket && r.Type != LeakyBucket && r.Burst != 0:
		return fmt.Errorf("hybridlimit: %s.Burst is %d, but only TokenBucket and LeakyBucket rules have a burst; leave it zero", field, r.Burst)
	}
	return nil
}

// refillsInMaxWindow reports whether a bucket rule's Burst intervals of
// Window/Limit last at most MaxWindow (Burst·Window ≤ MaxWindow·Limit, in
// 128 bits), so that an arrival time stays within int64 nanoseconds.
func (r Rule) refillsInMaxWindow() bool {
	bh, bl := bits.Mul64(uint64(r.burst()), uint64(r.Window))
	mh, ml := bits.Mul64(uint64(MaxWindow), uint64(r.Limit))
	return bh < mh || bh == mh && bl <= ml
}

// sameCounters reports whether rules a and b would count in the same
// store keys: two window rules with the same window, two Bucketed rules
// with the same buckets, two bucket rules with the same emission interval
// as the store keeps it (whole microseconds, rounded up) and the same
// burst, or two Log rules with the same window.
func sameCounters(a, b Rule) bool {
	switch {
	case a.Type <= Fixed && b.Type <= Fixed:
		return a.Window == b.Window
	case a.Type == Bucketed && b.Type == Bucketed:
		return a.Window == b.Window && a.Buckets == b.Buckets
	case a.Type == Log && b.Type == Log:
		return a.Window == b.Window
	case (a.Type == TokenBucket || a.Type == LeakyBucket) && (b.Type == TokenBucket || b.Type == LeakyBucket):
		ra, rb := local.NewRule(a.spec()), local.NewRule(b.spec())
		return ra.Interval() == rb.Interval() && a.burst() == b.burst()
	}
	return false
}

// clusterClock is the time every decision reads: this node's clock, read
// exactly or through a coarse timestamp refreshed in the background, plus
// the measured offset to the store's clock.
type clusterClock struct {
	clock  clock.Clock
	exact  bool
	coarse atomic.Int64
	offset *atomic.Int64 // the store's clock minus this node's, ns
}

func newClusterClock(c clock.Clock, exact bool, offset *atomic.Int64) *clusterClock {
	cc := &clusterClock{clock: c, exact: exact, offset: offset}
	cc.coarse.Store(c.Now().UnixNano())
	return cc
}

// now returns the current instant, ns since the Unix epoch, on the
// cluster's clock. The coarse read is inlined in every decision.
func (c *clusterClock) now() int64 {
	if c.exact {
		return c.exactNow()
	}
	return c.coarse.Load() + c.offset.Load()
}

func (c *clusterClock) exactNow() int64 {
	return c.clock.Now().UnixNano() + c.offset.Load()
}

// tick refreshes the coarse timestamp.
func (c *clusterClock) tick() { c.coarse.Store(c.clock.Now().UnixNano()) }
