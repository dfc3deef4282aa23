package hybridlimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
)

// A clock that steps back an hour (ModeLocal: the node's; in the other
// modes what the decisions follow, the store's): the rules that count per
// window (Sliding, Fixed, Bucketed) admit again within two windows of the
// step (a sliding window's previous counts slide out over one more);
// those that keep instants (Log, TokenBucket, LeakyBucket) hold what they
// admitted at instants that now lie an hour ahead, and deny the key for
// the length of the step. docs/algorithms.md, "A clock that steps back".
func TestClockStepsBack(t *testing.T) {
	const step = time.Hour
	for _, c := range []struct {
		rule     hybridlimit.Rule
		instants bool // keeps instants: denied for about the step
	}{
		{hybridlimit.Rule{Limit: 3, Window: time.Second}, false},
		{hybridlimit.Rule{Limit: 3, Window: time.Second, Type: hybridlimit.Fixed}, false},
		{hybridlimit.Rule{Limit: 3, Window: time.Second, Type: hybridlimit.Bucketed, Buckets: 4}, false},
		{hybridlimit.Rule{Limit: 3, Window: time.Second, Type: hybridlimit.Log}, true},
		{hybridlimit.Rule{Limit: 3, Window: time.Second, Type: hybridlimit.TokenBucket, Burst: 3}, true},
		{hybridlimit.Rule{Limit: 3, Window: time.Second, Type: hybridlimit.LeakyBucket, Burst: 3}, true},
	} {
		t.Run(fmt.Sprint(c.rule.Type), func(t *testing.T) {
			mc := clock.NewMock()
			base := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
			mc.Set(base)
			l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{c.rule}, Clock: mc, Manual: true})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			ctx := context.Background()
			for range 4 {
				_, err := l.Allow(ctx, "k")
				require.NoError(t, err)
			}
			mc.Set(base.Add(-step + 10*time.Second))
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			if c.instants {
				assert.False(t, res.Allowed)
				assert.InDelta(t, float64(step), float64(res.RetryAfter), float64(15*time.Second), "denied for about the step")
			} else if !res.Allowed {
				assert.LessOrEqual(t, res.RetryAfter, 2*c.rule.Window, "within two windows")
			}
			fresh, err := l.Allow(ctx, "other")
			require.NoError(t, err)
			assert.True(t, fresh.Allowed, "a key decided only after the step")
		})
	}
}
