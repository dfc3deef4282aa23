package hybridlimit

import (
	"math"
	"time"

	"github.com/hybridlimit/hybridlimit/store"
)

// Window arithmetic. Every instant is an int64 of nanoseconds since the Unix
// epoch; windows of size W are aligned to multiples of W since the epoch, so
// a minute window starts on the minute and a day window at 00:00 UTC.
//
// A sliding window estimates the count over the last W as
//
//	estimate = prev·(W − e)/W + cur
//
// where e is the time elapsed in the current window, cur its count and prev
// the count of the window before (Kong's and Cloudflare's definition). A
// fixed window is the same with the previous window's weight at zero.

// rule is a validated Rule in the units the decision path uses.
type rule struct {
	limit  int64
	limitF float64
	w      int64 // window, ns
	invW   float64
	wms    int64 // window, ms
	fixed  bool
	window time.Duration
}

func compileRule(r Rule) rule {
	return rule{
		limit:  r.Limit,
		limitF: float64(r.Limit),
		w:      int64(r.Window),
		invW:   1 / float64(r.Window),
		wms:    r.Window.Milliseconds(),
		fixed:  r.Type == Fixed,
		window: r.Window,
	}
}

// counterKey returns the store key of the rule's window id for a user key
// whose key prefix is base.
func (r *rule) counterKey(base string, id int64) string {
	return store.CounterKey(base, r.wms, id)
}

// windowOf returns the id of the window of size w holding now, and how far
// into it now is.
func windowOf(now, w int64) (id, elapsed int64) {
	id, elapsed = now/w, now%w
	if elapsed < 0 { // before the epoch: keep ids contiguous
		id, elapsed = id-1, elapsed+w
	}
	return id, elapsed
}

// weight returns the weight of the previous window at elapsed into the
// current one: 1 at the start, falling linearly towards 0 at the end.
func weight(elapsed, w int64) float64 {
	return float64(w-elapsed) / float64(w)
}

// estimate returns the rule's count over its window at elapsed into the
// current window, given the previous and current windows' counts.
func (r *rule) estimate(prev, cur, elapsed int64) float64 {
	if r.fixed || prev == 0 {
		return float64(cur)
	}
	return float64(prev)*float64(r.w-elapsed)*r.invW + float64(cur)
}

// admits reports whether a request of cost n fits under the rule when the
// estimate is est.
func (r *rule) admits(est float64, n int64) bool {
	return est+float64(n) <= r.limitF+store.Epsilon
}

// remaining returns the whole requests of cost 1 still admitted when the
// estimate is est.
func (r *rule) remaining(est float64) int64 {
	left := r.limitF - est + store.Epsilon
	if left < 0 {
		return 0
	}
	return int64(left) // truncation is the floor of a non-negative value
}

// retryAfter returns how long from elapsed into the current window until a
// request of cost n would be admitted, if no other request is admitted
// meanwhile. It is 0 when the request is admitted now. n must not exceed
// the limit.
func (r *rule) retryAfter(prev, cur, elapsed, n int64) time.Duration {
	if r.admits(r.estimate(prev, cur, elapsed), n) {
		return 0
	}
	W := float64(r.w)
	if r.fixed {
		return time.Duration(r.w - elapsed)
	}
	if room := r.limitF - float64(cur+n); room >= 0 {
		// Within this window, once the previous window's weight has
		// fallen to room/prev.
		at := math.Ceil(W - room*W/float64(prev))
		return time.Duration(max(int64(at)-elapsed, 0))
	}
	// In the next window, where this window's count becomes the previous
	// one: once its weight has fallen to (limit − n)/cur.
	at := math.Ceil(W - (r.limitF-float64(n))*W/float64(cur))
	return time.Duration(r.w - elapsed + max(int64(at), 0))
}

// resetAfter returns how long from elapsed into the current window until
// the rule is back to its full limit, if no request is admitted meanwhile.
func (r *rule) resetAfter(prev, cur, elapsed int64) time.Duration {
	switch {
	case cur > 0 && !r.fixed:
		return time.Duration(2*r.w - elapsed)
	case cur > 0 || (prev > 0 && !r.fixed):
		return time.Duration(r.w - elapsed)
	}
	return 0
}
