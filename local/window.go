package local

import "math"

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
	if prev == 0 {
		return float64(cur)
	}
	return r.prevPart(prev, elapsed) + float64(cur)
}

// prevPart returns the previous window's part of the estimate at elapsed
// into the current window: estimate is prevPart + cur, so that a decision
// computes it once for the estimates before and after its request. It is
// 0 for a rule whose previous window does not weigh (r.weigh is 0), without
// a branch. The conversion rounds the product, as estimate's sum needs.
func (r *Rule) prevPart(prev, elapsed int64) float64 {
	return float64(float64(prev) * float64(r.w-elapsed) * r.weigh)
}

// admits reports whether a request of cost n fits under the rule when the
// estimate is est.
func (r *Rule) admits(est float64, n int64) bool {
	return est+float64(n) <= r.limitE
}

// Admits reports whether a request of cost n fits under the rule at elapsed
// into the current window, with prev and cur the previous and current
// windows' counts. It is the admission rule of every mode: the store's
// synchronous script is tested against it.
func (r *Rule) admitsWindow(prev, cur, elapsed, n int64) bool {
	return r.admits(r.estimate(prev, cur, elapsed), n)
}

// remaining returns the whole requests of cost 1 still admitted when the
// estimate is est: the floor of limit − est + Epsilon. It is what a
// decision reports after its request, at the least cost; level is the
// exact answer, which it is but where they round apart.
func (r *Rule) remaining(est float64) int64 {
	left := r.limitF - est + Epsilon
	if left < 0 {
		return 0
	}
	return int64(left) // truncation is the floor of a non-negative value
}

// remainingAdmitted is remaining for the estimate after a request the
// rule admitted: est is at most limit + Epsilon plus a rounding error far
// below one, so limit − est + Epsilon is above −1, and the conversion,
// which truncates towards zero, gives remaining's 0 without the test.
func (r *Rule) remainingAdmitted(est float64) int64 {
	return int64(r.limitF - est + Epsilon)
}

// level returns the largest whole cost admitted when the estimate is est:
// the largest k with admits(est, k), 0 when there is none. remaining is
// within one of it: the floor of limit − est + Epsilon and the test est +
// k ≤ limit + Epsilon round apart where est lies within a rounding error
// of a whole count plus Epsilon (one request of the previous window
// weighs 1e-9 a nanosecond before a one-second window ends).
func (r *Rule) level(est float64) int64 {
	k := r.remaining(est)
	if est+float64(k+1) <= r.limitE {
		return k + 1
	}
	if k > 0 && !r.admits(est, k) {
		return k - 1
	}
	return k
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
	if !r.fitsAfter(prev, cur, elapsed, d, n) {
		d = r.firstFit(prev, cur, elapsed, d, n, unit)
	}
	return d
}

// fitsAfter reports whether a request of cost n fits d after elapsed into
// the current window, whose counts are prev and cur, if nothing else is
// counted meanwhile.
func (r *Rule) fitsAfter(prev, cur, elapsed, d, n int64) bool {
	switch x := elapsed + d; {
	case x < r.w:
		return r.admitsWindow(prev, cur, x, n)
	case x < 2*r.w:
		return r.admitsWindow(cur, 0, x-r.w, n)
	}
	return true // prev and cur have slid out
}

