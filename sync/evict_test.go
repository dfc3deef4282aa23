package syncloop_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// Decisions race evictions, sync cycles and rollovers: every step moves
// the clock on by more than two windows, so that every key is idle when
// Evict runs beside the decisions, and some cycles fail or lose their
// answer. However the races fall, the store ends with every admitted
// request once, in its window, and nothing is dropped or left pending.
func TestEvictionRacingDecisionsAndCycles(t *testing.T) {
	f := newFixture(t)
	const w = 100 * time.Millisecond
	f.table = local.NewTable(local.Options{Rules: []local.Rule{local.NewRule(local.Spec{Kind: local.Sliding, Limit: 1 << 30, Window: w})}, MaxKeys: 1 << 10, Syncing: true})
	f.loop = syncloop.New(syncloop.Config{
		Tables: []*local.Table{f.table}, Store: f.st, Prefix: "hl", Node: "n1",
		Now:   func() int64 { return f.mock.Now().UnixNano() },
		Clock: f.mock, Rate: w, Recent: 3 * w, Timeout: time.Second,
	})
	ctx := context.Background()
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	var mu sync.Mutex
	admitted := map[string]map[int64]int64{} // key → window id → admitted
	for _, k := range keys {
		admitted[k] = map[int64]int64{}
	}
	now := f.mock.Now().UnixNano()
	first := now / int64(w)
	evicted := 0
	for step := range 200 { // 47 s: no counter expires meanwhile
		// Every key idle for more than two windows: each Evict below may
		// remove an entry that a decision beside it is using.
		now += int64(2*w + w/3)
		f.mock.Set(time.Unix(0, now))
		var wg sync.WaitGroup
		var running atomic.Int32
		running.Store(2)
		for g := range 2 {
			wg.Go(func() {
				defer running.Add(-1)
				r := rand.New(rand.NewPCG(uint64(step), uint64(g)))
				for range 50 {
					k := keys[r.IntN(len(keys))]
					if d, st := f.table.Allow(k, 1, now); st == local.Decided && d.Allowed {
						mu.Lock()
						admitted[k][now/int64(w)]++
						mu.Unlock()
					}
				}
			})
		}
		for running.Load() > 0 {
			evicted += f.table.Evict(now)
		}
		wg.Wait()
		// A cycle that fails or loses its answer, then one that succeeds
		// (pending increments older than the previous window would
		// otherwise be dropped at the next step's rollover, as documented
		// for a lagging loop).
		switch step % 3 {
		case 1:
			f.st.down.Store(true)
		case 2:
			f.st.doubt.Store(1)
		}
		_ = f.loop.Cycle(ctx)
		f.st.down.Store(false)
		_ = f.loop.Cycle(ctx)
	}
	for range 3 {
		require.NoError(t, f.loop.Cycle(ctx))
	}
	assert.Equal(t, int64(0), f.table.Stats().Unsynced)
	assert.Positive(t, evicted)
	for _, k := range keys {
		for id := first; id <= now/int64(w); id++ {
			assert.Equal(t, admitted[k][id], f.st.Get("hl", store.Counter{Key: k, Window: w.Milliseconds(), ID: id}), "key %s, window %d", k, id)
		}
	}
	assert.Zero(t, f.table.Stats().Dropped)
	t.Logf("%d evictions", evicted)
}
