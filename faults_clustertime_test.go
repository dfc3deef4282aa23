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

// A ModeAsync node does not back off while a master of the Cluster is
// dead and not yet replaced (docs/failures.md, "A dead shard affects only
// its slots": the loop does not back off while other batches are applied,
// or while some master answers TIME). Two FailClosed nodes: one with keys
// on every shard, whose healthy batches are applied each cycle, and one
// with keys on the dead shard only, none of whose batches is applied and
// whose probe (Store.Time) the living masters answer. A FailClosed denial
// of a failing key carries the loop's wait before its next cycle as
// RetryAfter: SyncRate while the loop keeps its rate, twice or more once
// it backs off. The first node never denies a healthy key and keeps the
// healthy shards' counters exact.
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
	isDead := map[string]bool{dead[0]: true, dead[1]: true}
	all := append(append([]string(nil), healthy...), dead...)
	mk := func() *hybridlimit.Limiter {
		cfg := faultConfig(hybridlimit.ModeAsync, newRedisStore(t, faultClusterClient(t, addrs)), pfx, "", 0)
		cfg.SyncRate, cfg.FailurePolicy = rate, hybridlimit.FailClosed
		l, err := hybridlimit.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	nodes := []*hybridlimit.Limiter{mk(), mk()} // mixed, dead-shard only
	names := []string{"mixed", "dead-shard"}
	keysOf := [][]string{all, dead}
	admitted := newTally(all)
	var degraded, healthyDenied [2]atomic.Int64
	var maxRetry [2]atomic.Int64
	ctx := context.Background()
	decide := func(n int, k string) { // from any goroutine
		res, err := nodes[n].Allow(ctx, k)
		if !assert.NoError(t, err) {
			return
		}
		switch {
		case res.Allowed:
			admitted.add(k)
		case !isDead[k]:
			healthyDenied[n].Add(1)
		case res.Degraded:
			degraded[n].Add(1)
			if r := int64(res.RetryAfter); r > maxRetry[n].Load() {
				maxRetry[n].Store(r)
			}
		}
	}
	// Warm both nodes: a few cycles applied on every shard.
	start := time.Now()
	for n := range nodes {
		for _, k := range keysOf[n] {
			decide(n, k)
		}
	}
	require.Eventually(t, func() bool {
		return nodes[0].Stats().Pending == 0 && nodes[1].Stats().Pending == 0
	}, 5*time.Second, rate)

	redistest.ServerAt(t, victim.Master).Kill()
	killed := time.Now()
	cycles0 := [2]uint64{nodes[0].Stats().SyncCycles, nodes[1].Stats().SyncCycles}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { // decisions on every key: every cycle has batches to send
		for {
			select {
			case <-stop:
				return
			case <-time.After(rate / 4):
			}
			for n := range nodes {
				for _, k := range keysOf[n] {
					decide(n, k)
				}
			}
		}
	})
	var maxCycle [2]atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(rate / 2):
			}
			for n, l := range nodes {
				if c := int64(l.Stats().SyncCycleTime); c > maxCycle[n].Load() {
					maxCycle[n].Store(c)
				}
			}
		}
	})
	// 600 ms: with cluster-node-timeout 1 s the cluster cannot flag the
	// master failed before 1 s.
	time.Sleep(600 * time.Millisecond)
	close(stop)
	wg.Wait()
	elapsed := time.Since(killed)
	require.True(t, replicaOf(t, victim.Replicas[0]), "the replica was promoted within %v", elapsed)
	for n, name := range names {
		st := nodes[n].Stats()
		t.Logf("%s node, %v after the kill: %d cycles, the longest %v; %d degraded denials, largest RetryAfter %v; last error %v",
			name, elapsed, st.SyncCycles-cycles0[n], time.Duration(maxCycle[n].Load()),
			degraded[n].Load(), time.Duration(maxRetry[n].Load()), st.LastError)
		assert.Positive(t, degraded[n].Load(), "%s node: the dead shard's keys were denied as failing", name)
		assert.Equal(t, rate, time.Duration(maxRetry[n].Load()), "%s node: the loop backed off", name)
		assert.Zero(t, healthyDenied[n].Load(), "%s node: healthy keys denied", name)
		// The dead master's calls fail after go-redis' dial retries (400
		// ms). The dead-shard node's cycles wait for them; the mixed
		// node's stop waiting after a SyncRate, as its healthy batches
		// are answered, and land them in a later cycle. A probe TIME that
		// waited on the dead master as well would leave a single cycle,
		// 800 ms long, in the window.
		assert.GreaterOrEqual(t, st.SyncCycles-cycles0[n], uint64(2), "%s node: cycles after the kill", name)
		if n == 0 {
			assert.Less(t, time.Duration(maxCycle[n].Load()), faultTimeout/2, "mixed node: a cycle waited for the dead master")
		}
	}

	// The healthy shards' counters are exact: every admitted request on
	// them reached the store, once. The cluster flags the dead master
	// failed some 1 s after the kill and every master answers CLUSTERDOWN
	// (cluster-require-full-coverage yes, the default) until the replica
	// is promoted: pushes and these reads fail meanwhile, and go on after.
	c := faultClusterClient(t, addrs)
	ids := hourIDs(start, time.Now())
	var last error
	caughtUp := func() bool {
		for _, k := range healthy {
			n, err := tryStored(c, pfx, k, ids)
			if err != nil {
				last = err
				return false
			}
			if n != admitted.get(k) {
				last = fmt.Errorf("key %q: stored %d, admitted %d", k, n, admitted.get(k))
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); !caughtUp(); time.Sleep(rate) {
		require.True(t, time.Now().Before(deadline), "the healthy shards' counters did not catch up within 30 s: %v", last)
	}
}
