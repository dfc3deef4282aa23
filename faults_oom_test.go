package hybridlimit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// The standalone server is out of memory (maxmemory below what it uses,
// with Redis' default policy noeviction, so it refuses writes) while an
// async node and a synchronous node decide. Proven: the server refuses
// every push and synchronous call with an OOM error reply, which means it
// applied nothing (nothing in doubt); decisions go on (FailOpen: the
// synchronous ones Degraded) without caller errors; the async node keeps
// its increments pending, and the synchronous node its Degraded
// decisions' increments; once the server has memory again, the store
// holds exactly what both admitted, and Close returns nil.
func TestFaultStandaloneOutOfMemory(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	c := faultClient(t, addr)
	ctx := context.Background()
	require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err())
	t.Cleanup(func() { _ = c.ConfigSet(ctx, "maxmemory", "0").Err() })
	pfxA, pfxS := redistest.Prefix(t), redistest.Prefix(t)
	start := time.Now()

	var mu sync.Mutex
	var pushErr, takeErr string
	wa := &watched{Store: newRedisStore(t, faultClient(t, addr)), onPush: func(_, _ time.Time, bs []*store.Batch) {
		mu.Lock()
		defer mu.Unlock()
		for _, b := range bs {
			if b.Status != store.Applied && b.Err != nil && pushErr == "" {
				pushErr = b.Err.Error()
			}
		}
	}}
	ws := &watched{Store: newRedisStore(t, faultClient(t, addr)), onTake: func(_, _ time.Time, rs []*store.TakeRequest) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range rs {
			if r.Status != store.Applied && r.Err != nil && takeErr == "" {
				takeErr = r.Err.Error()
			}
			assert.NotEqual(t, store.InDoubt, r.Status, "a call the server refused is not in doubt: %v", r.Err)
		}
	}}
	async, err := hybridlimit.New(faultConfig(hybridlimit.ModeAsync, wa, pfxA, pfxS, 0))
	require.NoError(t, err)
	syn, err := hybridlimit.New(faultConfig(hybridlimit.ModeSynchronous, ws, pfxA, pfxS, 1<<40))
	require.NoError(t, err)
	nodes := []*hybridlimit.Limiter{async, syn}

	// Out of memory: any limit below what the server uses.
	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
	const n = 50
	for i := range n {
		res, err := async.Allow(ctx, "a")
		require.NoError(t, err)
		assert.True(t, res.Allowed)
		res, err = syn.Allow(ctx, "s")
		require.NoError(t, err, "decision %d", i)
		assert.True(t, res.Allowed)
		assert.True(t, res.Degraded, "synchronous decision %d while the server is out of memory", i)
	}
	time.Sleep(200 * time.Millisecond) // several sync periods: the pushes are refused
	for i, l := range nodes {
		st := l.Stats()
		assert.Positive(t, st.SyncErrors, "node %d: refused pushes", i)
		assert.Equal(t, int64(n), st.Pending, "node %d keeps its increments", i)
	}
	mu.Lock()
	assert.Contains(t, strings.ToUpper(pushErr), "OOM", "a push's error")
	assert.Contains(t, strings.ToUpper(takeErr), "OOM", "a synchronous request's error")
	t.Logf("push refused with %q; synchronous request failed with %q", pushErr, takeErr)
	mu.Unlock()
	ids := hourIDs(start, time.Now())
	assert.Zero(t, stored(t, c, pfxA, "a", ids), "nothing applied while out of memory")
	assert.Zero(t, stored(t, c, pfxS, "s", ids), "nothing applied while out of memory")

	require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
	require.Eventually(t, func() bool { return async.Stats().Pending == 0 && syn.Stats().Pending == 0 },
		10*time.Second, 10*time.Millisecond, "the pending increments are pushed once the server has memory")
	res, err := syn.Allow(ctx, "s")
	require.NoError(t, err)
	assert.False(t, res.Degraded, "the store decides again")
	closeAll(t, nodes, 10*time.Second)
	ids = hourIDs(start, time.Now())
	assert.Equal(t, int64(n), stored(t, c, pfxA, "a", ids), "async: the store holds what was admitted")
	assert.Equal(t, int64(n+1), stored(t, c, pfxS, "s", ids), "synchronous: the Degraded decisions once each, and the last one")
}
