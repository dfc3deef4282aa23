package hybridlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// The standalone server hangs (SIGSTOP) under four limiters whose go-redis
// clients keep go-redis' defaults for deadlines (no ContextTimeoutEnabled)
// with a ReadTimeout of 10 s: ModeSynchronous and ModeAsync, each with
// FailOpen and FailClosed, StoreTimeout 200 ms. Proven: no decision waits
// much longer than StoreTimeout (the bound asserted is ten times it, for a
// loaded machine, far below the client's 10 s); the synchronous limiters
// decide by their FailurePolicy (FailOpen admits, FailClosed denies,
// Degraded); the async FailClosed limiter denies once its cycles fail; and
// Close, with a 300 ms context, returns within ten times that, counting
// the increments the hung store lacks (none for the synchronous FailClosed
// limiter, whose Close returns nil).
func TestFaultHangDecisionsKeepTheirDeadline(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	const storeTimeout, closeWait = 200 * time.Millisecond, 300 * time.Millisecond
	type node struct {
		name          string
		l             *hybridlimit.Limiter
		worst         atomic.Int64 // ns, during the hang
		n, allowed    atomic.Int64 // during the hang
		degraded      atomic.Int64
		closeErr      error
		closeDuration time.Duration
	}
	var nodes []*node
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeSynchronous, hybridlimit.ModeAsync} {
		for _, policy := range []hybridlimit.FailurePolicy{hybridlimit.FailOpen, hybridlimit.FailClosed} {
			c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second})
			t.Cleanup(func() { _ = c.Close() })
			cfg := hybridlimit.Config{Mode: mode, FailurePolicy: policy, Store: newRedisStore(t, c),
				StoreTimeout: storeTimeout, Prefix: fmt.Sprint(pfx, len(nodes)),
				Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}}
			if mode == hybridlimit.ModeAsync {
				cfg.SyncRate = 20 * time.Millisecond
			}
			l, err := hybridlimit.New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			nodes = append(nodes, &node{name: fmt.Sprint(mode, "/", policy), l: l})
		}
	}
	ctx := context.Background()
	for _, nd := range nodes {
		for i := range 8 {
			res, err := nd.l.Allow(ctx, fmt.Sprint("k", i))
			require.NoError(t, err)
			require.True(t, res.Allowed && !res.Degraded, "%s before the hang", nd.name)
		}
	}
	time.Sleep(100 * time.Millisecond) // the async nodes push once

	srv := redistest.ServerAt(t, addr)
	srv.Stop()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, nd := range nodes {
		traffic(&wg, 2, stop, func(g, i int) bool {
			t0 := time.Now()
			res, err := nd.l.Allow(ctx, fmt.Sprint("k", (g+i)%8))
			d := time.Since(t0).Nanoseconds()
			if !assert.NoError(t, err, nd.name) {
				return false
			}
			for w := nd.worst.Load(); d > w && !nd.worst.CompareAndSwap(w, d); w = nd.worst.Load() {
			}
			nd.n.Add(1)
			if res.Allowed {
				nd.allowed.Add(1)
			}
			if res.Degraded {
				nd.degraded.Add(1)
			}
			time.Sleep(time.Millisecond)
			return true
		})
	}
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, nd := range nodes {
		cctx, cancel := context.WithTimeout(ctx, closeWait)
		t0 := time.Now()
		nd.closeErr = nd.l.Close(cctx)
		nd.closeDuration = time.Since(t0)
		cancel()
	}
	srv.Cont()

	for _, nd := range nodes {
		worst := time.Duration(nd.worst.Load())
		t.Logf("%s: %d decisions during the hang, %d allowed, %d degraded, slowest %v; Close took %v: %v",
			nd.name, nd.n.Load(), nd.allowed.Load(), nd.degraded.Load(), worst.Round(time.Millisecond), nd.closeDuration.Round(time.Millisecond), nd.closeErr)
		assert.Less(t, worst, 10*storeTimeout, "%s: a decision waited on the hung store", nd.name)
		assert.Less(t, nd.closeDuration, 10*closeWait, "%s: Close overran its context", nd.name)
		assert.Positive(t, nd.n.Load(), nd.name)
	}
	syncOpen, syncClosed, asyncOpen, asyncClosed := nodes[0], nodes[1], nodes[2], nodes[3]
	assert.Equal(t, syncOpen.n.Load(), syncOpen.allowed.Load(), "synchronous FailOpen admits")
	assert.Positive(t, syncOpen.degraded.Load(), "synchronous FailOpen: Degraded")
	assert.Zero(t, syncClosed.allowed.Load(), "synchronous FailClosed denies")
	assert.Positive(t, syncClosed.degraded.Load(), "synchronous FailClosed: Degraded")
	assert.Equal(t, asyncOpen.n.Load(), asyncOpen.allowed.Load(), "async FailOpen admits")
	assert.Positive(t, asyncClosed.n.Load()-asyncClosed.allowed.Load(), "async FailClosed denies once its cycles fail")
	assert.NoError(t, syncClosed.closeErr, "synchronous FailClosed counted nothing on its own: the store lacks nothing")
	for _, nd := range []*node{syncOpen, asyncOpen, asyncClosed} {
		// Their decisions during the hang were counted on the node: the
		// hung store lacks them.
		if assert.Error(t, nd.closeErr, nd.name) {
			assert.Positive(t, unflushed(t, nd.closeErr), nd.name)
		}
	}
}
