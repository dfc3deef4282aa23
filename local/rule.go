package local

import (
	"fmt"
	"time"
)

// Kind is a rule's algorithm.
type Kind uint8

// The algorithms. Sliding, Fixed and Buckets count requests in windows
// (window.go, buckets.go); Log keeps the instant of every request admitted
// (log.go); GCRA and Leaky keep a theoretical arrival time (gcra.go).
const (
	Sliding Kind = iota // the current window's count plus the previous one's, weighted
	Fixed               // the current window's count
	Buckets             // the sum of the window's last sub-window counts
	Log                 // the exact count of the last window
	GCRA                // a token bucket: a rate and a burst
	Leaky               // a leaky bucket: a rate and a queue, with a delay
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case Sliding:
		return "sliding"
	case Fixed:
		return "fixed"
	case Buckets:
		return "buckets"
	case Log:
		return "log"
	case GCRA:
		return "gcra"
	case Leaky:
		return "leaky"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Spec describes a rule. The caller validates it (see the root package's
// Rule): Limit ≥ 1, Window a positive whole number of milliseconds, for
// Buckets a Window divisible into Buckets whole milliseconds, for GCRA and
// Leaky a rate of at most one per microsecond.
type Spec struct {
	Kind    Kind
	Limit   int64         // cost admitted per Window (GCRA, Leaky: the rate is Limit per Window)
	Window  time.Duration // the window
	Buckets int           // Buckets: the sub-windows of a window
	Burst   int64         // GCRA: the bucket's size; Leaky: the queue's size (cost)
}

// Rule is a compiled rule, in the units the decision path uses. Create one
// with NewRule.
type Rule struct {
	kind   Kind
	limit  int64
	limitF float64
	limitE float64 // limitF + Epsilon
	w      int64   // the counter's window (Buckets: one bucket), ns
	invW   float64
	weigh  float64 // invW, or 0 when the previous window does not weigh (Fixed, Buckets): prevPart without a branch
	fixed  bool    // the previous counter window does not weigh (Fixed, Buckets)
	span   int64   // counter windows per window: Buckets' count, 1 otherwise
	window int64   // the rule's window, ns
	full   int64   // Sliding, Fixed: ns from a window's start until a count in it no longer weighs (resetAfter)
	t      int64   // GCRA, Leaky: the emission interval, ns (whole µs)
	burst  int64   // GCRA: bucket size; Leaky: queue size
	owed   int64   // GCRA, Leaky: the most pending cost an arrival time counts, MaxAhead/t
}

// NewRule compiles s.
func NewRule(s Spec) Rule {
	r := Rule{kind: s.Kind, limit: s.Limit, limitF: float64(s.Limit), w: int64(s.Window), window: int64(s.Window), span: 1, burst: s.Burst}
	switch s.Kind {
	case Fixed:
		r.fixed = true
	case Buckets:
		r.fixed = true
		r.span = int64(max(s.Buckets, 1))
		r.w = int64(s.Window) / r.span
	case GCRA, Leaky:
		// The emission interval in whole microseconds, rounded up: the
		// store keeps arrival times in microseconds, and the same interval
		// on every node and in the store keeps every decision the same.
		us := int64(s.Window / time.Microsecond)
		r.t = (us + s.Limit - 1) / s.Limit * int64(time.Microsecond)
		if r.burst < 1 {
			r.burst = s.Limit
		}
		r.owed = MaxAhead / max(r.t, 1)
	}
	r.full = 2 * r.w
	if r.fixed {
		r.full = r.w
	}
	r.invW = 1 / float64(r.w)
	if !r.fixed {
		r.weigh = r.invW
	}
	r.limitE = r.limitF + Epsilon
	return r
}

// Kind returns the rule's algorithm.
func (r *Rule) Kind() Kind { return r.kind }

// Limit returns the rule's limit per window.
func (r *Rule) Limit() int64 { return r.limit }

// Window returns the rule's window.
func (r *Rule) Window() time.Duration { return time.Duration(r.window) }

// Fixed reports whether the previous counter window does not weigh.
func (r *Rule) Fixed() bool { return r.fixed }

// Counter returns the window of the rule's store counters (for Buckets,
// one bucket) and how many of them a window spans.
func (r *Rule) Counter() (window time.Duration, span int64) {
	return time.Duration(r.w), r.span
}

// Interval returns a GCRA or Leaky rule's emission interval.
func (r *Rule) Interval() time.Duration { return time.Duration(r.t) }

// Burst returns a GCRA rule's bucket size or a Leaky rule's queue size.
func (r *Rule) Burst() int64 { return r.burst }

// weighsPrev reports whether the rule's decisions weigh the previous
// window's count (Sliding; Buckets, whose previous window is the last
// closed bucket).
func (r *Rule) weighsPrev() bool { return r.kind == Sliding || r.kind == Buckets }

// counted reports whether the rule counts in window counters (Sliding,
// Fixed, Buckets).
func (r *Rule) counted() bool { return r.kind <= Buckets }
