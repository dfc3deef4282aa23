package hybridlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A limiter started again with the same Config (a restarted process) is a
// new node to the store: its first batches are applied, not taken for the
// previous run's, whose markers still live.
func TestRestartedLimiterIsANewNode(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	pfx := redistest.Prefix(t)
	cfg := hybridlimit.Config{
		Mode: hybridlimit.ModeAsync, Store: storetest.Redis(t, c), Prefix: pfx, SyncRate: 5 * time.Millisecond,
		Rules: []hybridlimit.Rule{{Limit: 1000, Window: time.Hour, Type: hybridlimit.Fixed}},
	}
	id := thisHour(t)
	for run := int64(1); run <= 3; run++ {
		l, err := hybridlimit.New(cfg)
		require.NoError(t, err)
		for range 10 {
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, res.Allowed)
			time.Sleep(time.Millisecond)
		}
		require.NoError(t, l.Close(ctx))
		v, err := c.Get(ctx, store.CounterKey(pfx, store.Counter{Key: "k", Window: time.Hour.Milliseconds(), ID: id})).Int64()
		require.NoError(t, err)
		assert.Equal(t, 10*run, v, "run %d", run)
	}
}
