package hybridlimit

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/local"
)

// Windows. This file holds what a user configures about windows (Rule and
// WindowType) and when a decision happens: the instant every node reads,
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

// WindowType selects how a Rule counts. The zero value is Sliding.
type WindowType uint8

const (
	// Sliding estimates the count over the last Window as the current
	// window's count plus the previous window's count weighted by how much
	// of it the last Window still covers: 42 requests in the previous
	// minute and 18 in this one, 15 s in, estimate 42·45/60 + 18 = 49.5.
	Sliding WindowType = iota
	// Fixed counts requests in windows aligned to multiples of Window since
	// the Unix epoch; the count restarts at zero at every boundary.
	Fixed
)

// String returns "sliding" or "fixed".
func (t WindowType) String() string {
	switch t {
	case Sliding:
		return "sliding"
	case Fixed:
		return "fixed"
	}
	return fmt.Sprintf("WindowType(%d)", uint8(t))
}

// Rule admits at most Limit units of cost per Window for each key. The zero
// value is not a valid rule.
type Rule struct {
	// Limit is the cost admitted per window, 1 to MaxLimit.
	Limit int64
	// Window is the window size: a whole number of milliseconds from 1ms
	// to MaxWindow.
	Window time.Duration
	// Type is Sliding (the default) or Fixed.
	Type WindowType
}

// String returns the rule in the form "100/1m0s sliding".
func (r Rule) String() string {
	return fmt.Sprintf("%d/%v %v", r.Limit, r.Window, r.Type)
}

// compile returns the rule as package local counts it.
func (r Rule) compile() local.Rule {
	return local.NewRule(r.Limit, r.Window, r.Type == Fixed)
}

// validate checks rule i of a Config.
func (r Rule) validate(i int) error {
	switch {
	case r.Limit < 1 || r.Limit > MaxLimit:
		return fmt.Errorf("hybridlimit: Config.Rules[%d].Limit is %d, want 1 to %d", i, r.Limit, int64(MaxLimit))
	case r.Window < time.Millisecond || r.Window > MaxWindow:
		return fmt.Errorf("hybridlimit: Config.Rules[%d].Window is %v, want 1ms to %v", i, r.Window, MaxWindow)
	case r.Window%time.Millisecond != 0:
		return fmt.Errorf("hybridlimit: Config.Rules[%d].Window is %v, want a whole number of milliseconds", i, r.Window)
	case r.Type > Fixed:
		return fmt.Errorf("hybridlimit: Config.Rules[%d].Type is %v, want Sliding or Fixed", i, r.Type)
	}
	return nil
}

// clusterClock is the time every decision reads: this node's clock, read
// exactly or through a coarse timestamp refreshed in the background, plus
// the measured offset to the store's clock.
type clusterClock struct {
	clock  clock.Clock
	exact  bool
	coarse atomic.Int64
	offset func() int64 // the store's clock minus this node's, ns
}

func newClusterClock(c clock.Clock, exact bool, offset func() int64) *clusterClock {
	cc := &clusterClock{clock: c, exact: exact, offset: offset}
	cc.coarse.Store(c.Now().UnixNano())
	return cc
}

// now returns the current instant, ns since the Unix epoch, on the
// cluster's clock.
func (c *clusterClock) now() int64 {
	if c.exact {
		return c.clock.Now().UnixNano() + c.offset()
	}
	return c.coarse.Load() + c.offset()
}

// tick refreshes the coarse timestamp.
func (c *clusterClock) tick() { c.coarse.Store(c.clock.Now().UnixNano()) }
