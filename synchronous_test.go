package hybridlimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// slowStore is a memory store whose round trips carrying the key "slow"
// take 300 ms, like calls to a dead or hung shard before its circuit
// opens.
type slowStore struct{ *store.Memory }

func (s slowStore) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	for _, r := range reqs {
		if r.Key == "slow" {
			time.Sleep(300 * time.Millisecond)
			break
		}
	}
	return s.Memory.Take(ctx, reqs)
}

// A request that waits in the queue while slow round trips hold every
// in-flight slot still gets its whole deadline (half of StoreTimeout) in
// the store once sent: it is decided by the store, not Degraded. (Counted
// from the decision instead of the sending, the deadline passed in the
// queue, and the store refused the request.)
func TestSynchronousDeadlineCountsFromSending(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:        []hybridlimit.Rule{{Limit: 100, Window: time.Hour}},
		Mode:         hybridlimit.ModeSynchronous,
		Store:        slowStore{store.NewMemory(nil)},
		StoreTimeout: 400 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 2 { // both in-flight slots
		wg.Go(func() {
			_, err := l.Allow(ctx, "slow")
			assert.NoError(t, err)
		})
	}
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	res, err := l.Allow(ctx, "fast")
	require.NoError(t, err)
	waited := time.Since(start)
	wg.Wait()
	assert.Greater(t, waited, 250*time.Millisecond, "the request waited behind the slow round trips")
	assert.True(t, res.Allowed)
	assert.False(t, res.Degraded, "a request that waited in the queue was refused by the store for its deadline")
}
