package hybridlimit_test

import (
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
	var acked ackTally // increments the killed server acknowledged
	nodes := asyncNodes(t, 3, addr, &acked, func(st store.Store) hybridlimit.Config {
		return faultConfig(hybridlimit.ModeAsync, st, pfx, "", 0)
	})
	admitted := newTally(keys)
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	decideAll(&wg, nodes, 2, keys, stop, admitted, &errs, nil)
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
	acked.cut.Store(time.Now().UnixNano())
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
		assert.Equal(t, admitted.get(k)-acked.get(k), s, "key %q: admitted %d, acknowledged by the killed server %d", k, admitted.get(k), acked.get(k))
		sum, lost = sum+s, lost+acked.get(k)
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
	nodes := asyncNodes(t, 3, addr, nil, func(st store.Store) hybridlimit.Config {
		return faultConfig(hybridlimit.ModeAsync, st, pfx, "", 0)
	})
	admitted := newTally(keys)
	var errs, worst atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	decideAll(&wg, nodes, 2, keys, stop, admitted, &errs, &worst)
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
