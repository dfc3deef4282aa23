package local

import (
	"math"
	"time"
)

// Window arithmetic: every formula a decision uses is defined here, once.
// Instants are int64 nanoseconds since the Unix epoch on the cluster's
// clock; windows of size W are aligned to multiples of W since the epoch.
// A sliding window estimates the count over the last W as
//
//	estimate = prev·(W − e)/W + cur
//
// where e is the time elapsed in the current window, cur its count and prev
// the count of the window before (Kong's and Cloudflare's definition). A
// fixed window is the same with the previous window's weight at zero.

// Epsilon absorbs floating-point error in the sliding-window comparison.
const Epsilon = 1e-9

// Rule is a compiled rule: a limit per window, in the units the decision
// path uses. Create one with NewRule.
type Rule struct {
	limit  int64
	limitF float64
	w      int64 // window, ns
	invW   float64
	fixed  bool
}

// NewRule returns the rule admitting limit per window of the given size,
// sliding or fixed. The caller validates the values (limit ≥ 1, window a
// positive whole number of milliseconds).
func NewRule(limit int64, window time.Duration, fixed bool) Rule {
	return Rule{limit: limit, limitF: float64(limit), w: int64(window), invW: 1 / float64(window), fixed: fixed}
}

// Limit returns the rule's limit per window.
func (r *Rule) Limit() int64 { return r.limit }

// Window returns the rule's window size.
func (r *Rule) Window() time.Duration { return time.Duration(r.w) }

// Fixed reports whether the rule counts fixed windows.
func (r *Rule) Fixed() bool { return r.fixed }

// WindowOf returns the id of the window of size w (ns) holding now, and how
// far into it now is.
func WindowOf(now, w int64) (id, elapsed int64) {
	id, elapsed = now/w, now%w
	if elapsed < 0 { // before the epoch: keep ids contiguous
		id, elapsed = id-1, elapsed+w
	}
	return id, elapsed
}

// estimate returns the rule's count over its window at elapsed into the
// current window, given the previous and current windows' counts.
func (r *Rule) estimate(prev, cur, elapsed int64) float64 {
	if r.fixed || prev == 0 {
		return float64(cur)
	}
	return float64(prev)*float64(r.w-elapsed)*r.invW + float64(cur)
}

// admits reports whether a request of cost n fits under the rule when the
// estimate is est.
func (r *Rule) admits(est float64, n int64) bool {
	return est+float64(n) <= r.limitF+Epsilon
}

// Admits reports whether a request of cost n fits under the rule at elapsed
// into the current window, with prev and cur the previous and current
// windows' counts. It is the admission rule of every mode: the store's
// synchronous script is tested against it.
func (r *Rule) Admits(prev, cur, elapsed, n int64) bool {
	return r.admits(r.estimate(prev, cur, elapsed), n)
}

// remaining returns the whole requests of cost 1 still admitted when the
// estimate is est.
func (r *Rule) remaining(est float64) int64 {
	left := r.limitF - est + Epsilon
	if left < 0 {
		return 0
	}
	return int64(left) // truncation is the floor of a non-negative value
}

// retryAfter returns how long from elapsed into the current window until a
// request of cost n would be admitted, if no other request is admitted
// meanwhile, rounded up to a multiple of unit (ns, at least 1). It is 0
// when the request is admitted now. n must not exceed the limit.
func (r *Rule) retryAfter(prev, cur, elapsed, n, unit int64) int64 {
	if r.admits(r.estimate(prev, cur, elapsed), n) {
		return 0
	}
	var d int64
	switch {
	case r.fixed:
		d = r.w - elapsed
	case r.limitF-float64(cur+n) >= 0:
		// Within this window, once the previous window's weight has
		// fallen to room/prev.
		room := r.limitF - float64(cur+n)
		at := ceilTo(float64(r.w)-room*float64(r.w)/float64(prev), elapsed, unit)
		d = max(at-elapsed, 0)
	default:
		// In the next window, where this window's count becomes the
		// previous one: once its weight has fallen to (limit − n)/cur.
		at := ceilTo(float64(r.w)-(r.limitF-float64(n))*float64(r.w)/float64(cur), elapsed-r.w, unit)
		d = r.w - elapsed + max(at, 0)
	}
	return d
}

// ceilTo returns the least instant x ≥ at (ns into a window) such that
// x − from is a multiple of unit: the first instant a caller that reads
// time in steps of unit, starting at from, can see.
func ceilTo(at float64, from, unit int64) int64 {
	x := int64(math.Ceil(at))
	if unit <= 1 {
		return x
	}
	if d := (x - from) % unit; d > 0 {
		x += unit - d
	}
	return x
}

// resetAfter returns how long from elapsed into the current window until
// the rule is back to its full limit, if no request is admitted meanwhile.
func (r *Rule) resetAfter(prev, cur, elapsed int64) int64 {
	switch {
	case cur > 0 && !r.fixed:
		return 2*r.w - elapsed
	case cur > 0 || (prev > 0 && !r.fixed):
		return r.w - elapsed
	}
	return 0
}

// Counts is one rule's counts as a decision sees them: the previous and
// current windows' totals and how far into the current window the decision
// is.
type Counts struct {
	Prev, Cur, Elapsed int64
}

// Decision is the outcome of a decision on one key, describing one rule:
// for a denied request the denying rule that needs the longest wait,
// otherwise the tightest rule (the least remaining).
type Decision struct {
	Allowed bool
	// Rule is the index of the rule described.
	Rule int
	// Remaining is the cost that rule still admits (after the request,
	// when it was admitted and counted).
	Remaining int64
	// RetryAfter is how long until the request would be admitted (ns),
	// 0 when Allowed.
	RetryAfter int64
	// ResetAfter is how long until the rule is back to its full limit
	// (ns).
	ResetAfter int64
}

// Summarize builds the decision that the counts of every rule describe,
// for a request of cost n: for a denied request the reported rule is the
// one that needs the longest wait, rounded up to a multiple of unit ns
// (the store's time step in the synchronous mode, 1 otherwise).
func Summarize(rules []Rule, counts []Counts, n int64, allowed bool, unit int64) Decision {
	d := Decision{Allowed: allowed, Rule: -1, Remaining: math.MaxInt64, RetryAfter: -1}
	for i := range rules {
		r, x := &rules[i], &counts[i]
		est := r.estimate(x.Prev, x.Cur, x.Elapsed)
		var better bool
		if allowed {
			better = r.remaining(est) < d.Remaining
		} else if retry := r.retryAfter(x.Prev, x.Cur, x.Elapsed, n, unit); retry > d.RetryAfter {
			better, d.RetryAfter = true, retry
		}
		if better {
			d.Rule = i
			d.Remaining = r.remaining(est)
			d.ResetAfter = r.resetAfter(x.Prev, x.Cur, x.Elapsed)
		}
	}
	if allowed {
		d.RetryAfter = 0
	}
	return d
}

// Level returns what the rule admits at counts c: the whole requests of
// cost 1 still admitted, and how long until the rule is back to its full
// limit (ns) if nothing is admitted meanwhile.
func (r *Rule) Level(c Counts) (remaining, resetAfter int64) {
	return r.remaining(r.estimate(c.Prev, c.Cur, c.Elapsed)), r.resetAfter(c.Prev, c.Cur, c.Elapsed)
}
