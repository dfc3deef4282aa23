package hybridlimit_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	_ "github.com/hybridlimit/hybridlimit/internal/redistest"
	_ "github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Where keys leave a node's table, or their windows move, while the sync
// loop still carries their increments: eviction, re-creation, rollovers
// between a take and the store's answer, and Close during a cycle.

// gate wraps a store. arm makes the next Push wait, after signalling that
// it started, until the test releases it; lose makes that many Pushes
// apply nothing and answer every batch in doubt (a reply lost before the
// store ran the call); down fails every Push unsent.
type gate struct {
	store.Store
	mu      sync.Mutex
	entered chan struct{}
	release chan struct{}
	lose    atomic.Int64
	down    atomic.Bool
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
	g.mu.Unlock()
	if entered != nil {
		close(entered)
		<-release
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
	assert.Contains(t, err.Error(), "6 increments of 1 keys may not have reached the store")
}

// redisCount returns the store's counter of key for the window of size w
// holding at.
func redisCount(t *testing.T, c redis.UniversalClient, prefix, key string, w time.Duration, at time.Time) int64 {
	t.Helper()
	k := store.CounterKey(prefix, store.Counter{Key: key, Window: w.Milliseconds(), ID: at.UnixMilli() / w.Milliseconds()})
	v, err := c.Get(context.Background(), k).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return v
}
