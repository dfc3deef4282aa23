package local

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is a window boundary for every window size used in these tests.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// spec is a rule as these tables write it.
type spec struct {
	limit  int64
	window time.Duration
	fixed  bool
}

func (s spec) spec() Spec {
	k := Sliding
	if s.fixed {
		k = Fixed
	}
	return Spec{Kind: k, Limit: s.limit, Window: s.window}
}

func TestWindowOf(t *testing.T) {
	w := int64(time.Minute)
	tests := []struct {
		at      time.Time
		id, el  int64
		weight  float64
		comment string
	}{
		{t0, t0.UnixNano() / w, 0, 1, "window start"},
		{t0.Add(15 * time.Second), t0.UnixNano() / w, int64(15 * time.Second), 0.75, "quarter"},
		{t0.Add(30 * time.Second), t0.UnixNano() / w, int64(30 * time.Second), 0.5, "middle"},
		{t0.Add(time.Minute - time.Nanosecond), t0.UnixNano() / w, w - 1, 1 / float64(w), "last nanosecond"},
		{t0.Add(time.Minute), t0.UnixNano()/w + 1, 0, 1, "next window start"},
	}
	for i, tt := range tests {
		id, el := WindowOf(tt.at.UnixNano(), w)
		assert.Equal(t, tt.id, id, "step %d (%s): id", i, tt.comment)
		assert.Equal(t, tt.el, el, "step %d (%s): elapsed", i, tt.comment)
		assert.InDelta(t, tt.weight, float64(w-el)/float64(w), 1e-12, "step %d (%s): weight", i, tt.comment)
	}
	// Before the epoch, ids stay contiguous and elapsed non-negative.
	id, el := WindowOf(-1, w)
	assert.Equal(t, int64(-1), id)
	assert.Equal(t, w-1, el)
}

func TestEstimateCloudflareExample(t *testing.T) {
	// 42 requests in the previous minute, 18 in the current one, 15 s in:
	// 42·45/60 + 18 = 49.5.
	r := NewRule(Spec{Kind: Sliding, Limit: 50, Window: time.Minute})
	assert.InDelta(t, 49.5, r.estimate(42, 18, int64(15*time.Second)), 1e-9)
	assert.False(t, r.admits(49.5, 1), "49.5 + 1 > 50")
	assert.Equal(t, int64(0), r.remaining(49.5))
	f := NewRule(Spec{Kind: Fixed, Limit: 50, Window: time.Minute})
	assert.InDelta(t, 18, f.estimate(42, 18, int64(15*time.Second)), 1e-9)
	assert.Equal(t, int64(32), f.remaining(18))
}

func TestRetryAndResetArithmetic(t *testing.T) {
	s := time.Second
	tests := []struct {
		name               string
		rule               spec
		prev, cur, elapsed int64
		n                  int64
		retry, reset       time.Duration
	}{
		// Sliding, 10/min. Within the window: prev 8 must weigh ≤ 10−5−1 = 4,
		// so weight ½, at 30 s: 20 s after 10 s.
		{"sliding within window", spec{10, time.Minute, false}, 8, 5, int64(10 * s), 1, 20 * s, 110 * s},
		// cur 10 is full: next window, once 10·(60−e)/60 ≤ 9, e = 6 s: 50+6 s.
		{"sliding next window", spec{10, time.Minute, false}, 0, 10, int64(10 * s), 1, 56 * s, 110 * s},
		{"sliding cost 5", spec{10, time.Minute, false}, 0, 10, int64(10 * s), 5, 80 * s, 110 * s},
		{"sliding admitted now", spec{10, time.Minute, false}, 4, 4, int64(30 * s), 1, 0, 90 * s},
		{"sliding only prev", spec{10, time.Minute, false}, 10, 0, int64(0), 1, 6 * s, 60 * s},
		{"sliding empty", spec{10, time.Minute, false}, 0, 0, int64(30 * s), 1, 0, 0},
		{"fixed full", spec{10, time.Minute, true}, 100, 10, int64(10 * s), 1, 50 * s, 50 * s},
		{"fixed room", spec{10, time.Minute, true}, 100, 9, int64(10 * s), 1, 0, 50 * s},
		{"fixed prev ignored", spec{10, time.Minute, true}, 100, 0, int64(10 * s), 1, 0, 0},
	}
	for _, tt := range tests {
		r := NewRule(tt.rule.spec())
		assert.Equal(t, int64(tt.retry), r.retryAfter(tt.prev, tt.cur, tt.elapsed, tt.n, 1), "%s: retry-after", tt.name)
		assert.Equal(t, int64(tt.reset), r.resetAfter(tt.prev, tt.cur, tt.elapsed), "%s: reset-after", tt.name)
		if tt.retry > 0 {
			// At retry-after the request fits, a millisecond before it does not.
			at := tt.elapsed + int64(tt.retry)
			p, c, e := tt.prev, tt.cur, at
			if at >= r.w {
				p, c, e = tt.cur, 0, at-r.w
			}
			assert.True(t, r.admitsWindow(p, c, e, tt.n), "%s: admitted at retry-after", tt.name)
			e -= int64(time.Millisecond)
			if e < 0 {
				p, c, e = tt.prev, tt.cur, e+r.w
			}
			assert.False(t, r.admitsWindow(p, c, e, tt.n), "%s: denied just before retry-after", tt.name)
		}
	}
}

// TestSlidingRetryAfterBounds: a sliding rule's RetryAfter is admitted,
// and it is the instant the exact fractions give, rounded up to the unit:
// the comparison's slack (Epsilon, a billionth of a request, plus the
// estimate's rounding, a few units in the last place of the limit) admits
// the request up to slack·W/c earlier, c the count whose weight is falling
// (for small limits, a nanosecond per second of window at most), and no
// earlier.
func TestSlidingRetryAfterBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	windows := []time.Duration{time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second, time.Hour, 366 * 24 * time.Hour}
	for i := range 20_000 {
		w := windows[rng.IntN(len(windows))]
		limit := 1 + rng.Int64N(20)
		if rng.IntN(4) == 0 {
			limit = 1 + rng.Int64N(1<<40)
		}
		r := NewRule(Spec{Kind: Sliding, Limit: limit, Window: w})
		unit := int64(1)
		if rng.IntN(2) == 0 {
			unit = 1000
		}
		n := 1 + rng.Int64N(limit)
		prev, cur := rng.Int64N(2*limit+1), rng.Int64N(limit+1)
		el := rng.Int64N(int64(w)) / unit * unit
		d := r.retryAfter(prev, cur, el, n, unit)
		// fits reports whether the request fits x after el.
		fits := func(x int64) bool {
			if at := el + x; at < r.w {
				return r.admitsWindow(prev, cur, at, n)
			} else if at < 2*r.w {
				return r.admitsWindow(cur, 0, at-r.w, n)
			}
			return true
		}
		where := fmt.Sprintf("case %d: %d/%v prev %d cur %d elapsed %d cost %d unit %d: retry %d", i, limit, w, prev, cur, el, n, unit, d)
		require.True(t, fits(d), where)
		require.Zero(t, d%unit, where)
		if d == 0 {
			continue
		}
		c := prev
		if cur+n > limit {
			c = cur // the request fits only in the next window
		}
		slack := int64(math.Ceil((Epsilon+8*float64(limit)*0x1p-52)*float64(r.w)/float64(c))) + 1
		require.False(t, fits(d-unit-slack), "%s: slack %d", where, slack)
	}
}
