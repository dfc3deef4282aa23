package hybridlimit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Where keys leave a node's table, or their windows move, while the sync
// loop still carries their increments: eviction, re-creation, rollovers
// between a take and the store's answer, and Close during a cycle.

// gate wraps a store. arm makes the next Push wait, after signalling that
// it started, until the test releases it (a Push whose context ended
// meanwhile is applied, and its answer lost); lose makes that many Pushes
// apply nothing and answer every batch in doubt (a reply lost before the
// store ran the call); down fails every Push unsent.
type gate struct {
	store.Store
	mu      sync.Mutex
	entered chan struct{}
	release chan struct{}
	lose    atomic.Int64
	down    atomic.Bool
	late    atomic.Int64    // held Pushes whose context ended meanwhile
	held    context.Context // the context of the Push held last
}

// heldCtx returns the context of the Push held last, nil before one.
func (g *gate) heldCtx() context.Context {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

var errLost = errors.New("reply lost")

func (g *gate) arm() (entered, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.entered, g.release = make(chan struct{}), make(chan struct{})
	return g.entered, g.release
}

func (g *gate) Push(ctx context.Context, bs []*store.Batch) error {
	g.mu.Lock()
	entered, release := g.entered, g.release
	g.entered, g.release = nil, nil
	if entered != nil {
		g.held = ctx
	}
	g.mu.Unlock()
	if entered != nil {
		close(entered)
		<-release
		if ctx.Err() != nil {
			g.late.Add(1)
			// The caller gave up while the call was on its way: the store
			// runs it, and its reply is lost.
			err := g.Store.Push(context.Background(), bs)
			for _, b := range bs {
				b.Status, b.Err = store.InDoubt, ctx.Err()
			}
			return err
		}
	}
	if g.down.Load() {
		for _, b := range bs {
			b.Status, b.Err = store.Failed, errDown
		}
		return nil
	}
	if g.lose.Add(-1) >= 0 {
		for _, b := range bs {
			b.Status, b.Err = store.InDoubt, errLost
		}
		return nil
	}
	return g.Store.Push(ctx, bs)
}

var errDown = errors.New("store down")

// keyLifeNodes returns n Manual async limiters on one mock clock, node 0
// pushing through g (which wraps st), the others straight to st.
func keyLifeNodes(t *testing.T, n int, st store.Store, g *gate, cfg hybridlimit.Config) ([]*hybridlimit.Limiter, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	// An hour boundary ahead of the wall clock: counters written to Redis
	// expire after the mock windows, not before the test reads them.
	mock.Set(time.Now().Truncate(time.Hour).Add(time.Hour))
	cfg.Mode, cfg.Manual, cfg.Clock, cfg.ClockSync = hybridlimit.ModeAsync, true, mock, -1
	if cfg.StoreTimeout == 0 {
		cfg.StoreTimeout = 5 * time.Second
	}
	g.Store = st
	var nodes []*hybridlimit.Limiter
	for i := range n {
		c := cfg
		c.Store = st
		if i == 0 {
			c.Store = g
		}
		l, err := hybridlimit.New(c)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	return nodes, mock
}

// admitN makes n decisions on key at l and requires each admitted.
func admitN(t *testing.T, l *hybridlimit.Limiter, key string, n int) {
	t.Helper()
	for i := range n {
		res, err := l.Allow(context.Background(), key)
		require.NoError(t, err)
		require.True(t, res.Allowed, "decision %d on %q", i, key)
	}
}

// A batch whose answer was lost keeps its increments pending on the node
// (Stats.Pending, Close's error) while the key's counter rolls over into
// later windows, and the store applies them once, to their window, when
// it answers.
func TestInDoubtIncrementsStayPendingAcrossRollovers(t *testing.T) {
	for _, roll := range []int{1, 2, 3} {
		t.Run(time.Duration(roll*int(time.Second)).String(), func(t *testing.T) {
			mem := store.NewMemory(clock.New())
			g := &gate{}
			rule := hybridlimit.Rule{Limit: 100, Window: time.Second}
			nodes, mock := keyLifeNodes(t, 1, mem, g, hybridlimit.Config{Rules: []hybridlimit.Rule{rule}})
			l := nodes[0]
			ctx := context.Background()
			start := mock.Now()
			admitN(t, l, "k", 5)
			g.lose.Store(1)
			require.Error(t, l.Sync(ctx))
			assert.Equal(t, 1, l.Stats().InDoubt)
			assert.Equal(t, int64(5), l.Stats().Pending)
			for r := 1; r <= roll; r++ { // a decision in each later window
				mock.Add(time.Second)
				admitN(t, l, "k", 1)
				assert.Equal(t, int64(5+r), l.Stats().Pending, "the batch in doubt still counts, %d windows later", r)
			}
			require.NoError(t, l.Sync(ctx)) // answered: applied once
			// The key's group got no new batch while one was in doubt: the
			// later decisions wait for the next cycle.
			assert.Equal(t, int64(roll), l.Stats().Pending)
			assert.Equal(t, int64(5), mem.Get(hybridlimit.DefaultPrefix, store.Counter{Key: "k", Window: 1000, ID: start.UnixMilli() / 1000}))
			require.NoError(t, l.Sync(ctx))
			assert.Equal(t, int64(0), l.Stats().Pending)
			assert.Equal(t, uint64(0), l.Stats().Dropped)
			for r := 1; r <= roll; r++ {
				at := start.Add(time.Duration(r) * time.Second)
				assert.Equal(t, int64(1), mem.Get(hybridlimit.DefaultPrefix, store.Counter{Key: "k", Window: 1000, ID: at.UnixMilli() / 1000}), "window %d", r)
			}
		})
	}
}

// Close counts the increments of a batch still in doubt, however many
// windows the key's counter moved on since it was sent.
func TestCloseCountsInDoubtIncrementsAcrossRollovers(t *testing.T) {
	g := &gate{}
	nodes, mock := keyLifeNodes(t, 1, store.NewMemory(clock.New()), g, hybridlimit.Config{Rules: []hybridlimit.Rule{{Limit: 100, Window: time.Second}}})
	l := nodes[0]
	admitN(t, l, "k", 5)
	g.lose.Store(1 << 40) // every reply lost from now on
	require.Error(t, l.Sync(context.Background()))
	mock.Add(2 * time.Second)
	admitN(t, l, "k", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := l.Close(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "6 increments (per rule) of 1 keys may not have reached the store")
}

// redisKeyLife returns a Redis client and store and a fresh prefix.
func redisKeyLife(t *testing.T) (redis.UniversalClient, store.Store, string) {
	t.Helper()
	c := redistest.Client(t)
	return c, storetest.Redis(t, c), redistest.Prefix(t)
}

// Three nodes on one Redis decide on keys that node 0 evicts and creates
// again: while still queued for a cycle, while a batch carrying them is in
// doubt (not evicted then), and while the table is full. The store counts
// every admitted request once, in its window.
func TestRedisEvictedKeysCountedOnce(t *testing.T) {
	c, st, pfx := redisKeyLife(t)
	g := &gate{}
	const w = time.Second
	nodes, mock := keyLifeNodes(t, 3, st, g, hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 1000, Window: w}}, Prefix: pfx, MaxKeys: 2,
	})
	ctx := context.Background()
	syncAllNodes := func() {
		for range 2 {
			for _, l := range nodes {
				require.NoError(t, l.Sync(ctx))
			}
		}
	}
	want := map[string]map[time.Time]int64{"a": {}, "b": {}}
	decide := func(i int, key string, n int) {
		admitN(t, nodes[i], key, n)
		want[key][mock.Now().Truncate(w)] += int64(n)
	}
	check := func(when string) {
		t.Helper()
		for key, byWin := range want {
			for win, n := range byWin {
				assert.Equal(t, n, counter(t, c, pfx, key, w, win), "%s: key %q, window %v", when, key, win)
			}
		}
	}

	// Queued for a cycle when evicted: node 0 syncs, and a key decided on
	// within the last three sync periods stays queued to read the others.
	for i := range nodes {
		decide(i, "a", i+1)
	}
	syncAllNodes()
	mock.Add(3 * w)
	assert.Equal(t, 1, nodes[0].Evict(), "idle for three windows, nothing unacknowledged")
	decide(0, "a", 4) // a fresh entry
	decide(1, "a", 2)
	syncAllNodes()
	check("re-created after eviction")
	assert.Equal(t, int64(0), nodes[0].Stats().Pending)

	// A batch in doubt holds its key on the node until the store answers.
	decide(0, "b", 3)
	g.lose.Store(1)
	require.Error(t, nodes[0].Sync(ctx))
	mock.Add(3 * w)
	assert.Equal(t, 1, nodes[0].Evict(), "only a, idle again; b waits for its answer")
	assert.Equal(t, int64(3), nodes[0].Stats().Pending)
	require.NoError(t, nodes[0].Sync(ctx))
	check("answered after the in-doubt batch")
	assert.Equal(t, int64(0), nodes[0].Stats().Pending)

	// The table full (b and a): a new key is decided untracked, and never
	// pushed, until eviction makes room; tracked again, it is pushed as
	// usual.
	decide(0, "a", 1)
	res, err := nodes[0].Allow(ctx, "c")
	require.NoError(t, err)
	assert.True(t, res.Allowed && res.Degraded, "the table holds MaxKeys: FailOpen, untracked")
	want["c"] = map[time.Time]int64{mock.Now().Truncate(w): 0}
	syncAllNodes()
	check("an untracked key")
	mock.Add(3 * w)
	assert.Equal(t, 2, nodes[0].Evict())
	decide(0, "c", 2)
	decide(0, "b", 2)
	syncAllNodes()
	check("after the table was full")
	for _, l := range nodes {
		assert.Equal(t, int64(0), l.Stats().Pending)
		assert.Equal(t, uint64(0), l.Stats().Dropped)
	}
}

