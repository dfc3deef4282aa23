package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is a window boundary for every window size used in these tests.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

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
		id, el := windowOf(tt.at.UnixNano(), w)
		assert.Equal(t, tt.id, id, "step %d (%s): id", i, tt.comment)
		assert.Equal(t, tt.el, el, "step %d (%s): elapsed", i, tt.comment)
		assert.InDelta(t, tt.weight, weight(el, w), 1e-12, "step %d (%s): weight", i, tt.comment)
	}
	// Before the epoch, ids stay contiguous and elapsed non-negative.
	id, el := windowOf(-1, w)
	assert.Equal(t, int64(-1), id)
	assert.Equal(t, w-1, el)
}

func TestEstimateCloudflareExample(t *testing.T) {
	// 42 requests in the previous minute, 18 in the current one, 15 s in:
	// 42·45/60 + 18 = 49.5.
	r := compileRule(Rule{Limit: 50, Window: time.Minute})
	assert.InDelta(t, 49.5, r.estimate(42, 18, int64(15*time.Second)), 1e-9)
	assert.False(t, r.admits(49.5, 1), "49.5 + 1 > 50")
	assert.Equal(t, int64(0), r.remaining(49.5))
	f := compileRule(Rule{Limit: 50, Window: time.Minute, Type: Fixed})
	assert.InDelta(t, 18, f.estimate(42, 18, int64(15*time.Second)), 1e-9)
	assert.Equal(t, int64(32), f.remaining(18))
}

func TestRetryAndResetArithmetic(t *testing.T) {
	s := time.Second
	tests := []struct {
		name               string
		rule               Rule
		prev, cur, elapsed int64
		n                  int64
		retry, reset       time.Duration
	}{
		// Sliding, 10/min. Within the window: prev 8 must weigh ≤ 10−5−1 = 4,
		// so weight ½, at 30 s: 20 s after 10 s.
		{"sliding within window", Rule{Limit: 10, Window: time.Minute}, 8, 5, int64(10 * s), 1, 20 * s, 110 * s},
		// cur 10 is full: next window, once 10·(60−e)/60 ≤ 9, e = 6 s: 50+6 s.
		{"sliding next window", Rule{Limit: 10, Window: time.Minute}, 0, 10, int64(10 * s), 1, 56 * s, 110 * s},
		{"sliding cost 5", Rule{Limit: 10, Window: time.Minute}, 0, 10, int64(10 * s), 5, 80 * s, 110 * s},
		{"sliding admitted now", Rule{Limit: 10, Window: time.Minute}, 4, 4, int64(30 * s), 1, 0, 90 * s},
		{"sliding only prev", Rule{Limit: 10, Window: time.Minute}, 10, 0, int64(0), 1, 6 * s, 60 * s},
		{"sliding empty", Rule{Limit: 10, Window: time.Minute}, 0, 0, int64(30 * s), 1, 0, 0},
		{"fixed full", Rule{Limit: 10, Window: time.Minute, Type: Fixed}, 100, 10, int64(10 * s), 1, 50 * s, 50 * s},
		{"fixed room", Rule{Limit: 10, Window: time.Minute, Type: Fixed}, 100, 9, int64(10 * s), 1, 0, 50 * s},
		{"fixed prev ignored", Rule{Limit: 10, Window: time.Minute, Type: Fixed}, 100, 0, int64(10 * s), 1, 0, 0},
	}
	for _, tt := range tests {
		r := compileRule(tt.rule)
		assert.Equal(t, tt.retry, r.retryAfter(tt.prev, tt.cur, tt.elapsed, tt.n), "%s: retry-after", tt.name)
		assert.Equal(t, tt.reset, r.resetAfter(tt.prev, tt.cur, tt.elapsed), "%s: reset-after", tt.name)
		if tt.retry > 0 {
			// At retry-after the request fits, a millisecond before it does not.
			at := tt.elapsed + int64(tt.retry)
			p, c, e := tt.prev, tt.cur, at
			if at >= r.w {
				p, c, e = tt.cur, 0, at-r.w
			}
			assert.True(t, r.admits(r.estimate(p, c, e), tt.n), "%s: admitted at retry-after", tt.name)
			e -= int64(time.Millisecond)
			if e < 0 {
				p, c, e = tt.prev, tt.cur, e+r.w
			}
			assert.False(t, r.admits(r.estimate(p, c, e), tt.n), "%s: denied just before retry-after", tt.name)
		}
	}
}

