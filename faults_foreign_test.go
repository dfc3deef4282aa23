package hybridlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A key whose counter in Redis holds something the library did not write
// (here a hash) is decided by the FailurePolicy in ModeSynchronous, flagged
// Degraded; the keys decided beside it in the same round trips are decided
// by the store, exactly, and counted once.
func TestFaultForeignCounterSynchronous(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	for _, policy := range []hybridlimit.FailurePolicy{hybridlimit.FailOpen, hybridlimit.FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			pfx := redistest.Prefix(t)
			const limit = 50
			l, err := hybridlimit.New(hybridlimit.Config{
				Mode: hybridlimit.ModeSynchronous, Store: storetest.Redis(t, c), Prefix: pfx, FailurePolicy: policy,
				Rules: []hybridlimit.Rule{{Limit: limit, Window: time.Hour, Type: hybridlimit.Fixed}},
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(ctx) })
			id := thisHour(t)
			for _, i := range []int64{id, id + 1} {
				key := store.CounterKey(pfx, store.Counter{Key: "bad", Window: time.Hour.Milliseconds(), ID: i})
				require.NoError(t, c.HSet(ctx, key, "f", "v").Err())
			}
			var good, goodDegraded, bad, badAllowed atomic.Int64
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for range 20 {
						key := "good"
						if g%2 == 1 {
							key = "bad"
						}
						res, err := l.Allow(ctx, key)
						if !assert.NoError(t, err) {
							return
						}
						if key == "bad" {
							bad.Add(1)
							assert.True(t, res.Degraded, "a foreign counter: the FailurePolicy decides")
							if res.Allowed {
								badAllowed.Add(1)
							}
							continue
						}
						if res.Allowed {
							good.Add(1)
						}
						if res.Degraded {
							goodDegraded.Add(1)
						}
					}
				})
			}
			wg.Wait()
			assert.Equal(t, int64(0), goodDegraded.Load(), "the other keys are decided by the store")
			assert.Equal(t, int64(limit), good.Load(), "exactly the limit admitted")
			v, err := c.Get(ctx, store.CounterKey(pfx, store.Counter{Key: "good", Window: time.Hour.Milliseconds(), ID: id})).Int64()
			require.NoError(t, err)
			assert.Equal(t, int64(limit), v, "counted once in the store")
			if policy == hybridlimit.FailClosed {
				assert.Equal(t, int64(0), badAllowed.Load())
			} else {
				assert.Equal(t, min(bad.Load(), limit), badAllowed.Load(), "FailOpen decides on this node's counts")
			}
		})
	}
}

// In ModeAsync, a key whose counter in Redis holds a foreign value (here a
// hash) cannot be counted in the store: its increments stay on the node,
// which goes on limiting the key on its own counts (and the totals it
// last saw), reports the error, and counts them in Close's error; the
// other keys of the same batches are pushed and counted once.
func TestFaultForeignCounterAsync(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	pfx := redistest.Prefix(t)
	const limit = 20
	var errs atomic.Int64
	l, err := hybridlimit.New(hybridlimit.Config{
		Mode: hybridlimit.ModeAsync, Store: storetest.Redis(t, c), Prefix: pfx, SyncRate: 5 * time.Millisecond,
		Rules:   []hybridlimit.Rule{{Limit: limit, Window: time.Hour, Type: hybridlimit.Fixed}},
		OnError: func(error) { errs.Add(1) },
	})
	require.NoError(t, err)
	id := thisHour(t)
	for _, i := range []int64{id, id + 1} {
		key := store.CounterKey(pfx, store.Counter{Key: "bad", Window: time.Hour.Milliseconds(), ID: i})
		require.NoError(t, c.HSet(ctx, key, "f", "v").Err())
	}
	admitted := map[string]int{}
	for range 3 * limit {
		for _, key := range []string{"bad", "good"} {
			res, err := l.Allow(ctx, key)
			require.NoError(t, err)
			if res.Allowed {
				admitted[key]++
			}
		}
		time.Sleep(2 * time.Millisecond) // several sync cycles
	}
	assert.Equal(t, limit, admitted["good"])
	assert.Equal(t, limit, admitted["bad"], "the node's own counts still limit the key")
	assert.Positive(t, errs.Load(), "the foreign counter is reported")
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	err = l.Close(cctx)
	require.ErrorIs(t, err, store.ErrForeign)
	assert.Less(t, time.Since(start), time.Second, "Close does not retry what the store refuses")
	assert.Contains(t, err.Error(), fmt.Sprintf("%d increments (per rule) of 1 keys", limit), "Close counts what the store could not take")
	v, err := c.Get(ctx, store.CounterKey(pfx, store.Counter{Key: "good", Window: time.Hour.Milliseconds(), ID: id})).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(limit), v, "the other key is counted once")
}
