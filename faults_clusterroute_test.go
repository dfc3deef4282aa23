package hybridlimit_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
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
// timeouts, closed when the test ends, whose Takes calls records (when
// not nil).
func routeClient(t *testing.T, calls *callLog) *redis.ClusterClient {
	o := &redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), PoolSize: 32,
		DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO}
	if calls != nil {
		calls.trace(o)
	}
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// waitGoroutines fails t unless the goroutines fall back to at most
// before plus a few (the runtime's and the test framework's) within 10 s.
func waitGoroutines(t *testing.T, before int) int {
	var after int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if after = runtime.NumGoroutine(); after <= before+4 {
			return after
		}
	}
	buf := make([]byte, 1<<20)
	t.Errorf("goroutines: %d before, %d after Close:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	return after
}

// The synchronous mode keeps one queue per Redis Cluster master (the Redis
// store is a store.Router). A master is SIGKILLed, and its replica
// promoted by the cluster, while 64 goroutines decide on keys of all three
// shards, with cluster-require-full-coverage no. Proven: no decision errs
// or waits past the StoreTimeout and one batch; the healthy masters' keys
// are Degraded only by requests that arrived after their deadline, none is
// in doubt, and the store holds exactly what was admitted on them; the
// killed master's keys take their own route, are applied again and stop
// failing within a bound of the measured failover time (three times it
// plus 2 s, as in TestFaultClusterMasterKilled); no goroutine is left
// once the limiter and its client are closed. A request on a healthy
// master's key in doubt (or failed by the circuit it opened) is excused
// only when its call's own record shows it waited for that master and
// this process alone, as in TestFaultClusterMasterKilled
// (judgeHealthyTakes): a loaded machine can delay a call past the
// StoreTimeout.
func TestFaultClusterRouteMasterKilled(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	setCoverage(t, addrs, "no")
	t.Cleanup(func() { setCoverage(t, addrs, "yes") })
	victim := shards[1]
	before := runtime.NumGoroutine()
	calls := newCallLog(t)
	c := routeClient(t, calls)

	var keys, healthy []string
	killedKey := map[string]bool{}
	masterOf := map[string]string{} // healthy key -> its master
	for i, sh := range shards {
		ks := keysOnShard(sh, "r", 4)
		keys = append(keys, ks...)
		for _, k := range ks {
			if i == 1 {
				killedKey[k] = true
			} else {
				healthy = append(healthy, k)
				masterOf[k] = sh.Master
			}
		}
	}
	var goneAt, recovered, lastFailed atomic.Int64 // Unix ns
	var trafficOn atomic.Bool
	var healthyLate, inDoubt atomic.Int64
	var healthyMu sync.Mutex
	var healthyTakes []healthyTake // from the warm-up on
	rs := newRedisStore(t, c)
	st := &watched{Store: rs, calls: calls, onTakeCall: func(call int64, start, end time.Time, reqs []*store.TakeRequest) {
		for _, r := range reqs {
			switch {
			case !killedKey[r.Key]:
				late := lateTake(r, end)
				if late && trafficOn.Load() {
					healthyLate.Add(1)
				}
				healthyMu.Lock()
				healthyTakes = append(healthyTakes, healthyTake{node: 1, key: r.Key, call: call, start: start, end: end, status: r.Status, err: r.Err, late: late})
				healthyMu.Unlock()
			case !trafficOn.Load():
			case r.Status == store.Applied:
				if g := goneAt.Load(); g != 0 && start.UnixNano() > g {
					recovered.CompareAndSwap(0, end.UnixNano())
				}
			default:
				if r.Status == store.InDoubt {
					inDoubt.Add(1)
				}
				if !lateTake(r, end) {
					lastFailed.Store(end.UnixNano())
				}
			}
		}
	}}
	pfx := redistest.Prefix(t)
	l, err := hybridlimit.New(faultConfig(hybridlimit.ModeSynchronous, st, "", pfx, 1<<40))
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = l.Close(context.Background())
		}
	})
	ctx := context.Background()
	admitted := newTally(keys)
	warmUp(t, l, keys, admitted)

	var good, bad routeSide
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	trafficOn.Store(true)
	start := time.Now()
	traffic(&wg, 64, stop, func(g, i int) bool {
		k := keys[(g+i)%len(keys)]
		t0 := time.Now()
		res, err := l.Allow(ctx, k)
		d := time.Since(t0)
		if err != nil {
			errs.Add(1)
			return false
		}
		if res.Allowed {
			admitted.add(k)
		}
		if killedKey[k] {
			bad.note(d, res)
		} else {
			good.note(d, res)
		}
		time.Sleep(time.Millisecond)
		return true
	})
	time.Sleep(500 * time.Millisecond)
	kill := time.Now()
	redistest.ServerAt(t, victim.Master).Kill()
	goneAt.Store(time.Now().UnixNano())

	probe := routeClient(t, nil)
	var failover time.Duration
	for deadline := kill.Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if failover == 0 {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			m, err := redistest.MasterForKey(pctx, probe, redistest.ClusterShard{Slots: victim.Slots}.Key("x"))
			cancel()
			if err == nil && m != victim.Master {
				failover = time.Since(kill)
			}
		}
		if failover > 0 && recovered.Load() != 0 {
			break
		}
	}
	time.Sleep(500 * time.Millisecond) // traffic on the promoted replica
	close(stop)
	wg.Wait()
	// The killed master's keys now have their own route, apart from the
	// healthy masters' ones.
	for _, k := range healthy {
		for kk := range killedKey {
			assert.NotEqual(t, rs.Route(pfx, k), rs.Route(pfx, kk), "healthy key %q and killed master's key %q share a route", k, kk)
		}
	}
	closed = true
	require.NoError(t, l.Close(ctx))
	end := time.Now()

	require.NotZero(t, failover, "the cluster did not fail over within 30 s")
	rec := time.Duration(recovered.Load() - kill.UnixNano())
	last := time.Duration(lastFailed.Load() - kill.UnixNano())
	t.Logf("failover %v; killed master's keys: first applied %v, last failed %v after the kill; %d decisions, %d degraded, slowest %v; healthy masters' keys: %d decisions, %d degraded (%d requests late), slowest %v; in doubt %d",
		failover.Round(time.Millisecond), rec.Round(time.Millisecond), last.Round(time.Millisecond),
		bad.n.Load(), bad.degraded.Load(), bad.String(), good.n.Load(), good.degraded.Load(), healthyLate.Load(), good.String(), inDoubt.Load())
	assert.Zero(t, errs.Load(), "decisions returned errors")
	bound := 3*failover + 2*time.Second
	assert.True(t, recovered.Load() != 0 && rec <= bound, "decisions on the killed master's keys applied again after %v, want within %v", rec, bound)
	assert.LessOrEqual(t, last, bound, "decisions on the killed master's keys failed %v after the kill, want within %v", last, bound)
	stalled := judgeHealthyTakes(t, healthyTakes, masterOf, calls, true)
	assert.LessOrEqual(t, good.degraded.Load(), healthyLate.Load()+stalled.excused,
		"decisions on the healthy masters' keys Degraded beyond the late requests and those a stall excuses")
	for _, s := range []*routeSide{&good, &bad} {
		assert.Less(t, time.Duration(s.worst.Load()), 2*faultTimeout+500*time.Millisecond,
			"a decision waited past the StoreTimeout and one batch")
	}
	ids := hourIDs(start, end)
	for _, k := range healthy {
		// A request in doubt may have run in the store and been decided
		// again by the FailurePolicy: counted twice at most.
		a, s := admitted.get(k), stored(t, probe, pfx, k, ids)
		assert.True(t, s >= a && s-a <= stalled.inDoubt[k], "healthy master's key %q: admitted %d, stored %d, in doubt while the process stalled %d", k, a, s, stalled.inDoubt[k])
	}
	_ = c.Close()
	_ = probe.Close()
	waitGoroutines(t, before)
}

// Three slots holding keys move from one master to another (as in
// TestFaultClusterSlotMigration) while 64 goroutines make synchronous
// decisions on them and on keys of the other masters. Proven: the moved
// keys' routes follow their slots to the new master's; no decision errs or
// waits past the StoreTimeout and one batch; the store holds at least what
// was admitted, and at most the requests in doubt more.
func TestFaultClusterRouteSlotMigration(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	src, dst := shards[0], shards[1]
	moving := keysOnShard(src, "m", 3)
	others := append(keysOnShard(dst, "d", 3), keysOnShard(shards[2], "o", 3)...)
	keys := append(append([]string(nil), moving...), others...)
	c := routeClient(t, nil)
	rs := newRedisStore(t, c)
	var inDoubt, failed atomic.Int64
	st := &watched{Store: rs, onTake: func(_, end time.Time, reqs []*store.TakeRequest) {
		for _, r := range reqs {
			switch {
			case r.Status == store.InDoubt:
				inDoubt.Add(1)
			case r.Status != store.Applied && !lateTake(r, end):
				if failed.Add(1) <= 3 {
					t.Logf("a request on key %q: %v: %v", r.Key, r.Status, r.Err)
				}
			}
		}
	}}
	pfx := redistest.Prefix(t)
	l, err := hybridlimit.New(faultConfig(hybridlimit.ModeSynchronous, st, "", pfx, 1<<40))
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	admitted := newTally(keys)
	warmUp(t, l, keys, admitted)
	dstRoute := rs.Route(pfx, others[0])
	for _, k := range moving {
		require.NotEqual(t, dstRoute, rs.Route(pfx, k), "key %q before the migration", k)
	}

	var side routeSide
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	traffic(&wg, 64, stop, func(g, i int) bool {
		k := keys[(g+i)%len(keys)]
		t0 := time.Now()
		res, err := l.Allow(ctx, k)
		if err != nil {
			errs.Add(1)
			return false
		}
		side.note(time.Since(t0), res)
		if res.Allowed {
			admitted.add(k)
		}
		time.Sleep(time.Millisecond)
		return true
	})
	time.Sleep(300 * time.Millisecond)
	var slots []int
	for _, k := range moving {
		slots = append(slots, store.Slot(k))
	}
	t.Cleanup(func() {
		for _, s := range slots {
			migrateSlot(t, shards, s, dst, src)
		}
	})
	for _, s := range slots {
		migrateSlot(t, shards, s, src, dst)
	}
	// A route follows its slot at the first call for the slot once the
	// client's slot map names the new master; on a loaded machine the
	// traffic may make that call later than 300 ms after the migration,
	// so it runs on until every moved key's route followed, or 30 s.
	time.Sleep(300 * time.Millisecond)
	moved := time.Now()
	followed := func() bool {
		return !slices.ContainsFunc(moving, func(k string) bool { return rs.Route(pfx, k) != dstRoute })
	}
	for deadline := moved.Add(30 * time.Second); !followed() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("routes checked %v after the migration's end and 300 ms", time.Since(moved).Round(time.Millisecond))
	close(stop)
	wg.Wait()
	for _, k := range moving {
		assert.Equal(t, dstRoute, rs.Route(pfx, k), "key %q: its route did not follow its slot", k)
	}
	closeAll(t, []*hybridlimit.Limiter{l}, 10*time.Second)
	end := time.Now()

	ids := hourIDs(start, end)
	var over int64
	for _, k := range keys {
		a, s := admitted.get(k), stored(t, c, pfx, k, ids)
		assert.GreaterOrEqual(t, s, a, "key %q: admissions lost", k)
		over += s - a
	}
	t.Logf("%d decisions, %d degraded (%d requests failed other than late), slowest %v; store − admitted %d of %d requests in doubt",
		side.n.Load(), side.degraded.Load(), failed.Load(), side.String(), over, inDoubt.Load())
	assert.Zero(t, errs.Load(), "decisions returned errors")
	assert.LessOrEqual(t, over, inDoubt.Load(), "over-counted beyond the requests in doubt")
	assert.Less(t, time.Duration(side.worst.Load()), 2*faultTimeout+500*time.Millisecond,
		"a decision waited past the StoreTimeout and one batch")
}

// Close while a master hangs (SIGSTOP, shorter than the cluster's node
// timeout) and decisions on its keys wait on its route, 48 of 64
// goroutines deciding on them, the others on the healthy masters' keys.
// Proven: Close returns within its context and one StoreTimeout; every
// decision returns, a result or ErrClosed, within the StoreTimeout and one
// batch, those waiting when Close began with ErrClosed; no goroutine is
// left once the limiter and its client are closed.
func TestFaultClusterRouteCloseWhileHung(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	setCoverage(t, addrs, "no")
	t.Cleanup(func() { setCoverage(t, addrs, "yes") })
	before := runtime.NumGoroutine()
	c := routeClient(t, nil)
	hung := keysOnShard(shards[1], "h", 4)
	healthy := append(keysOnShard(shards[0], "g", 2), keysOnShard(shards[2], "g", 2)...)
	l, err := hybridlimit.New(faultConfig(hybridlimit.ModeSynchronous, newRedisStore(t, c), "", redistest.Prefix(t), 1<<40))
	require.NoError(t, err)
	ctx := context.Background()
	for _, k := range append(append([]string(nil), hung...), healthy...) {
		_, err := l.Allow(ctx, k)
		require.NoError(t, err)
	}

	var good, bad routeSide
	var errs, closedErrs, waitedClose atomic.Int64
	var closeStarted atomic.Int64 // Unix ns
	var wg sync.WaitGroup
	traffic(&wg, 64, nil, func(g, i int) bool {
		keys, side := hung, &bad
		if g%4 == 0 {
			keys, side = healthy, &good
		}
		t0 := time.Now()
		res, err := l.Allow(ctx, keys[(g+i)%len(keys)])
		if err != nil {
			res = hybridlimit.Result{}
		}
		side.note(time.Since(t0), res)
		switch {
		case errors.Is(err, hybridlimit.ErrClosed):
			// A decision on the hung master's keys that was waiting when
			// Close began.
			if c := closeStarted.Load(); side == &bad && c != 0 && t0.UnixNano() < c {
				waitedClose.Add(1)
			}
			closedErrs.Add(1)
			return false
		case err != nil:
			errs.Add(1)
			return false
		}
		return true
	})
	time.Sleep(100 * time.Millisecond)
	srv := redistest.ServerAt(t, shards[1].Master)
	srv.Stop()
	time.Sleep(200 * time.Millisecond) // the hung master's route fills
	closeStart := time.Now()
	closeStarted.Store(closeStart.UnixNano())
	const closeWait = 300 * time.Millisecond
	cctx, cancel := context.WithTimeout(ctx, closeWait)
	closeErr := l.Close(cctx)
	cancel()
	closeDur := time.Since(closeStart)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var returned time.Duration
	select {
	case <-done:
		returned = time.Since(closeStart)
	case <-time.After(2*faultTimeout + time.Second):
	}
	srv.Cont()
	<-done

	t.Logf("Close returned after %v (%v); every decision returned %v after Close began; hung master's keys: %d decisions, %d degraded, slowest %v, %d waiting when Close began; healthy: %d decisions, slowest %v; %d callers got ErrClosed",
		closeDur.Round(time.Millisecond), closeErr, returned.Round(time.Millisecond),
		bad.n.Load(), bad.degraded.Load(), bad.String(), waitedClose.Load(), good.n.Load(), good.String(), closedErrs.Load())
	assert.Less(t, closeDur, closeWait+faultTimeout+500*time.Millisecond, "Close outlived its context")
	assert.NotZero(t, returned, "decisions still waiting %v after Close began", 2*faultTimeout+time.Second)
	assert.Zero(t, errs.Load(), "decisions returned errors other than ErrClosed")
	assert.EqualValues(t, 64, closedErrs.Load(), "callers that got ErrClosed")
	assert.Positive(t, waitedClose.Load(), "decisions on the hung master's keys waiting when Close began")
	for _, s := range []*routeSide{&good, &bad} {
		assert.Less(t, time.Duration(s.worst.Load()), 2*faultTimeout+500*time.Millisecond,
			"a decision waited past the StoreTimeout and one batch")
	}
	_ = c.Close()
	waitGoroutines(t, before)
}

// A master hangs (SIGSTOP, shorter than the cluster's node timeout) while
// 8 goroutines decide on its keys and 8 others decide, each for the first
// time, on 600 keys of distinct slots of the healthy masters. Proven: a key
// of a slot no call went to yet joins its own master's queue (the Redis
// store reads the route from the client's slot map), not the queue of the
// first master the store learnt: no such decision begun during the hang
// waits for the hung master, none is Degraded. The fresh keys the hang was
// too short for (a loaded machine) are decided after it, and only counted.
func TestFaultClusterRouteFreshKeysBesideHungMaster(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	addrs := redistest.ClusterAddrs(t)
	setCoverage(t, addrs, "no")
	t.Cleanup(func() { setCoverage(t, addrs, "yes") })
	c := routeClient(t, nil)
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
	var bad, good, late routeSide
	var next atomic.Int64
	var hangEnd atomic.Int64 // Unix ns at SIGCONT; 0 while the master hangs
	stop, never := make(chan struct{}), make(chan struct{})
	var wg, freshWG sync.WaitGroup
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
	traffic(&freshWG, 8, never, func(g, i int) bool {
		n := int(next.Add(1)) - 1
		if n >= len(fresh) {
			return false
		}
		t0 := time.Now()
		res, err := l.Allow(ctx, fresh[n])
		assert.NoError(t, err)
		if e := hangEnd.Load(); e != 0 && t0.UnixNano() >= e {
			late.note(time.Since(t0), res)
			return true
		}
		good.note(time.Since(t0), res)
		time.Sleep(5 * time.Millisecond)
		return true
	})
	time.Sleep(800 * time.Millisecond)
	hangEnd.Store(time.Now().UnixNano())
	srv.Cont()
	close(stop)
	wg.Wait()
	freshWG.Wait()
	t.Logf("fresh keys on the healthy masters: %d decisions begun during the hang, %d degraded, slowest %v (%d more after it); hung master's keys: %d decisions, %d degraded, slowest %v",
		good.n.Load(), good.degraded.Load(), good.String(), late.n.Load(), bad.n.Load(), bad.degraded.Load(), bad.String())
	assert.EqualValues(t, len(fresh), good.n.Load()+late.n.Load(), "fresh keys decided")
	assert.GreaterOrEqual(t, good.n.Load(), int64(100), "fresh keys decided during the hang")
	assert.Zero(t, good.degraded.Load(), "decisions on fresh keys of the healthy masters Degraded")
	assert.Less(t, time.Duration(good.worst.Load()), faultTimeout*3/4, "a decision on a fresh key of a healthy master waited for the hung master")
}
