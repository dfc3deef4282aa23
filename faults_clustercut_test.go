package hybridlimit_test

import (
	"context"
	"net"
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

// Every node of the Redis Cluster is reached through a proxy of its own;
// the proxy of one master cuts every connection (pipelines on their way
// included) and refuses new ones for a second, then lets them through
// again, while async and synchronous limiters decide on keys of all three
// shards. The master itself runs on: no failover. Proven: no decision
// returns an error; the healthy shards' synchronous requests are never in
// doubt; the store holds exactly what the async nodes admitted, on every
// shard (the batches in doubt on the cut shard are sent again and applied
// once); for the synchronous nodes it holds exactly what was admitted on
// the healthy shards, and on the cut shard at least that and at most the
// requests in doubt more.
func TestFaultClusterProxyCut(t *testing.T) {
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	proxies := map[string]*redistest.Proxy{}
	for _, sh := range shards {
		for _, a := range append([]string{sh.Master}, sh.Replicas...) {
			proxies[a] = redistest.NewProxy(t, a)
		}
	}
	victim := shards[1]
	dialer := &net.Dialer{Timeout: faultIO}
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 32,
			DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if p := proxies[addr]; p != nil {
					addr = p.Addr()
				}
				return dialer.DialContext(ctx, network, addr)
			}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var asyncKeys, syncKeys, cutSync []string
	for i, sh := range shards {
		asyncKeys = append(asyncKeys, keysOnShard(sh, "a", 3)...)
		s := keysOnShard(sh, "s", 3)
		syncKeys = append(syncKeys, s...)
		if i == 1 {
			cutSync = s
		}
	}
	isCut := map[string]bool{}
	for _, k := range cutSync {
		isCut[k] = true
	}
	pfxA, pfxS := redistest.Prefix(t), redistest.Prefix(t)
	var cutInDoubt, healthyInDoubt, healthyLate, healthyFailed, asyncDoubtCut atomic.Int64
	var trafficOn atomic.Bool
	mk := func(mode hybridlimit.Mode) *hybridlimit.Limiter {
		w := &watched{Store: newRedisStore(t, newClient())}
		w.onPush = func(_, _ time.Time, bs []*store.Batch) {
			for _, b := range bs {
				if b.Status == store.InDoubt && onShard(victim, b.Group) {
					asyncDoubtCut.Add(1)
				}
			}
		}
		w.onTake = func(_, end time.Time, rs []*store.TakeRequest) {
			for _, r := range rs {
				switch {
				case isCut[r.Key]:
					if r.Status == store.InDoubt {
						cutInDoubt.Add(1)
					}
				case r.Status == store.InDoubt:
					healthyInDoubt.Add(1)
				case r.Status == store.Applied || !trafficOn.Load():
				case lateTake(r, end):
					healthyLate.Add(1)
				default:
					if healthyFailed.Add(1) <= 5 {
						t.Logf("synchronous request on healthy key %q: %v: %v", r.Key, r.Status, r.Err)
					}
				}
			}
		}
		l, err := hybridlimit.New(faultConfig(mode, w, pfxA, pfxS, 1<<40))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	asyncNodes := []*hybridlimit.Limiter{mk(hybridlimit.ModeAsync), mk(hybridlimit.ModeAsync)}
	syncNodes := []*hybridlimit.Limiter{mk(hybridlimit.ModeSynchronous), mk(hybridlimit.ModeSynchronous)}
	ctx := context.Background()
	for _, l := range append(append([]*hybridlimit.Limiter(nil), asyncNodes...), syncNodes...) {
		for _, k := range append(append([]string(nil), asyncKeys...), syncKeys...) {
			_, err := l.Peek(ctx, k) // slots known, connections open, scripts cached
			require.NoError(t, err)
		}
	}
	admittedA, admittedS := newTally(asyncKeys), newTally(syncKeys)
	var errs, degradedHealthy atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	trafficOn.Store(true)
	start := time.Now()
	decideAll(&wg, asyncNodes, 4, asyncKeys, stop, admittedA, &errs, nil)
	for _, l := range syncNodes {
		traffic(&wg, 16, stop, func(g, i int) bool {
			k := syncKeys[(g+i)%len(syncKeys)]
			res, err := l.Allow(ctx, k)
			if err != nil {
				errs.Add(1)
				return false
			}
			if res.Allowed {
				admittedS.add(k)
			}
			if res.Degraded && !isCut[k] {
				degradedHealthy.Add(1)
			}
			return true
		})
	}
	time.Sleep(500 * time.Millisecond)
	p := proxies[victim.Master]
	p.Down()
	time.Sleep(time.Second)
	p.Up()
	time.Sleep(time.Second)
	trafficOn.Store(false)
	close(stop)
	wg.Wait()
	closeAll(t, append(append([]*hybridlimit.Limiter(nil), asyncNodes...), syncNodes...), 10*time.Second)
	end := time.Now()

	assert.Zero(t, errs.Load(), "decisions returned errors")
	assert.Zero(t, healthyInDoubt.Load(), "synchronous requests on healthy shards were in doubt")
	assert.Zero(t, healthyFailed.Load(), "synchronous requests on healthy shards failed other than by arriving late")
	assert.LessOrEqual(t, degradedHealthy.Load(), healthyLate.Load(), "synchronous decisions on healthy shards degraded beyond the requests that arrived late")
	read := redistest.ClusterClient(t)
	ids := hourIDs(start, end)
	for _, k := range asyncKeys {
		assert.Equal(t, admittedA.get(k), stored(t, read, pfxA, k, ids), "async key %q", k)
	}
	var over int64
	for _, k := range syncKeys {
		a, s := admittedS.get(k), stored(t, read, pfxS, k, ids)
		if !isCut[k] {
			assert.Equal(t, a, s, "synchronous key %q of a healthy shard", k)
			continue
		}
		assert.GreaterOrEqual(t, s, a, "synchronous key %q of the cut shard: admissions lost", k)
		over += s - a
	}
	assert.LessOrEqual(t, over, cutInDoubt.Load(), "the cut shard's synchronous keys over-counted beyond the requests in doubt")
	t.Logf("async: admitted %d, %d pushes to the cut shard in doubt; synchronous: admitted %d, cut shard counted twice %d of %d requests in doubt; healthy shards degraded %d (%d arrived late)",
		admittedA.sum(asyncKeys), asyncDoubtCut.Load(), admittedS.sum(syncKeys), over, cutInDoubt.Load(), degradedHealthy.Load(), healthyLate.Load())
}