// The key's counter rolls over once, or by two windows, between the take
// of a push and the store's answer (the push is held while a decision in
// a later window runs): the store counts every increment once, in its own
// window, and both nodes then agree on the key's state.
func TestRedisRolloverBetweenTakeAndSettle(t *testing.T) {
	for _, roll := range []int{1, 2} {
		t.Run(fmt.Sprint(roll), func(t *testing.T) {
			c, st, pfx := redisKeyLife(t)
			g := &gate{}
			const w = time.Second
			rule := hybridlimit.Rule{Limit: 1000, Window: w}
			nodes, mock := keyLifeNodes(t, 2, st, g, hybridlimit.Config{Rules: []hybridlimit.Rule{rule}, Prefix: pfx})
			ctx := context.Background()
			start := mock.Now()
			admitN(t, nodes[0], "k", 5)
			admitN(t, nodes[1], "k", 4)
			require.NoError(t, nodes[1].Sync(ctx))
			entered, release := g.arm()
			done := make(chan error, 1)
			go func() { done <- nodes[0].Sync(ctx) }()
			<-entered // taken, not answered
			mock.Add(time.Duration(roll) * w)
			admitN(t, nodes[0], "k", 3)
			admitN(t, nodes[1], "k", 2)
			close(release)
			require.NoError(t, <-done)
			for range 2 {
				for _, l := range nodes {
					require.NoError(t, l.Sync(ctx))
				}
			}
			assert.Equal(t, int64(9), counter(t, c, pfx, "k", w, start))
			assert.Equal(t, int64(5), counter(t, c, pfx, "k", w, mock.Now()))
			for i, l := range nodes {
				assert.Equal(t, int64(0), l.Stats().Pending, "node %d", i)
			}
			a, err := nodes[0].State(ctx, "k", nil)
			require.NoError(t, err)
			b, err := nodes[1].State(ctx, "k", nil)
			require.NoError(t, err)
			assert.Equal(t, b[0].Remaining, a[0].Remaining, "both nodes see the same counts")
		})
	}
}

