package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// Under CountDenied a client that keeps retrying against a bucket owes
// more with every denial and stays denied, in every mode: its arrival
// time saturates decades ahead rather than wrapping into the past. The
// slowest bucket there is (1 per MaxWindow) wraps int64 nanoseconds after
// some 235 denials from 2026.
func TestCountDeniedBucketNeverWraps(t *testing.T) {
	for _, mode := range []Mode{ModeLocal, ModeAsync, ModeSynchronous} {
		for _, algo := range []Algorithm{TokenBucket, LeakyBucket} {
			t.Run(mode.String()+"/"+algo.String(), func(t *testing.T) {
				l := countDeniedLimiter(t, mode, Rule{Limit: 1, Window: MaxWindow, Type: algo})
				ctx := t.Context()
				res, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed)
				last := time.Duration(1)
				for i := range 1500 {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					require.False(t, res.Degraded, "request %d", i)
					require.False(t, res.Allowed, "request %d admitted", i)
					// The wait only grows, up to its saturation.
					require.GreaterOrEqual(t, res.RetryAfter, last, "request %d", i)
					last = res.RetryAfter
					if i%100 == 99 && mode == ModeAsync {
						require.NoError(t, l.Sync(ctx))
					}
				}
			})
		}
	}
}

// A bucket that CountDenied has put in debt beyond its burst reports
// Remaining 0, not a negative cost (which HTTP headers would show), in
// every mode, for the denied requests and for Peek.
func TestCountDeniedBucketRemainingNeverNegative(t *testing.T) {
	for _, mode := range []Mode{ModeLocal, ModeAsync, ModeSynchronous} {
		for _, algo := range []Algorithm{TokenBucket, LeakyBucket} {
			t.Run(mode.String()+"/"+algo.String(), func(t *testing.T) {
				l := countDeniedLimiter(t, mode, Rule{Limit: 2, Window: time.Second, Type: algo})
				ctx := t.Context()
				for i := range 6 {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					require.Equal(t, i < 2, res.Allowed, "request %d", i)
					require.GreaterOrEqual(t, res.Remaining, int64(0), "request %d: %+v", i, res)
					res, err = l.Peek(ctx, "k")
					require.NoError(t, err)
					require.GreaterOrEqual(t, res.Remaining, int64(0), "peek after request %d: %+v", i, res)
				}
			})
		}
	}
}

// countDeniedLimiter returns a limiter in mode with CountDenied and the one
// rule r, on a mock clock at t0 (a memory store in the store modes).
func countDeniedLimiter(t *testing.T, mode Mode, r Rule) *Limiter {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(t0)
	cfg := Config{Mode: mode, CountDenied: true, Rules: []Rule{r}, Clock: mock, Manual: true}
	if mode != ModeLocal {
		cfg.Store, cfg.ClockSync = store.NewMemory(mock), -1
	}
	l, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// A FailClosed denial while the store fails says when to come back: the
// wait before the next sync cycle, never 0 (WaitN would spin), also with
// Manual set, where no loop runs and the caller syncs.
func TestFailClosedRetryAfter(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		mode Mode
		rate time.Duration
		want time.Duration
	}{
		{ModeAsync, 250 * time.Millisecond, 250 * time.Millisecond},
		{ModeSynchronous, 0, DefaultSyncRate},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			l, err := New(Config{
				Rules:         []Rule{{Limit: 10, Window: time.Minute}},
				Mode:          c.mode,
				Store:         errStore{},
				SyncRate:      c.rate,
				FailurePolicy: FailClosed,
				Manual:        true,
			})
			require.NoError(t, err)
			t.Cleanup(func() {
				// The increment never reaches the store: do not wait for it.
				cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
				defer cancel()
				_ = l.Close(cctx)
			})
			if c.mode == ModeAsync {
				_, _ = l.Allow(ctx, "k")
				require.Error(t, l.Sync(ctx))
			}
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed)
			assert.True(t, res.Degraded)
			assert.Equal(t, c.want, res.RetryAfter)
		})
	}
}
