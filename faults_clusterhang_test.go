package hybridlimit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// One master of the Redis Cluster hangs (SIGSTOP, shorter than the
// cluster's node timeout, so no failover) while a ModeSynchronous limiter
// decides on keys of all three shards from many goroutines. The decisions
// of each master go out in their own batches (the Redis store is a
// store.Router), so those on the healthy masters' keys never wait for the
// hung one: none fails but by its deadline on a loaded machine, and none
// waits as long as the hung master's calls, which end at the
// StoreTimeout. The decisions on the hung master's keys are Degraded
// (FailOpen), none later than the StoreTimeout and one batch.
//
// The cluster is set not to require full coverage, so that a hang the
// cluster notices on a loaded machine does not make the healthy masters
// answer CLUSTERDOWN (TestFaultClusterMasterKilled shows that case).
func TestFaultClusterHungMasterSynchronous(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	setCoverage(t, addrs, "no")
	t.Cleanup(func() { setCoverage(t, addrs, "yes") })
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 32,
		DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })

	var healthy, hung []string
	isHealthy := map[string]bool{}
	for i, sh := range shards {
		keys := keysOnShard(sh, "k", 4)
		if i == 1 {
			hung = keys
			continue
		}
		healthy = append(healthy, keys...)
		for _, k := range keys {
			isHealthy[k] = true
		}
	}
	// Every request on a healthy master's key that the store did not
	// apply, but for its deadline.
	var healthyFailed atomic.Int64
	st := &watched{Store: newRedisStore(t, c), onTake: func(_, _ time.Time, reqs []*store.TakeRequest) {
		for _, r := range reqs {
			if isHealthy[r.Key] && r.Status != store.Applied && !errors.Is(r.Err, store.ErrDeadline) {
				healthyFailed.Add(1)
				t.Logf("a request on healthy key %q: %v %v", r.Key, r.Status, r.Err)
			}
		}
	}}
	const timeout = faultTimeout
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: st, StoreTimeout: timeout,
		Prefix: redistest.Prefix(t), Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	warmUp(t, l, append(append([]string(nil), healthy...), hung...), nil)

	var good, bad routeSide
	stop := make(chan struct{})
	var wg sync.WaitGroup
	decide := func(keys []string, s *routeSide) {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			res, err := l.Allow(context.Background(), keys[i%len(keys)])
			s.note(time.Since(start), res)
			assert.NoError(t, err)
		}
	}
	for range 8 {
		wg.Go(func() { decide(healthy, &good) })
		wg.Go(func() { decide(hung, &bad) })
	}
	time.Sleep(100 * time.Millisecond)
	srv := redistest.ServerAt(t, shards[1].Master)
	srv.Stop()
	time.Sleep(800 * time.Millisecond) // below the cluster's node timeout of 1 s
	srv.Cont()
	close(stop)
	wg.Wait()

	t.Logf("healthy masters' keys: %d decisions, %d degraded, slowest %v; hung master's keys: %d decisions, %d degraded, slowest %v",
		good.n.Load(), good.degraded.Load(), &good, bad.n.Load(), bad.degraded.Load(), &bad)
	assert.Zero(t, healthyFailed.Load(), "requests on the healthy masters' keys failed")
	assert.Less(t, time.Duration(good.worst.Load()), timeout*3/4, "a decision on a healthy master's key waited for the hung master")
	assert.Positive(t, bad.degraded.Load(), "decisions on the hung master's keys")
	assert.Less(t, time.Duration(bad.worst.Load()), 2*timeout+500*time.Millisecond,
		"a decision on the hung master's key waited past the StoreTimeout and one batch")
}