// Close while a sync cycle of the same limiter waits on the store: the
// final flush waits for the cycle, then pushes what is left, and the store
// holds every admitted request once, whether the cycle's call was applied
// or its answer was lost.
func TestRedisCloseDuringACycle(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("lost=%v", lost), func(t *testing.T) {
			c, st, pfx := redisKeyLife(t)
			g := &gate{}
			const w = time.Minute
			nodes, mock := keyLifeNodes(t, 1, st, g, hybridlimit.Config{Rules: []hybridlimit.Rule{{Limit: 1000, Window: w}}, Prefix: pfx})
			l := nodes[0]
			ctx := context.Background()
			admitN(t, l, "k1", 5)
			admitN(t, l, "k2", 3)
			if lost {
				g.lose.Store(1)
			}
			entered, release := g.arm()
			synced := make(chan error, 1)
			go func() { synced <- l.Sync(ctx) }()
			<-entered
			admitN(t, l, "k1", 2) // after the cycle's take
			closed := make(chan error, 1)
			go func() { closed <- l.Close(ctx) }()
			k2 := int64(3)
			require.Eventually(t, func() bool {
				res, err := l.Allow(ctx, "k2")
				if err == nil && res.Allowed {
					k2++ // before Close began
				}
				return errors.Is(err, hybridlimit.ErrClosed)
			}, 5*time.Second, time.Millisecond, "Close has begun")
			select {
			case err := <-closed:
				t.Fatalf("Close returned %v while a cycle waits on the store", err)
			default:
			}
			close(release)
			if err := <-synced; !lost {
				require.NoError(t, err)
			}
			require.NoError(t, <-closed)
			assert.Equal(t, int64(7), counter(t, c, pfx, "k1", w, mock.Now()))
			assert.Equal(t, k2, counter(t, c, pfx, "k2", w, mock.Now()))
			assert.Equal(t, int64(0), l.Stats().Pending)
		})
	}
}

