package hybridlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// The standalone server is SIGKILLed under async traffic and restarted a
// second later, empty (no persistence). Proven: decisions go on (FailOpen)
// with no caller error; after the restart the store holds exactly what was
// admitted less what the dead server had acknowledged (so everything in
// doubt or pending at the kill is applied once, when sent again), which
// lies between what was admitted after the kill and everything admitted;
// nothing is dropped; Close flushes everything.
func TestFaultStandaloneKillRestartEmpty(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	var acked ackTally // increments the killed server acknowledged
	nodes := asyncNodes(t, 3, addr, &acked, func(st store.Store) hybridlimit.Config {
		return hybridlimit.Config{Mode: hybridlimit.ModeAsync, Store: st, SyncRate: 20 * time.Millisecond,
			StoreTimeout: faultTimeout, Prefix: pfx, Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}}
	})
	admitted := newTally(keys)
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	decideAll(&wg, nodes, 4, keys, stop, admitted, &errs, nil)
	time.Sleep(time.Second)
	srv := redistest.ServerAt(t, addr)
	srv.Kill()
	atKill := admitted.sum(keys)
	time.Sleep(time.Second)
	duringOutage := admitted.sum(keys) - atKill
	failing := 0
	for _, l := range nodes {
		if st := l.Stats(); st.StoreFailing && st.Pending > 0 {
			failing++
		}
	}
	acked.cut.Store(time.Now().UnixNano())
	srv.Restart()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	closeAll(t, nodes, 10*time.Second)
	end := time.Now()

	assert.Zero(t, errs.Load(), "decisions returned errors")
	assert.Positive(t, duringOutage, "decisions went on while the server was dead")
	assert.Equal(t, len(nodes), failing, "every node saw the store fail and kept its increments")
	for i, l := range nodes {
		assert.Zero(t, l.Stats().Dropped, "node %d dropped increments", i)
	}
	c := faultClient(t, addr)
	ids := hourIDs(start, end)
	var sum, lost int64
	for _, k := range keys {
		s := stored(t, c, pfx, k, ids)
		assert.Equal(t, admitted.get(k)-acked.get(k), s, "key %q: admitted %d, acknowledged by the killed server %d", k, admitted.get(k), acked.get(k))
		sum, lost = sum+s, lost+acked.get(k)
	}
	all := admitted.sum(keys)
	assert.GreaterOrEqual(t, sum, all-atKill, "the store lacks increments admitted after the kill")
	assert.LessOrEqual(t, sum, all)
	t.Logf("admitted %d (%d before the kill, %d while the server was dead); the restarted server holds %d; lost with the killed server %d",
		all, atKill, duringOutage, sum, lost)
}

