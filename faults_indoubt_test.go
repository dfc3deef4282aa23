package hybridlimit_test

import (
	"context"
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

// The standalone server hangs (SIGSTOP) under async traffic until every
// node holds a batch in doubt, then is killed (SIGKILL) and restarted
// empty. Proven: the batches in doubt at the kill are sent again, unchanged,
// to the empty server and applied once: afterwards the store holds, key by
// key, exactly what was admitted less what the killed server had
// acknowledged; nothing is dropped, nothing stays in doubt, and decisions
// never returned an error.
func TestFaultStandaloneInDoubtThenRestartEmpty(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	var restarting atomic.Int64 // Unix ns when the kill began
	var mu sync.Mutex
	ackedOld := map[string]int64{} // increments the killed server acknowledged
	var nodes []*hybridlimit.Limiter
	for range 3 {
		w := &watched{Store: newRedisStore(t, faultClient(t, addr))}
		w.onPush = func(_, end time.Time, bs []*store.Batch) {
			if r := restarting.Load(); r != 0 && end.UnixNano() >= r {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, b := range bs {
				if b.Status == store.Applied {
					for _, op := range b.Ops {
						ackedOld[op.Key] += op.Delta
					}
				}
			}
		}
		l, err := hybridlimit.New(faultConfig(hybridlimit.ModeAsync, w, pfx, "", 0))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	admitted := newTally(keys)
	var errs atomic.Int64
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range nodes {
		traffic(&wg, 2, stop, func(g, i int) bool {
			k := keys[(g+i)%len(keys)]
			res, err := l.Allow(ctx, k)
			if err != nil {
				errs.Add(1)
				return false
			}
			if res.Allowed {
				admitted.add(k)
			}
			if i%16 == 0 {
				time.Sleep(time.Millisecond)
			}
			return true
		})
	}
	time.Sleep(500 * time.Millisecond)
	srv := redistest.ServerAt(t, addr)
	srv.Stop()
	inDoubt := func() bool {
		for _, l := range nodes {
			if l.Stats().InDoubt == 0 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Second); !inDoubt(); time.Sleep(10 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the nodes hold no batch in doubt")
	}
	doubts := make([]int, len(nodes))
	for i, l := range nodes {
		doubts[i] = l.Stats().InDoubt
	}
	restarting.Store(time.Now().UnixNano())
	srv.Kill() // SIGKILL ends a stopped process too
	srv.Restart()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	closeAll(t, nodes, 10*time.Second)
	end := time.Now()

	assert.Zero(t, errs.Load(), "decisions returned errors")
	for i, l := range nodes {
		st := l.Stats()
		assert.Zero(t, st.Dropped, "node %d dropped increments", i)
		assert.Zero(t, st.InDoubt, "node %d: batches still in doubt", i)
	}
	c := faultClient(t, addr)
	ids := hourIDs(start, end)
	var sum, lost int64
	for _, k := range keys {
		s := stored(t, c, pfx, k, ids)
		assert.Equal(t, admitted.get(k)-ackedOld[k], s, "key %q: admitted %d, acknowledged by the killed server %d", k, admitted.get(k), ackedOld[k])
		sum, lost = sum+s, lost+ackedOld[k]
	}
	t.Logf("batches in doubt at the kill, per node: %v; admitted %d; the restarted server holds %d; lost with the killed server %d",
		doubts, admitted.sum(keys), sum, lost)
}

// The standalone server hangs (SIGSTOP) under async traffic until every
// node holds a batch in doubt and its circuit is open, then resumes
// (SIGCONT): the resumed server runs the calls queued on its connections,
// and the nodes send their batches in doubt again. Proven: every batch is
// applied exactly once, so the store holds exactly what was admitted, key
// by key; decisions never waited on the store nor returned an error.
func TestFaultStandaloneHangAsyncAppliedOnce(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	var nodes []*hybridlimit.Limiter
	for range 3 {
		l, err := hybridlimit.New(faultConfig(hybridlimit.ModeAsync, newRedisStore(t, faultClient(t, addr)), pfx, "", 0))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	admitted := newTally(keys)
	var errs, worst atomic.Int64
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, l := range nodes {
		traffic(&wg, 2, stop, func(g, i int) bool {
			k := keys[(g+i)%len(keys)]
			t0 := time.Now()
			res, err := l.Allow(ctx, k)
			d := time.Since(t0).Nanoseconds()
			for w := worst.Load(); d > w && !worst.CompareAndSwap(w, d); w = worst.Load() {
			}
			if err != nil {
				errs.Add(1)
				return false
			}
			if res.Allowed {
				admitted.add(k)
			}
			if i%16 == 0 {
				time.Sleep(time.Millisecond)
			}
			return true
		})
	}
	time.Sleep(500 * time.Millisecond)
	srv := redistest.ServerAt(t, addr)
	srv.Stop()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n := 0
		for _, l := range nodes {
			if st := l.Stats(); st.InDoubt > 0 && st.StoreFailing {
				n++
			}
		}
		if n == len(nodes) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the nodes hold no batch in doubt")
	}
	time.Sleep(500 * time.Millisecond)
	srv.Cont()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	closeAll(t, nodes, 10*time.Second)
	end := time.Now()

	assert.Zero(t, errs.Load(), "decisions returned errors")
	assert.Less(t, time.Duration(worst.Load()), faultTimeout, "an async decision waited on the store")
	for i, l := range nodes {
		assert.Zero(t, l.Stats().Dropped, "node %d dropped increments", i)
	}
	c := faultClient(t, addr)
	ids := hourIDs(start, end)
	var sum int64
	for _, k := range keys {
		s := stored(t, c, pfx, k, ids)
		assert.Equal(t, admitted.get(k), s, "key %q", k)
		sum += s
	}
	t.Logf("admitted %d, stored %d; slowest decision %v", admitted.sum(keys), sum, time.Duration(worst.Load()))
}