// Close while the background sync loop's cycle waits on the store: Close
// cancels the cycle, whose call the store still runs (its answer lost),
// and the final flush sends that batch again: the store counts it once.
func TestRedisCloseCancelsTheBackgroundCycle(t *testing.T) {
	c, st, pfx := redisKeyLife(t)
	g := &gate{Store: st}
	mock := clock.NewMock()
	mock.Set(time.Now().Truncate(time.Hour).Add(time.Hour))
	const w = time.Minute
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 1000, Window: w}}, Mode: hybridlimit.ModeAsync,
		Store: g, Prefix: pfx, Clock: mock, ClockSync: -1, ClockResolution: -1,
		SyncRate: 100 * time.Millisecond, StoreTimeout: 5 * time.Second,
	})
	require.NoError(t, err)
	ctx := context.Background()
	admitN(t, l, "k", 5)
	entered, release := g.arm()
	// Until the first cycle is due (the loop may not have set its timer
	// yet when the clock first moves).
	for waiting := true; waiting; {
		select {
		case <-entered:
			waiting = false
		case <-time.After(time.Millisecond):
			mock.Add(10 * time.Millisecond)
		}
	}
	admitN(t, l, "k", 2) // after the cycle's take
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctx) }()
	require.Eventually(t, func() bool {
		_, err := l.Allow(ctx, "other")
		return errors.Is(err, hybridlimit.ErrClosed)
	}, 5*time.Second, time.Millisecond, "Close has begun")
	// Close refuses decisions first and cancels the cycle after: release
	// the held call only once its context has ended.
	require.Eventually(t, func() bool { return g.heldCtx().Err() != nil }, 5*time.Second, time.Millisecond, "Close canceled the cycle's call")
	close(release)
	require.NoError(t, <-closed)
	assert.Equal(t, int64(1), g.late.Load(), "the store ran the canceled call")
	assert.Equal(t, int64(7), counter(t, c, pfx, "k", w, mock.Now()))
	assert.Equal(t, int64(0), l.Stats().Pending)
}

// A token or leaky bucket whose burst refills over more than two windows
// is not full again after two idle windows: evicting its key then would
// forget the arrival time and admit a whole burst at once. Eviction keeps
// such a key until its bucket is full.
func TestEvictionKeepsABucketUntilItRefills(t *testing.T) {
	for _, typ := range []hybridlimit.Algorithm{hybridlimit.TokenBucket, hybridlimit.LeakyBucket} {
		for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync} {
			t.Run(fmt.Sprint(typ, "/", mode), func(t *testing.T) {
				mock := clock.NewMock()
				mock.Set(time.Now().Truncate(time.Hour))
				cfg := hybridlimit.Config{
					// One per second, bursts of 10: 10 s to refill.
					Rules: []hybridlimit.Rule{{Limit: 1, Window: time.Second, Type: typ, Burst: 10}},
					Mode:  mode, Clock: mock, Manual: true, ClockSync: -1,
				}
				if mode == hybridlimit.ModeAsync {
					cfg.Store = store.NewMemory(mock)
				}
				l, err := hybridlimit.New(cfg)
				require.NoError(t, err)
				defer func() { _ = l.Close(context.Background()) }()
				ctx := context.Background()
				admitN(t, l, "k", 10)
				require.NoError(t, l.Sync(ctx))
				mock.Add(2500 * time.Millisecond)
				assert.Equal(t, 0, l.Evict(), "7.5 s from full")
				admitted := 0
				for range 10 {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed {
						admitted++
					}
				}
				assert.Equal(t, 2, admitted, "2.5 s refill two requests")
				require.NoError(t, l.Sync(ctx))
				mock.Add(7500 * time.Millisecond)
				assert.Equal(t, 0, l.Evict(), "2 s from full")
				mock.Add(2 * time.Second)
				assert.Equal(t, 1, l.Evict(), "full again, and idle")
			})
		}
	}
}

// CountDenied charges a bucket for denied requests too: a key charged far
// ahead stays denied after two idle windows, and so stays tracked.
func TestEvictionKeepsACountDeniedBucket(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Now().Truncate(time.Hour))
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 1, Window: time.Second, Type: hybridlimit.TokenBucket}},
		Clock: mock, Manual: true, CountDenied: true,
	})
	require.NoError(t, err)
	defer func() { _ = l.Close(context.Background()) }()
	ctx := context.Background()
	for range 100 { // 100 s of charges
		_, err := l.Allow(ctx, "k")
		require.NoError(t, err)
	}
	mock.Add(3 * time.Second)
	assert.Equal(t, 0, l.Evict())
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "still charged 96 s ahead")
}