// firstFit returns the least d' > d, d plus a multiple of unit, at which
// a request of cost n fits (fitsAfter), given that it does not fit at d.
// The exact fractions of retryAfter can fall a little short when the
// estimate's rounding is larger than its slack (long windows, large
// limits); the estimate only falls as time passes.
func (r *Rule) firstFit(prev, cur, elapsed, d, n, unit int64) int64 {
	last := (2*r.w-elapsed-d+unit-1)/unit + 1 // steps of unit after d to where nothing is left
	a, b := int64(0), int64(1)                // a does not fit, b is tried next
	for b < last && !r.fitsAfter(prev, cur, elapsed, d+b*unit, n) {
		a, b = b, min(2*b, last)
	}
	for b-a > 1 {
		m := a + (b-a)/2
		if r.fitsAfter(prev, cur, elapsed, d+m*unit, n) {
			b = m
		} else {
			a = m
		}
	}
	return d + b*unit
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

// Counts is one rule's state as a decision sees it, in the fields its
// kind uses.
type Counts struct {
	// Sliding, Fixed: the previous and current windows' totals and how far
	// into the current window the decision is. Log: Cur is the cost counted
	// in the last window.
	Prev, Cur, Elapsed int64
	// Buckets: the counts of the window's buckets, oldest first, the
	// current one last; Elapsed is the time into the current bucket.
	Buckets []int64
	// GCRA, Leaky: the theoretical arrival time minus now (ns).
	Tat int64
	// Log: how long until enough counted cost leaves the window for the
	// request to fit (0 if it fits), and until the last counted cost
	// leaves it (ns).
	Expire, Reset int64
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
	// Delay is how long an admitted request waits for its turn before it
	// proceeds (ns): a Leaky rule's queue; the longest of the rules.
	Delay int64
}

// Admits reports whether a request of cost n fits the rule at counts c. It
// is the admission rule of every mode: the store's synchronous script is
// tested against it.
func (r *Rule) Admits(c Counts, n int64) bool {
	switch r.kind {
	case Buckets:
		return r.bucketSum(c.Buckets)+n <= r.limit
	case Log:
		return c.Cur+n <= r.limit
	case GCRA, Leaky:
		return r.gcraAdmits(c.Tat, n)
	}
	return r.admitsWindow(c.Prev, c.Cur, c.Elapsed, n)
}

// describe returns, for a request of cost n at counts c (after the
// request, when allowed): what the rule still admits, how long until the
// request fits (when denied; rounded up to a multiple of unit ns), until
// the rule is back to its full limit, and the request's delay (when
// allowed).
func (r *Rule) describe(c *Counts, n int64, allowed bool, unit int64) (remaining, retry, reset, delay int64) {
	switch r.kind {
	case Buckets:
		remaining, reset = r.bucketLevel(c.Buckets, c.Elapsed)
		if !allowed {
			retry = r.bucketRetry(c.Buckets, c.Elapsed, n)
		}
	case Log:
		remaining, reset = max(r.limit-c.Cur, 0), c.Reset
		if !allowed {
			retry = c.Expire
		}
	case GCRA, Leaky:
		remaining, reset = r.gcraLevel(c.Tat)
		switch {
		case !allowed:
			retry = r.gcraRetry(c.Tat, n)
		case r.kind == Leaky:
			delay = max(c.Tat-n*r.t, 0) // c.Tat is after the request: its slot began n intervals before
		}
	default:
		est := r.estimate(c.Prev, c.Cur, c.Elapsed)
		remaining, reset = r.level(est), r.resetAfter(c.Prev, c.Cur, c.Elapsed)
		if !allowed {
			retry = r.retryAfter(c.Prev, c.Cur, c.Elapsed, n, unit)
		}
	}
	if retry > 0 && unit > 1 && r.kind != Sliding && r.kind != Fixed {
		retry = (retry + unit - 1) / unit * unit
	}
	return remaining, retry, reset, delay
}

// Summarize builds the decision that the counts of every rule describe,
// for a request of cost n: for a denied request the reported rule is the
// one that needs the longest wait, rounded up to a multiple of unit ns
// (the store's time step in the synchronous mode, 1 otherwise).
func Summarize(rules []Rule, counts []Counts, n int64, allowed bool, unit int64) Decision {
	d := Decision{Allowed: allowed, Rule: -1, Remaining: math.MaxInt64, RetryAfter: -1}
	for i := range rules {
		rem, retry, reset, delay := rules[i].describe(&counts[i], n, allowed, unit)
		d.Delay = max(d.Delay, delay)
		var better bool
		if allowed {
			better = rem < d.Remaining
		} else if retry > d.RetryAfter {
			better, d.RetryAfter = true, retry
		}
		if better {
			d.Rule, d.Remaining, d.ResetAfter = i, rem, reset
		}
	}
	if allowed {
		d.RetryAfter = 0
	} else {
		d.Delay = 0
	}
	return d
}

// Level returns what the rule admits at counts c: the whole requests of
// cost 1 still admitted, and how long until the rule is back to its full
// limit (ns) if nothing is admitted meanwhile.
func (r *Rule) Level(c Counts) (remaining, resetAfter int64) {
	remaining, _, resetAfter, _ = r.describe(&c, 1, true, 1)
	return remaining, resetAfter
}