// The standalone server hangs (SIGSTOP) for 3 s under synchronous traffic
// from 48 goroutines, then resumes (SIGCONT). Proven: during the hang
// decisions fail over to the FailurePolicy fast (the store's circuit
// breaker), at a rate compared with a local-mode limiter's on the same
// goroutines in the same run; and afterwards the store's counters equal
// the Allowed results but for requests in doubt: a request sent during the
// hang reaches the resumed server past its deadline and changes nothing,
// and the increments the sync loop pushed during the hang are applied
// once, but a request the server ran just before it stopped, whose reply
// it had not written yet, is in doubt, decided again by the FailurePolicy
// and so counted twice: at most the requests in doubt that were sent
// before the hang or after it (on a loaded machine a round trip outside
// the hang can outlast the client's timeout), none of those sent during
// it.
func TestFaultStandaloneHangSynchronous(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	const goroutines = 48
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	rules := []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}
	ctx := context.Background()

	// decide runs the goroutines on l until stop and counts decisions;
	// every decision is timed into lat (max, ns).
	run := func(l *hybridlimit.Limiter, allowed *tally, stop <-chan struct{}, n, worst *atomic.Int64) *sync.WaitGroup {
		var wg sync.WaitGroup
		traffic(&wg, goroutines, stop, func(g, i int) bool {
			k := keys[(g+i)%len(keys)]
			t0 := time.Now()
			res, err := l.Allow(ctx, k)
			d := time.Since(t0).Nanoseconds()
			if err != nil {
				t.Errorf("Allow: %v", err)
				return false
			}
			n.Add(1)
			for w := worst.Load(); d > w && !worst.CompareAndSwap(w, d); w = worst.Load() {
			}
			if res.Allowed && allowed != nil {
				allowed.add(k)
			}
			return true
		})
		return &wg
	}

	// The local mode's rate, same goroutines and keys.
	local, err := hybridlimit.New(hybridlimit.Config{Rules: rules})
	require.NoError(t, err)
	var localN, localWorst atomic.Int64
	stop := make(chan struct{})
	wg := run(local, nil, stop, &localN, &localWorst)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	require.NoError(t, local.Close(ctx))
	localRate := float64(localN.Load())

	// Requests in doubt that were not sent during the hang: those sent
	// before the server stopped, which it may have run, and those sent
	// once it resumed (less a deadline), which a loaded machine may answer
	// after the client's timeout. A request sent during the hang reaches
	// the server past its deadline and counts for nothing.
	inDoubt := newTally(keys)
	var stopped, resumed atomic.Int64 // Unix ns, once Stop returned; before Cont, less StoreTimeout/2
	w := &watched{Store: newRedisStore(t, faultClient(t, addr))}
	w.onTake = func(start, _ time.Time, rs []*store.TakeRequest) {
		if s, r := stopped.Load(), resumed.Load(); s != 0 && start.UnixNano() > s && (r == 0 || start.UnixNano() < r) {
			return
		}
		for _, r := range rs {
			if r.Status == store.InDoubt {
				inDoubt.add(r.Key)
			}
		}
	}
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: w,
		StoreTimeout: faultTimeout, Prefix: pfx, Rules: rules})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	for _, k := range keys {
		_, err := l.Peek(ctx, k) // connections open, script cached
		require.NoError(t, err)
	}
	allowed := newTally(keys)
	var n, worst, hangWorst atomic.Int64
	stop = make(chan struct{})
	start := time.Now()
	wg = run(l, allowed, stop, &n, &worst)
	time.Sleep(500 * time.Millisecond)
	before := n.Load()
	beforeRate := float64(before) / time.Since(start).Seconds()
	srv := redistest.ServerAt(t, addr)
	srv.Stop()
	stopped.Store(time.Now().UnixNano())
	hangStart, atStop := time.Now(), n.Load()
	worst.Store(0)
	time.Sleep(3 * time.Second)
	hang := time.Since(hangStart)
	hangN := n.Load() - atStop
	hangWorst.Store(worst.Load())
	resumed.Store(time.Now().Add(-faultTimeout / 2).UnixNano())
	srv.Cont()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	st := l.Stats()
	require.NoError(t, l.Close(ctx))
	end := time.Now()

	hangRate := float64(hangN) / hang.Seconds()
	t.Logf("decisions/s with %d goroutines: local mode %.0f; synchronous before the hang %.0f, during the 3 s hang %.0f (%.1f%% of local; worst decision %v); degraded %d",
		goroutines, localRate, beforeRate, hangRate, 100*hangRate/localRate, time.Duration(hangWorst.Load()).Round(time.Millisecond), st.Degraded)
	assert.Greater(t, hangRate, localRate/50, "decisions during the hang are not fast")
	// Not compared with beforeRate: two rates measured seconds apart on a
	// shared machine move with its load (a loaded run measured 17k/s
	// during the hang against 24k/s before it), not with the code.
	assert.Greater(t, hangN, int64(100*goroutines), "decisions go on during the hang")
	c := faultClient(t, addr)
	ids := hourIDs(start, end)
	var sum int64
	for _, k := range keys {
		s, a := stored(t, c, pfx, k, ids), allowed.get(k)
		assert.GreaterOrEqual(t, s, a, "key %q: the store lost admissions", k)
		assert.LessOrEqual(t, s-a, inDoubt.get(k), "key %q: counted twice beyond the requests in doubt sent outside the hang", k)
		sum += s
	}
	t.Logf("allowed %d, stored %d (counted twice: %d); requests in doubt sent outside the hang: %d", allowed.sum(keys), sum, sum-allowed.sum(keys), inDoubt.sum(keys))
}
