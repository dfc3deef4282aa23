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

// In ModeAsync a Log rule counts in the most buckets of at least two sync
// periods, or else of one.
func TestLogBuckets(t *testing.T) {
	for _, c := range []struct {
		w, sync time.Duration
		want    int
	}{
		{time.Second, 100 * time.Millisecond, 5},
		{time.Second, 10 * time.Millisecond, 50},
		{10 * time.Second, 100 * time.Millisecond, 50},
		{time.Minute, 100 * time.Millisecond, 60},
		{300 * time.Millisecond, 100 * time.Millisecond, 3}, // one period each: two of two do not fit
		{200 * time.Millisecond, 100 * time.Millisecond, 2},
		{150 * time.Millisecond, 100 * time.Millisecond, 1},
	} {
		assert.Equal(t, c.want, logBuckets(c.w, c.sync), "%v at %v", c.w, c.sync)
	}
}
