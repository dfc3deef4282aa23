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
	"github.com/hybridlimit/hybridlimit/store"
)

// Close pushes what the store lacks and reads nothing: a key with no
// increment pending costs the final flush no op, whatever the mode and
// the algorithm. (It read every key's counters once more, two ops per key
// for a sliding rule: seconds of Close for a million keys.)
func TestCloseSendsOnlyIncrements(t *testing.T) {
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeAsync, hybridlimit.ModeSynchronous} {
		for _, rule := range []hybridlimit.Rule{
			{Limit: 100, Window: time.Minute},
			{Limit: 100, Window: time.Minute, Type: hybridlimit.Log},
			{Limit: 100, Window: time.Minute, Type: hybridlimit.Bucketed, Buckets: 6},
			{Limit: 100, Window: time.Minute, Type: hybridlimit.TokenBucket},
		} {
			t.Run(fmt.Sprint(mode, "/", rule.Type, "/buckets=", rule.Buckets), func(t *testing.T) {
				ctx := context.Background()
				mock := clock.NewMock()
				mock.Set(time.Now().Truncate(time.Hour))
				l, err := hybridlimit.New(hybridlimit.Config{
					Rules: []hybridlimit.Rule{rule},
					Mode:  mode, Store: store.NewMemory(mock), Clock: mock, Manual: true, ClockSync: -1,
				})
				require.NoError(t, err)
				for i := range 100 {
					_, err := l.Allow(ctx, fmt.Sprint("k", i))
					require.NoError(t, err)
				}
				require.NoError(t, l.Sync(ctx))
				mock.Add(time.Second)
				pending := 0
				if mode == hybridlimit.ModeAsync {
					pending = 3
				}
				for i := range pending {
					_, err := l.Allow(ctx, fmt.Sprint("k", i))
					require.NoError(t, err)
				}
				before := l.Stats().KeysPushed
				require.NoError(t, l.Close(ctx))
				assert.Equal(t, uint64(pending), l.Stats().KeysPushed-before, "ops of the final flush")
			})
		}
	}
}
