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

// routeSide is what the callers deciding on one side of a route test
// (the healthy masters' keys, or the failed one's) were told: how many
// decisions, how many Degraded, and the slowest.
type routeSide struct{ n, degraded, worst atomic.Int64 }

// note records a decision that took d.
func (s *routeSide) note(d time.Duration, res hybridlimit.Result) {
	for old := s.worst.Load(); int64(d) > old && !s.worst.CompareAndSwap(old, int64(d)); old = s.worst.Load() {
	}
	s.n.Add(1)
	if res.Degraded {
		s.degraded.Add(1)
	}
}

// String returns the slowest decision, rounded to the millisecond.
func (s *routeSide) String() string {
	return time.Duration(s.worst.Load()).Round(time.Millisecond).String()
}

// routeClient returns a Redis Cluster client with the fault tests'
// timeouts, closed when the test ends.
func routeClient(t *testing.T) *redis.ClusterClient {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), PoolSize: 32,
		DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A master hangs (SIGSTOP, shorter than the cluster's node timeout) while
// 8 goroutines decide on its keys and 8 others decide, each for the first
// time, on 600 keys of distinct slots of the healthy masters. Proven: a key
// of a slot no call went to yet joins its own master's queue (the Redis
// store reads the route from the client's slot map), not the queue of the
// first master the store learnt: no such decision waits for the hung
// master, none is Degraded.
func TestFaultClusterRouteFreshKeysBesideHungMaster(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	setCoverage(t, addrs, "no")
	t.Cleanup(func() { setCoverage(t, addrs, "yes") })
	c := routeClient(t)
	hung := keysOnShard(shards[1], "h", 4)
	fresh := append(keysOnShard(shards[0], "f", 300), keysOnShard(shards[2], "f", 300)...)
	l, err := hybridlimit.New(faultConfig(hybridlimit.ModeSynchronous, newRedisStore(t, c), "", redistest.Prefix(t), 1<<40))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	for _, k := range hung {
		_, err := l.Allow(ctx, k)
		require.NoError(t, err)
	}
	var bad, good routeSide
	var next atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	traffic(&wg, 8, stop, func(g, i int) bool {
		t0 := time.Now()
		res, err := l.Allow(ctx, hung[(g+i)%len(hung)])
		assert.NoError(t, err)
		bad.note(time.Since(t0), res)
		return true
	})
	time.Sleep(100 * time.Millisecond)
	srv := redistest.ServerAt(t, shards[1].Master)
	srv.Stop()
	traffic(&wg, 8, stop, func(g, i int) bool {
		n := int(next.Add(1)) - 1
		if n >= len(fresh) {
			return false
		}
		t0 := time.Now()
		res, err := l.Allow(ctx, fresh[n])
		assert.NoError(t, err)
		good.note(time.Since(t0), res)
		time.Sleep(5 * time.Millisecond)
		return true
	})
	time.Sleep(800 * time.Millisecond)
	srv.Cont()
	close(stop)
	wg.Wait()
	t.Logf("fresh keys on the healthy masters: %d decisions, %d degraded, slowest %v; hung master's keys: %d decisions, %d degraded, slowest %v",
		good.n.Load(), good.degraded.Load(), good.String(), bad.n.Load(), bad.degraded.Load(), bad.String())
	assert.EqualValues(t, len(fresh), good.n.Load(), "fresh keys decided")
	assert.Zero(t, good.degraded.Load(), "decisions on fresh keys of the healthy masters Degraded")
	assert.Less(t, time.Duration(good.worst.Load()), faultTimeout*3/4, "a decision on a fresh key of a healthy master waited for the hung master")
}
