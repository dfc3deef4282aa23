package hybridlimit

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// routedStore is a memory store that is a store.Router: route gives each
// key's route, as the Redis store names a Redis Cluster's masters.
type routedStore struct {
	*store.Memory
	route func(key string) int
}

func (s routedStore) Route(_, key string) int { return s.route(key) }

// TestSynchronousManyRoutes drives decisions on more routes than the
// synchronous mode has queues (maxRoutes): 200 keys each on its own
// route, some numbered far beyond maxRoutes, and one key whose route
// changes at every decision, as after failovers. Routes beyond maxRoutes
// share queues (route mod maxRoutes): every decision is still the store's
// and exact, at most maxRoutes queues are made, and no goroutine is left
// behind.
func TestSynchronousManyRoutes(t *testing.T) {
	var moving atomic.Int64
	keys := make([]string, 200)
	routeOf := map[string]int{}
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
		routeOf[keys[i]] = 1 + i
		if i%10 == 0 {
			routeOf[keys[i]] = 1_000_000 + i
		}
	}
	st := routedStore{store.NewMemory(nil), func(key string) int {
		if key == "moving" {
			return int(moving.Add(1))
		}
		return routeOf[key]
	}}
	l, err := New(Config{
		Rules: []Rule{{Limit: 5, Window: time.Hour}},
		Mode:  ModeSynchronous,
		Store: st,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	ctx := context.Background()
	var admitted sync.Map // key → *atomic.Int64
	// Eight rounds: every key asked eight times, "moving" eighty.
	var degraded atomic.Int64
	round := func() {
		work := make(chan string)
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for k := range work {
					res, err := l.Allow(ctx, k)
					if !assert.NoError(t, err) {
						continue
					}
					if res.Degraded {
						degraded.Add(1)
					}
					if res.Allowed {
						n, _ := admitted.LoadOrStore(k, new(atomic.Int64))
						n.(*atomic.Int64).Add(1)
					}
				}
			})
		}
		for _, k := range keys {
			work <- k
		}
		for range 10 {
			work <- "moving"
		}
		close(work)
		wg.Wait()
	}
	round()
	before := runtime.NumGoroutine() // the limiter's own, started by now
	for range 7 {
		round()
	}

	assert.Zero(t, degraded.Load(), "every decision is the store's")
	for _, k := range append(keys, "moving") {
		n, ok := admitted.Load(k)
		require.True(t, ok, "key %s", k)
		assert.Equal(t, int64(5), n.(*atomic.Int64).Load(), "key %s: admitted", k)
	}
	made := 0
	for i := range l.sync.routes {
		r := l.sync.routes[i].Load()
		if r == nil {
			continue
		}
		made++
		r.mu.Lock()
		assert.Zero(t, r.inflight, "queue %d: batches on their way", i)
		assert.Empty(t, r.queue, "queue %d: calls waiting", i)
		assert.LessOrEqual(t, len(r.free), maxInFlight, "queue %d: batches kept", i)
		r.mu.Unlock()
	}
	assert.Equal(t, maxRoutes, made, "routes beyond maxRoutes share the queues")
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(5 * time.Second); after > before && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond) // (assert.Eventually runs its check on a goroutine of its own)
	}
	assert.LessOrEqual(t, after, before, "goroutines after the first round and at the end")
}
