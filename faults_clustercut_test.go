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
//
// A loaded machine can delay a call to a healthy master past the
// StoreTimeout, cut or not (the goroutines of the call and of its master's
// proxy wait for a processor): the call is then in doubt. As in
// TestFaultClusterMasterKilled, each call's own record tells those apart
// (judgeHealthyTakes): such a request is excused only when every pipeline
// that carried it went to its own master (through that master's proxy),
// the first without a delay the process' scheduling does not account for,
// and its key may then hold it twice.
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
	calls := newCallLog(t)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(calls.trace(&redis.ClusterOptions{Addrs: addrs, PoolSize: 32,
			DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if p := proxies[addr]; p != nil {
					addr = p.Addr()
				}
				return dialer.DialContext(ctx, network, addr)
			}}))
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
	masterOf := map[string]string{} // healthy synchronous key -> its master
	for _, sh := range []redistest.ClusterShard{shards[0], shards[2]} {
		for _, k := range syncKeys {
			if onShard(sh, store.Slot(k)) {
				masterOf[k] = sh.Master
			}
		}
	}
	var cutInDoubt, healthyLate, asyncDoubtCut atomic.Int64
	var healthyMu sync.Mutex
	var healthyTakes []healthyTake
	nodes := 0
	mk := func(mode hybridlimit.Mode) *hybridlimit.Limiter {
		nodes++
		id := nodes
		w := &watched{Store: newRedisStore(t, newClient()), calls: calls}
		w.onPush = func(_, _ time.Time, bs []*store.Batch) {
			for _, b := range bs {
				if b.Status == store.InDoubt && onShard(victim, b.Group) {
					asyncDoubtCut.Add(1)
				}
			}
		}
		w.onTakeCall = func(call int64, start, end time.Time, rs []*store.TakeRequest) {
			for _, r := range rs {
				switch {
				case isCut[r.Key]:
					if r.Status == store.InDoubt {
						cutInDoubt.Add(1)
					}
				case masterOf[r.Key] == "":
					// An async key, which the synchronous nodes only
					// peek at in the warm-up: not a healthy shard's
					// synchronous traffic.
				default:
					late := lateTake(r, end)
					if late {
						healthyLate.Add(1)
					}
					healthyMu.Lock()
					healthyTakes = append(healthyTakes, healthyTake{node: id, key: r.Key, call: call, start: start, end: end, status: r.Status, err: r.Err, late: late})
					healthyMu.Unlock()
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
	close(stop)
	wg.Wait()
	closeAll(t, append(append([]*hybridlimit.Limiter(nil), asyncNodes...), syncNodes...), 10*time.Second)
	end := time.Now()

	assert.Zero(t, errs.Load(), "decisions returned errors")
	// Every synchronous request on a healthy shard was applied or refused
	// for arriving late, but those their calls' own record excuses.
	stalled := judgeHealthyTakes(t, healthyTakes, masterOf, calls, true)
	assert.LessOrEqual(t, degradedHealthy.Load(), healthyLate.Load()+stalled.excused,
		"synchronous decisions on healthy shards degraded beyond the requests that arrived late or that a stall excuses")
	read := redistest.ClusterClient(t)
	ids := hourIDs(start, end)
	for _, k := range asyncKeys {
		assert.Equal(t, admittedA.get(k), stored(t, read, pfxA, k, ids), "async key %q", k)
	}
	var over int64
	for _, k := range syncKeys {
		a, s := admittedS.get(k), stored(t, read, pfxS, k, ids)
		if !isCut[k] {
			// A request in doubt may have run in the store and been
			// decided again by the FailurePolicy: counted twice at most.
			assert.True(t, s >= a && s-a <= stalled.inDoubt[k], "synchronous key %q of a healthy shard: admitted %d, stored %d, in doubt while the process stalled %d", k, a, s, stalled.inDoubt[k])
			continue
		}
		assert.GreaterOrEqual(t, s, a, "synchronous key %q of the cut shard: admissions lost", k)
		over += s - a
	}
	assert.LessOrEqual(t, over, cutInDoubt.Load(), "the cut shard's synchronous keys over-counted beyond the requests in doubt")
	t.Logf("async: admitted %d, %d pushes to the cut shard in doubt; synchronous: admitted %d, cut shard counted twice %d of %d requests in doubt; healthy shards degraded %d (%d arrived late, %d in doubt or failed while the process stalled)",
		admittedA.sum(asyncKeys), asyncDoubtCut.Load(), admittedS.sum(syncKeys), over, cutInDoubt.Load(), degradedHealthy.Load(), healthyLate.Load(), stalled.excused)
}
