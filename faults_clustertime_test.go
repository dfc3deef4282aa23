package hybridlimit_test

import (
	"context"
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

// faultClusterClient returns a client of the test cluster with the fault
// tests' short timeouts, closed when the test ends.
func faultClusterClient(t *testing.T, addrs []string) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 32,
		DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// replicaOf reports whether addr still serves as a replica: the cluster
// has not yet promoted it.
func replicaOf(t *testing.T, addr string) bool {
	t.Helper()
	c := faultClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := c.Do(ctx, "ROLE").Slice()
	require.NoError(t, err, "ROLE on %s", addr)
	return len(r) > 0 && r[0] == "slave"
}

// Store.Time on a Cluster client answers while a master is dead and not
// yet replaced: a TIME that go-redis sends to the dead master's node (a
// keyless command goes to the master of a random slot) fails, and the
// store therefore asks every master at once. The test checks that the
// fault is real (a plain TIME through a go-redis cluster client fails at
// least once over the same instants) and that the dead master's replica was
// still a replica when the last call returned.
func TestFaultClusterTimeWithDeadMaster(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	victim := shards[1]
	require.NotEmpty(t, victim.Replicas)
	addrs := redistest.ClusterAddrs(t)
	st := newRedisStore(t, faultClusterClient(t, addrs))
	plain := faultClusterClient(t, addrs)
	ctx := context.Background()
	for range 10 { // connections to every master open
		_, err := st.Time(ctx)
		require.NoError(t, err)
		require.NoError(t, plain.Time(ctx).Err())
	}

	redistest.ServerAt(t, victim.Master).Kill()
	killed := time.Now()
	const calls = 30 // a plain TIME misses the dead master 30 times in a row with probability (2/3)^30
	plainFailed := 0
	for i := range calls {
		cctx, cancel := context.WithTimeout(ctx, faultTimeout)
		tm, err := st.Time(cctx)
		cancel()
		require.NoError(t, err, "call %d, %v after the kill", i, time.Since(killed))
		assert.WithinDuration(t, time.Now(), tm, 2*time.Second, "call %d: the store's clock", i)
		if plainFailed > 0 {
			continue // the fault is shown; a failing plain call costs go-redis' dial retries
		}
		cctx, cancel = context.WithTimeout(ctx, faultTimeout)
		if plain.Time(cctx).Err() != nil {
			plainFailed++
		}
		cancel()
	}
	elapsed := time.Since(killed)
	require.True(t, replicaOf(t, victim.Replicas[0]),
		"the replica was promoted within %v: the calls did not all run before the failover", elapsed)
	require.Positive(t, plainFailed, "no plain TIME reached the dead master: the fault was not exercised")
	t.Logf("%d calls in %v after the kill; %d plain TIME calls failed", calls, elapsed, plainFailed)
}

// A ModeAsync node keeps its sync rate while a master of the Cluster is
// dead and not yet replaced (docs/failures.md, "A dead shard affects only
// its slots": the loop does not back off while other batches are
// applied, or while some master answers TIME). Two nodes: one with keys
// on every shard, whose healthy batches are applied each cycle, and one
// with keys on the dead shard only, none of whose batches is applied and
// whose probe (Store.Time) is answered by the living masters. Neither
// backs off, and the first one keeps the healthy shards' counters exactly
// up to date.
func TestFaultClusterDeadShardKeepsSyncRate(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	victim := shards[1]
	require.NotEmpty(t, victim.Replicas)
	addrs := redistest.ClusterAddrs(t)
	const rate = 20 * time.Millisecond
	pfx := redistest.Prefix(t)

	var healthy, dead []string
	for i, sh := range shards {
		ks := keysOnShard(sh, "k", 2)
		if i == 1 {
			dead = ks
		} else {
			healthy = append(healthy, ks...)
		}
	}
	all := append(append([]string(nil), healthy...), dead...)
	mk := func() *hybridlimit.Limiter {
		cfg := faultConfig(hybridlimit.ModeAsync, newRedisStore(t, faultClusterClient(t, addrs)), pfx, "", 0)
		cfg.SyncRate = rate
		l, err := hybridlimit.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	mixed, onDead := mk(), mk()
	admitted := newTally(all)
	ctx := context.Background()
	allow := func(l *hybridlimit.Limiter, k string) { // from any goroutine
		res, err := l.Allow(ctx, k)
		if assert.NoError(t, err) && assert.True(t, res.Allowed) {
			admitted.add(k)
		}
	}
	// Warm both nodes: a few cycles applied on every shard.
	start := time.Now()
	for _, k := range all {
		allow(mixed, k)
	}
	for _, k := range dead {
		allow(onDead, k)
	}
	require.Eventually(t, func() bool {
		return mixed.Stats().Pending == 0 && onDead.Stats().Pending == 0
	}, 5*time.Second, rate)

	redistest.ServerAt(t, victim.Master).Kill()
	killed := time.Now()
	cycles0 := [2]uint64{mixed.Stats().SyncCycles, onDead.Stats().SyncCycles}
	var maxPeriod [2]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // decisions on every key: every cycle has batches to send
		for {
			select {
			case <-stop:
				return
			case <-time.After(rate / 4):
			}
			for _, k := range all {
				allow(mixed, k)
			}
			for _, k := range dead {
				allow(onDead, k)
			}
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(rate / 2):
			}
			for i, l := range []*hybridlimit.Limiter{mixed, onDead} {
				if p := int64(l.Stats().SyncPeriod); p > maxPeriod[i].Load() {
					maxPeriod[i].Store(p)
				}
			}
		}
	})
	// 600 ms: with cluster-node-timeout 1 s the cluster cannot flag the
	// master failed before 1 s; a loop that backed off from 20 ms would
	// wait 20+40+80+160+320 ms over its first five failing cycles.
	time.Sleep(600 * time.Millisecond)
	close(stop)
	wg.Wait()
	elapsed := time.Since(killed)
	ms, ds := mixed.Stats(), onDead.Stats()
	require.True(t, replicaOf(t, victim.Replicas[0]), "the replica was promoted within %v", elapsed)
	require.True(t, ds.StoreFailing, "the dead shard's batches failed (last error %v)", ds.LastError)
	t.Logf("%v after the kill: mixed node %d cycles, longest period %v; dead-shard node %d cycles, longest period %v, last error %v",
		elapsed, ms.SyncCycles-cycles0[0], time.Duration(maxPeriod[0].Load()),
		ds.SyncCycles-cycles0[1], time.Duration(maxPeriod[1].Load()), ds.LastError)
	for i, name := range []string{"mixed", "dead-shard"} {
		period := []time.Duration{ms.SyncPeriod, ds.SyncPeriod}[i]
		// A backoff doubles the period every failing cycle, from 40 ms
		// up to 5 s; 150 ms leaves room for a slow cycle under load.
		assert.Less(t, time.Duration(maxPeriod[i].Load()), 150*time.Millisecond, "%s node: the loop backed off", name)
		assert.Less(t, period, 150*time.Millisecond, "%s node: the loop backed off", name)
	}
	assert.GreaterOrEqual(t, ms.SyncCycles-cycles0[0], uint64(10), "mixed node: cycles at its rate")
	assert.GreaterOrEqual(t, ds.SyncCycles-cycles0[1], uint64(10), "dead-shard node: cycles at its rate")

	// The healthy shards' counters are exact: every admitted request on
	// them reached the store, once.
	c := faultClusterClient(t, addrs)
	ids := hourIDs(start, time.Now())
	require.Eventually(t, func() bool {
		for _, k := range healthy {
			if stored(t, c, pfx, k, ids) != admitted.get(k) {
				return false
			}
		}
		return true
	}, 5*time.Second, rate, "the healthy shards' counters caught up")
	for _, k := range healthy {
		assert.Equal(t, admitted.get(k), stored(t, c, pfx, k, ids), "healthy key %q", k)
	}
}
