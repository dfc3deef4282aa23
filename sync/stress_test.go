package syncloop_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// chaosStore wraps a memory store: each call fails unsent, is lost before
// or after the store ran it, or is applied, drawn at random.
type chaosStore struct {
	*store.Memory
	mu  sync.Mutex
	rng *rand.Rand
	p   atomic.Int64 // percent of calls that go wrong
}

var errChaos = errors.New("chaos")

func (c *chaosStore) Push(ctx context.Context, bs []*store.Batch) error {
	c.mu.Lock()
	x, y := c.rng.Int64N(100), c.rng.IntN(4)
	c.mu.Unlock()
	if x >= c.p.Load() {
		return c.Memory.Push(ctx, bs)
	}
	switch y {
	case 0:
		for _, b := range bs {
			b.Status, b.Err = store.Failed, errChaos
		}
	case 1:
		for _, b := range bs {
			b.Status, b.Err = store.InDoubt, errChaos
		}
	default:
		if err := c.Memory.Push(ctx, bs); err != nil {
			return err
		}
		for _, b := range bs {
			b.Status, b.Err = store.InDoubt, errChaos
		}
	}
	return errChaos
}

// Decisions of several rules and costs, on two nodes, race sync cycles
// whose calls fail or lose their answers, evictions, rollovers (on window
// boundaries ±1ns, and across idle spells of several windows), then
// Close; with jitter, decisions come up to 4ms late, after their
// counters moved on. The store ends with every admitted cost once, in its
// window (with jitter: in the key's windows, summed).
func TestStressConservation(t *testing.T) {
	sets := map[string][]local.Spec{
		"sliding+fixed": {
			{Kind: local.Sliding, Limit: 1 << 30, Window: 100 * time.Millisecond},
			{Kind: local.Fixed, Limit: 20, Window: 300 * time.Millisecond},
		},
		"buckets": {
			{Kind: local.Sliding, Limit: 1 << 30, Window: 100 * time.Millisecond},
			{Kind: local.Buckets, Limit: 30, Window: 400 * time.Millisecond, Buckets: 4},
		},
		"three": {
			{Kind: local.Fixed, Limit: 1 << 30, Window: 50 * time.Millisecond},
			{Kind: local.Sliding, Limit: 40, Window: 200 * time.Millisecond},
			{Kind: local.Sliding, Limit: 25, Window: 100 * time.Millisecond},
		},
	}
	for name, specs := range sets {
		for _, share := range []bool{false, true} {
			for _, jitter := range []int64{0, 1} {
				t.Run(fmt.Sprintf("%s/share=%v/jitter=%d", name, share, jitter), func(t *testing.T) {
					stress(t, specs, share, jitter)
				})
			}
		}
	}
}

func stress(t *testing.T, specs []local.Spec, share bool, jitter int64) {
	mock := clock.NewMock()
	mock.Set(t0)
	st := &chaosStore{Memory: store.NewMemory(mock), rng: rand.New(rand.NewPCG(1, 2))}
	st.p.Store(30)
	var rules []local.Rule
	for _, s := range specs {
		rules = append(rules, local.NewRule(s))
	}
	tab := local.NewTable(local.Options{Rules: rules, MaxKeys: 1 << 10, Syncing: true, Share: share, ReadPrev: int64(20 * time.Millisecond), Seed: 1})
	var now atomic.Int64
	now.Store(t0.UnixNano())
	loop := syncloop.New(syncloop.Config{
		Tables: []*local.Table{tab}, Store: st, Prefix: "hl", Node: "n1",
		Now:   now.Load,
		Clock: mock, Rate: 10 * time.Millisecond, Recent: 30 * time.Millisecond, Timeout: time.Second,
	})
	// A second node on the same store, so that the share policy engages.
	tab2 := local.NewTable(local.Options{Rules: rules, MaxKeys: 1 << 10, Syncing: true, Share: share, Seed: 2})
	loop2 := syncloop.New(syncloop.Config{
		Tables: []*local.Table{tab2}, Store: st.Memory, Prefix: "hl", Node: "n2",
		Now:   now.Load,
		Clock: mock, Rate: 10 * time.Millisecond, Recent: 30 * time.Millisecond, Timeout: time.Second,
	})
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d"}
	var mu sync.Mutex
	type ctr struct {
		key  string
		rule int
		id   int64
	}
	admitted := map[ctr]int64{}
	steps := 120
	if testing.Short() {
		steps = 30
	}
	for step := range steps {
		r := rand.New(rand.NewPCG(uint64(step), 7))
		// Sometimes land on a boundary of the shortest window ±1ns,
		// sometimes skip several windows.
		d := int64(r.IntN(40)) * int64(time.Millisecond)
		switch r.IntN(6) {
		case 0:
			w := int64(50 * time.Millisecond)
			d = (now.Load()/w+1)*w - now.Load() + int64(r.IntN(3)) - 1
		case 1:
			d = int64(r.IntN(2000)) * int64(time.Millisecond)
		}
		mock.Add(time.Duration(d))
		at := now.Add(d)
		var wg sync.WaitGroup
		var running atomic.Int32
		running.Store(3)
		for g := range 3 {
			wg.Go(func() {
				defer running.Add(-1)
				r := rand.New(rand.NewPCG(uint64(step), uint64(g)))
				for range 30 {
					k := keys[r.IntN(len(keys))]
					n := 1 + r.Int64N(3)
					tb := tab
					if g == 2 {
						tb = tab2
					}
					at := at - jitter*r.Int64N(5)*int64(time.Millisecond)
					if dd, s := tb.Allow(k, n, at); s == local.Decided && dd.Allowed {
						mu.Lock()
						for i := range rules {
							w, _ := rules[i].Counter()
							id, _ := local.WindowOf(at, int64(w))
							if jitter != 0 {
								id = 0 // the window counted in is not the instant's
							}
							admitted[ctr{k, i, id}] += n
						}
						mu.Unlock()
					}
				}
			})
		}
		for running.Load() > 0 {
			_ = loop.Cycle(ctx)
			_ = loop2.Cycle(ctx)
			tab.Evict(at)
		}
		wg.Wait()
		if step%4 == 3 {
			st.p.Store(0)
			_ = loop.Cycle(ctx)
			st.p.Store(30)
		}
	}
	// Close, the store still failing now and then. (Decisions racing
	// Close are left out: one that a later rule denies after the final
	// flush took its first rule's increment leaves that increment in the
	// store: docs/failures.md, "Close".)
	st.p.Store(20)
	require.NoError(t, loop.Flush(ctx))
	require.NoError(t, loop2.Flush(ctx))
	s1, s2 := tab.Stats(), tab2.Stats()
	require.Zero(t, s1.Unsynced)
	require.Zero(t, s2.Unsynced)
	missing := int64(0)
	for c, n := range admitted {
		var got int64
		if jitter == 0 {
			got = st.Get("hl", store.CounterOf(&rules[c.rule], c.key, c.id))
		} else {
			w, _ := rules[c.rule].Counter()
			first, _ := local.WindowOf(t0.UnixNano(), int64(w))
			last, _ := local.WindowOf(now.Load(), int64(w))
			for id := first - 1; id <= last; id++ {
				got += st.Get("hl", store.CounterOf(&rules[c.rule], c.key, id))
			}
		}
		require.LessOrEqual(t, got, n, "%+v counted twice", c)
		missing += n - got
	}
	require.Equal(t, int64(s1.Dropped+s2.Dropped), missing)
	t.Logf("dropped %d, evicted %d", s1.Dropped, s1.Evicted)
}