// newMockLimiter returns a local-mode limiter on a mock clock set to t0.
func newMockLimiter(t *testing.T, cfg Config) (*Limiter, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(t0)
	cfg.Clock = mock
	cfg.Manual = true
	l, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, mock
}

type step struct {
	at         time.Duration // since t0
	n          int64
	allowed    bool
	remaining  int64
	retry      time.Duration
	rule       int
	resetAfter time.Duration // checked when non-zero
}

func runSteps(t *testing.T, l *Limiter, mock *clock.Mock, key string, steps []step) {
	t.Helper()
	ctx := context.Background()
	for i, s := range steps {
		mock.Set(t0.Add(s.at))
		res, err := l.AllowN(ctx, key, s.n)
		require.NoError(t, err, "step %d", i)
		if res.Allowed != s.allowed || res.Remaining != s.remaining || res.RetryAfter != s.retry || res.Rule != s.rule {
			t.Errorf("step %d at %v: got allowed=%v remaining=%d retry=%v rule=%d, want %v %d %v %d",
				i, s.at, res.Allowed, res.Remaining, res.RetryAfter, res.Rule, s.allowed, s.remaining, s.retry, s.rule)
		}
		if s.resetAfter != 0 && res.ResetAfter != s.resetAfter {
			t.Errorf("step %d at %v: got reset-after %v, want %v", i, s.at, res.ResetAfter, s.resetAfter)
		}
	}
}

func TestSlidingWindowDecisions(t *testing.T) {
	l, mock := newMockLimiter(t, Config{Rules: []Rule{{Limit: 4, Window: time.Minute}}})
	s := time.Second
	runSteps(t, l, mock, "k", []step{
		{0, 1, true, 3, 0, 0, 2 * time.Minute},
		{10 * s, 2, true, 1, 0, 0, 110 * s},
		{20 * s, 1, true, 0, 0, 0, 100 * s},
		// Full: next window, once 4·(60−e)/60 ≤ 3: e = 15 s.
		{30 * s, 1, false, 0, 45 * s, 0, 90 * s},
		{75*s - time.Millisecond, 1, false, 0, time.Millisecond, 0, 0},
		{75 * s, 1, true, 0, 0, 0, 0},
		// Estimate 4·0.5 + 1 = 3 at 90 s: one more fits, the cost-2 does not.
		{90 * s, 2, false, 1, 15 * s, 0, 0},
		{90 * s, 1, true, 0, 0, 0, 0},
		// Two windows later everything has slid out.
		{3*time.Minute + 1, 4, true, 0, 0, 0, 0},
	})
}

func TestFixedWindowDecisions(t *testing.T) {
	l, mock := newMockLimiter(t, Config{Rules: []Rule{{Limit: 2, Window: 10 * time.Second, Type: Fixed}}})
	s := time.Second
	runSteps(t, l, mock, "k", []step{
		{0, 1, true, 1, 0, 0, 10 * s},
		{1 * s, 1, true, 0, 0, 0, 9 * s},
		{2 * s, 1, false, 0, 8 * s, 0, 8 * s},
		{10 * s, 2, true, 0, 0, 0, 10 * s},
		{19*s + 999*time.Millisecond, 1, false, 0, time.Millisecond, 0, 0},
		{20 * s, 1, true, 1, 0, 0, 0},
	})
}

func TestSeveralRulesRetryIsLongest(t *testing.T) {
	// 1/s, 3/min, fixed windows: after 3 requests in 3 seconds, the minute
	// rule needs until the next minute, longer than the second rule.
	l, mock := newMockLimiter(t, Config{Rules: []Rule{
		{Limit: 1, Window: time.Second, Type: Fixed},
		{Limit: 3, Window: time.Minute, Type: Fixed},
	}})
	s := time.Second
	runSteps(t, l, mock, "k", []step{
		{0, 1, true, 0, 0, 0, 0},
		{500 * time.Millisecond, 1, false, 0, 500 * time.Millisecond, 0, 0},
		{1 * s, 1, true, 0, 0, 0, 0},
		{2 * s, 1, true, 0, 0, 0, 0},
		// Both deny at 2.5 s: the minute rule's 57.5 s wins over 0.5 s.
		{2*s + 500*time.Millisecond, 1, false, 0, 57*s + 500*time.Millisecond, 1, 0},
		// At 3 s only the minute rule denies.
		{3 * s, 1, false, 0, 57 * s, 1, 0},
		{60 * s, 1, true, 0, 0, 0, 0},
	})
	// A denial by a later rule gives back what earlier rules reserved.
	res, err := l.Peek(context.Background(), "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
}
