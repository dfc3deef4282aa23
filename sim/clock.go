package main

import (
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// vclock is the simulation's virtual clock: a github.com/benbjohnson/clock
// Clock whose Now is a field the driver advances. It never sleeps, so a
// decision costs no more than with the real clock. Its timers come from a
// clock.Mock that is never advanced: in virtual time nothing runs in the
// background (limiters use Config.Manual), so they never fire.
//
// A vclock is safe for concurrent use; the zero value is not usable, create
// one with newVClock.
type vclock struct {
	*clock.Mock
	ns     atomic.Int64 // virtual now, ns since the Unix epoch
	offset int64        // added to every reading (per-node skew)
	base   *vclock      // the clock this one is skewed from, nil for the base
}

// newVClock returns a base clock reading start.
func newVClock(start time.Time) *vclock {
	c := &vclock{Mock: clock.NewMock()}
	c.ns.Store(start.UnixNano())
	return c
}

// skewed returns a clock that reads c's time plus offset.
func (c *vclock) skewed(offset time.Duration) *vclock {
	return &vclock{Mock: c.Mock, offset: int64(offset), base: c}
}

// set moves the base clock to ns (it never goes back).
func (c *vclock) set(ns int64) {
	if ns > c.ns.Load() {
		c.ns.Store(ns)
	}
}

func (c *vclock) nowNs() int64 {
	if c.base != nil {
		return c.base.ns.Load() + c.offset
	}
	return c.ns.Load()
}

// Now implements clock.Clock.
func (c *vclock) Now() time.Time { return time.Unix(0, c.nowNs()) }

// Since implements clock.Clock.
func (c *vclock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Until implements clock.Clock.
func (c *vclock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }
