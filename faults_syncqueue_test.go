package hybridlimit_test

import (
	"context"
	"fmt"
	"runtime"
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

// The standalone server alternates between answering, hanging (SIGSTOP),
// losing its replies and refusing connections (a proxy per node), under
// two synchronous limiters (FailOpen and FailClosed), 12 goroutines each,
// every decision on a key of its own. Proven: every request the store is
// sent belongs to a caller still waiting, none is sent twice, every
// decision returns (the slowest well within a few StoreTimeouts), the
// results match the FailurePolicy, Stats.Degraded counts each degraded
// decision once, and no goroutine is left once the store recovered and
// the limiters closed.
func TestFaultSynchronousQueueUnderFlappingStore(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	srv := redistest.ServerAt(t, addr)
	before := runtime.NumGoroutine()

	type node struct {
		name     string
		l        *hybridlimit.Limiter
		p        *redistest.Proxy
		policy   hybridlimit.FailurePolicy
		n, deg   atomic.Int64 // Allow decisions, Degraded ones
		peeks    atomic.Int64
		worst    atomic.Int64
		bad      atomic.Int64 // results that break the policy
		badFirst atomic.Value
	}
	const (
		waiting  = 1
		returned = 2
	)
	var state sync.Map // key -> *atomic.Int32
	var sentTwice, sentReturned, sentUnknown atomic.Int64
	var seen sync.Map
	check := func(reqs []*store.TakeRequest) {
		for _, r := range reqs {
			v, ok := state.Load(r.Key)
			if !ok {
				sentUnknown.Add(1)
				continue
			}
			if v.(*atomic.Int32).Load() != waiting {
				sentReturned.Add(1)
			}
			if _, dup := seen.LoadOrStore(r.Key, true); dup {
				sentTwice.Add(1)
			}
		}
	}
	var nodes []*node
	var closers []func()
	for i, policy := range []hybridlimit.FailurePolicy{hybridlimit.FailOpen, hybridlimit.FailClosed} {
		p := redistest.NewProxy(t, addr)
		// One client honors deadlines (the README's), the other keeps
		// go-redis' defaults but for a long ReadTimeout.
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), ReadTimeout: 10 * time.Second, ContextTimeoutEnabled: i == 0})
		w := takeHook{Store: newRedisStore(t, c), before: check}
		l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, FailurePolicy: policy, Store: w,
			StoreTimeout: faultTimeout, Prefix: fmt.Sprint(pfx, i), Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}})
		require.NoError(t, err)
		nodes = append(nodes, &node{name: policy.String(), l: l, p: p, policy: policy})
		closers = append(closers, func() { _ = c.Close() })
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for ni, nd := range nodes {
		traffic(&wg, 12, stop, func(g, i int) bool {
			key := fmt.Sprint("n", ni, "g", g, "i", i)
			st := new(atomic.Int32)
			st.Store(waiting)
			state.Store(key, st)
			peek := i%5 == 4
			t0 := time.Now()
			var res hybridlimit.Result
			var err error
			if peek {
				res, err = nd.l.Peek(ctx, key)
			} else {
				res, err = nd.l.Allow(ctx, key)
			}
			st.Store(returned)
			d := time.Since(t0).Nanoseconds()
			for w := nd.worst.Load(); d > w && !nd.worst.CompareAndSwap(w, d); w = nd.worst.Load() {
			}
			if !assert.NoError(t, err) {
				return false
			}
			if peek {
				nd.peeks.Add(1)
			} else {
				nd.n.Add(1)
				if res.Degraded {
					nd.deg.Add(1)
				}
			}
			ok := true
			switch {
			case !res.Degraded:
				ok = res.Allowed && res.RetryAfter == 0
			case nd.policy == hybridlimit.FailOpen:
				ok = res.Allowed && res.RetryAfter == 0 && res.Remaining > 0
			default:
				ok = !res.Allowed && res.Remaining == 0 && res.RetryAfter > 0
			}
			if !ok {
				if nd.bad.Add(1) == 1 {
					nd.badFirst.Store(fmt.Sprintf("peek=%v %+v", peek, res))
				}
			}
			return true
		})
	}
	time.Sleep(200 * time.Millisecond)
	for round := range 4 {
		srv.Stop()
		time.Sleep(time.Duration(150+100*round) * time.Millisecond)
		srv.Cont()
		time.Sleep(120 * time.Millisecond)
		for _, nd := range nodes {
			nd.p.DropReplies()
		}
		time.Sleep(250 * time.Millisecond)
		for _, nd := range nodes {
			nd.p.Up()
		}
		time.Sleep(80 * time.Millisecond)
		for _, nd := range nodes {
			nd.p.Down()
		}
		time.Sleep(150 * time.Millisecond)
		for _, nd := range nodes {
			nd.p.Up()
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // the breakers close again
	close(stop)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("decisions still blocked 30 s after the traffic stopped:\n%s", buf[:runtime.Stack(buf, true)])
	}
	for _, nd := range nodes {
		// After recovery, the store decides again.
		st := new(atomic.Int32)
		st.Store(waiting)
		state.Store("after"+nd.name, st)
		res, err := nd.l.Allow(ctx, "after"+nd.name)
		require.NoError(t, err)
		assert.False(t, res.Degraded, "%s: the store decides again once it recovered", nd.name)
		stats := nd.l.Stats()
		t.Logf("%s: %d decisions (%d degraded), %d peeks, slowest %v; Stats: Degraded %d SyncErrors %d StoreCalls %d",
			nd.name, nd.n.Load(), nd.deg.Load(), nd.peeks.Load(), time.Duration(nd.worst.Load()).Round(time.Millisecond),
			stats.Degraded, stats.SyncErrors, stats.StoreCalls)
		assert.Zero(t, nd.bad.Load(), "%s: results that break the FailurePolicy, first: %v", nd.name, nd.badFirst.Load())
		assert.Equal(t, uint64(nd.n.Load()+1), stats.Allowed+stats.Denied, "%s: Stats.Allowed and Denied count each decision once, peeks excluded", nd.name)
		assert.Equal(t, uint64(nd.deg.Load()), stats.Degraded, "%s: Stats.Degraded counts each degraded decision once", nd.name)
		assert.GreaterOrEqual(t, stats.SyncErrors, stats.Degraded, nd.name)
		assert.Positive(t, nd.deg.Load(), nd.name)
		assert.Less(t, time.Duration(nd.worst.Load()), 10*faultTimeout, "%s: a decision waited far beyond StoreTimeout", nd.name)
	}
	assert.Zero(t, sentReturned.Load(), "requests sent after their caller returned")
	assert.Zero(t, sentTwice.Load(), "requests sent twice")
	assert.Zero(t, sentUnknown.Load(), "requests of no caller")
	for _, nd := range nodes {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = nd.l.Close(cctx)
		cancel()
	}
	for _, c := range closers {
		c()
	}
	for _, nd := range nodes {
		nd.p.Down()
	}
	var after int
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if after = runtime.NumGoroutine(); after <= before+4 { // the proxies' listeners
			break
		}
	}
	if after > before+4 {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutines: %d before, %d after Close:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// takeHook calls before with the requests of every Take, before the store
// sees them.
type takeHook struct {
	store.Store
	before func([]*store.TakeRequest)
}

func (h takeHook) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	h.before(reqs)
	return h.Store.Take(ctx, reqs)
}

// Two synchronous FailOpen limiters, 8 goroutines each, decide and peek
// on shared keys (and only peek on others) while the standalone server
// loses its replies (both nodes, then one), hangs (SIGSTOP) and refuses
// connections. Proven: afterwards the store holds every admission, counts
// twice at most the admissions in doubt, and holds nothing of the Peeks.
func TestFaultSynchronousTwoNodesCountBound(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	srv := redistest.ServerAt(t, addr)
	keys := []string{"k0", "k1", "k2", "k3"}
	peekKeys := []string{"p0", "p1", "p2", "p3"}
	inDoubt := newTally(keys)
	var doubtCalls, peekDoubt atomic.Int64
	type node struct {
		l *hybridlimit.Limiter
		p *redistest.Proxy
	}
	var nodes []node
	for range 2 {
		p := redistest.NewProxy(t, addr)
		w := &watched{Store: newRedisStore(t, faultClient(t, p.Addr()))}
		w.onTake = func(_, _ time.Time, rs []*store.TakeRequest) {
			n := 0
			for _, r := range rs {
				if r.Status == store.InDoubt {
					n++
					if r.Peek {
						peekDoubt.Add(1)
					} else {
						inDoubt.add(r.Key)
					}
				}
			}
			if n > 0 {
				doubtCalls.Add(1)
			}
		}
		l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: w, StoreTimeout: faultTimeout,
			Prefix: pfx, Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, node{l, p})
	}
	ctx := context.Background()
	allowed := newTally(keys)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, nd := range nodes {
		traffic(&wg, 8, stop, func(g, i int) bool {
			var err error
			switch i % 4 {
			case 0:
				_, err = nd.l.Peek(ctx, peekKeys[(g+i)%len(peekKeys)])
			case 1:
				_, err = nd.l.Peek(ctx, keys[(g+i)%len(keys)])
			default:
				k := keys[(g+i)%len(keys)]
				var res hybridlimit.Result
				res, err = nd.l.Allow(ctx, k)
				if err == nil && res.Allowed {
					allowed.add(k)
				}
			}
			return assert.NoError(t, err)
		})
	}
	time.Sleep(300 * time.Millisecond)
	for _, nd := range nodes {
		nd.p.DropReplies()
	}
	time.Sleep(700 * time.Millisecond)
	for _, nd := range nodes {
		nd.p.Up()
	}
	time.Sleep(300 * time.Millisecond)
	srv.Stop()
	time.Sleep(700 * time.Millisecond)
	srv.Cont()
	time.Sleep(300 * time.Millisecond)
	nodes[0].p.DropReplies()
	time.Sleep(500 * time.Millisecond)
	nodes[0].p.Down()
	time.Sleep(300 * time.Millisecond)
	nodes[0].p.Up()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	for _, nd := range nodes {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		require.NoError(t, nd.l.Close(cctx))
		cancel()
	}
	c := redistest.Client(t)
	ids := hourIDs(start, time.Now())
	var sum int64
	for _, k := range keys {
		s, a := stored(t, c, pfx, k, ids), allowed.get(k)
		assert.GreaterOrEqual(t, s, a, "key %q: the store lost admissions", k)
		assert.LessOrEqual(t, s-a, inDoubt.get(k), "key %q: counted twice beyond the admissions in doubt", k)
		sum += s
	}
	for _, k := range peekKeys {
		assert.Zero(t, stored(t, c, pfx, k, ids), "key %q: only peeked, yet counted", k)
	}
	t.Logf("allowed %d, stored %d: counted twice %d; %d admissions and %d peeks in doubt in %d calls",
		allowed.sum(keys), sum, sum-allowed.sum(keys), inDoubt.sum(keys), peekDoubt.Load(), doubtCalls.Load())
}
