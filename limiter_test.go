package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

func TestLocalConcurrentOneKeyAdmitsExactlyTheLimit(t *testing.T) {
	for _, rules := range [][]Rule{
		{{Limit: 1000, Window: time.Hour}},
		{{Limit: 1000, Window: time.Hour}, {Limit: 5000, Window: 24 * time.Hour}, {Limit: 2000, Window: 2 * time.Hour, Type: Fixed}},
	} {
		t.Run(fmt.Sprintf("rules=%d", len(rules)), func(t *testing.T) {
			l, _ := newMockLimiter(t, Config{Rules: rules})
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					for range 100 {
						res, err := l.Allow(context.Background(), "hot")
						if assert.NoError(t, err) && res.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			assert.Equal(t, int64(1000), admitted.Load())
			st := l.Stats()
			assert.Equal(t, uint64(1000), st.Allowed)
			assert.Equal(t, uint64(6400-1000), st.Denied)
		})
	}
}

func TestLocalConcurrentManyKeys(t *testing.T) {
	l, _ := newMockLimiter(t, Config{Rules: []Rule{{Limit: 10, Window: time.Minute}, {Limit: 15, Window: time.Hour}}})
	const keys = 200
	var admitted [keys]atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 40 * keys {
				k := (i + g) % keys
				res, err := l.AllowN(context.Background(), fmt.Sprintf("key-%d", k), 1+int64(i%2))
				if assert.NoError(t, err) && res.Allowed {
					admitted[k].Add(1 + int64(i%2))
				}
			}
		})
	}
	wg.Wait()
	for k := range keys {
		// Costs 1 and 2 under a limit of 10: the key ends with 9 or 10.
		assert.GreaterOrEqual(t, admitted[k].Load(), int64(9), "key %d", k)
		assert.LessOrEqual(t, admitted[k].Load(), int64(10), "key %d", k)
	}
	assert.Equal(t, keys, l.Stats().Keys)
}

func TestCountDeniedPenalty(t *testing.T) {
	s := time.Second
	cfg := Config{Rules: []Rule{{Limit: 2, Window: 10 * s, Type: Fixed}}, CountDenied: true}
	l, mock := newMockLimiter(t, cfg)
	runSteps(t, l, mock, "k", []step{
		{0, 1, true, 1, 0, 0, 0},
		{1 * s, 1, true, 0, 0, 0, 0},
		{2 * s, 1, false, 0, 8 * s, 0, 0},
		{10 * s, 1, true, 1, 0, 0, 0},
	})
	// Sliding: denied retries keep the count up, so a client that keeps
	// hammering stays denied longer than one that waits.
	cfg.Rules = []Rule{{Limit: 2, Window: 10 * s}}
	l, mock = newMockLimiter(t, cfg)
	runSteps(t, l, mock, "k", []step{
		{0, 1, true, 1, 0, 0, 0},
		{0, 1, true, 0, 0, 0, 0},
		// cur 2 → 3 after the penalty: next window, once 3·(10−e)/10 ≤ 1.
		{1 * s, 1, false, 0, 15666666667, 0, 0},
		// prev 3 plus the penalty's 1: no room before the next window.
		{10 * s, 1, false, 0, 10 * s, 0, 0},
	})
}

func TestPeekConsumesNothing(t *testing.T) {
	l, _ := newMockLimiter(t, Config{Rules: []Rule{{Limit: 3, Window: time.Minute}}})
	ctx := context.Background()
	res, err := l.Peek(ctx, "new")
	require.NoError(t, err)
	assert.Equal(t, Result{Allowed: true, Rule: 0, Limit: 3, Window: time.Minute, Remaining: 3}, res)
	assert.Equal(t, 0, l.Stats().Keys, "peeking a new key does not track it")
	for range 3 {
		res, err = l.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	for range 2 {
		res, err = l.Peek(ctx, "k")
		require.NoError(t, err)
		assert.False(t, res.Allowed)
		assert.Equal(t, int64(0), res.Remaining)
		assert.Equal(t, time.Minute+20*time.Second, res.RetryAfter)
	}
	st, err := l.State(ctx, "k", nil)
	require.NoError(t, err)
	assert.Equal(t, []RuleState{{Rule: 0, Limit: 3, Window: time.Minute, Remaining: 0, ResetAfter: 2 * time.Minute}}, st)
	assert.Equal(t, uint64(3), l.Stats().Allowed)
	assert.Equal(t, uint64(0), l.Stats().Denied)
}

func TestWaitFollowsTheClock(t *testing.T) {
	l, mock := newMockLimiter(t, Config{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Fixed}}})
	ctx := context.Background()
	_, err := l.Wait(ctx, "k")
	require.NoError(t, err)
	done := make(chan Result)
	go func() {
		res, err := l.Wait(ctx, "k")
		assert.NoError(t, err)
		done <- res
	}()
	// Advance in steps until the waiter's timer (1s) fires.
	deadline := time.After(10 * time.Second)
	for {
		select {
		case res := <-done:
			assert.True(t, res.Allowed)
			assert.Equal(t, t0.Add(time.Second), mock.Now())
			return
		case <-deadline:
			t.Fatal("Wait did not return")
		default:
			if mock.Now().Before(t0.Add(time.Second)) {
				mock.Add(100 * time.Millisecond)
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	}
}

func TestWaitRespectsContext(t *testing.T) {
	l, _ := newMockLimiter(t, Config{Rules: []Rule{{Limit: 1, Window: time.Hour, Type: Fixed}}})
	ctx := context.Background()
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	short, cancel := context.WithDeadline(ctx, time.Now().Add(time.Second))
	defer cancel()
	_, err = l.Wait(short, "k")
	assert.ErrorContains(t, err, "past the context deadline")
	canceled, cancel2 := context.WithCancel(ctx)
	cancel2()
	_, err = l.Wait(canceled, "k")
	assert.ErrorIs(t, err, context.Canceled)
}

func TestEvictionAfterTwoLongestWindows(t *testing.T) {
	l, mock := newMockLimiter(t, Config{Rules: []Rule{{Limit: 5, Window: time.Second}, {Limit: 50, Window: time.Minute}}})
	ctx := context.Background()
	for i := range 100 {
		_, err := l.Allow(ctx, fmt.Sprint("k", i))
		require.NoError(t, err)
	}
	mock.Add(2 * time.Minute)
	assert.Equal(t, 0, l.Evict(), "idle for exactly two windows: the previous window may still count")
	_, err := l.Allow(ctx, "k0") // k0 stays fresh
	require.NoError(t, err)
	mock.Add(time.Millisecond)
	assert.Equal(t, 99, l.Evict())
	st := l.Stats()
	assert.Equal(t, 1, st.Keys)
	assert.Equal(t, uint64(99), st.Evicted)
	assert.Equal(t, uint64(101), st.Allowed, "decisions of evicted keys stay counted")
}

func TestMaxKeys(t *testing.T) {
	for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
		t.Run(policy.String(), func(t *testing.T) {
			l, mock := newMockLimiter(t, Config{Rules: []Rule{{Limit: 1, Window: time.Second}}, MaxKeys: 10, FailurePolicy: policy})
			ctx := context.Background()
			for i := range 10 {
				res, err := l.Allow(ctx, fmt.Sprint("k", i))
				require.NoError(t, err)
				require.True(t, res.Allowed)
			}
			res, err := l.Allow(ctx, "new")
			require.NoError(t, err)
			assert.True(t, res.Degraded)
			assert.Equal(t, policy == FailOpen, res.Allowed)
			// Tracked keys are still limited.
			res, err = l.Allow(ctx, "k3")
			require.NoError(t, err)
			assert.False(t, res.Allowed)
			assert.False(t, res.Degraded)
			st := l.Stats()
			assert.Equal(t, 10, st.Keys)
			assert.Equal(t, uint64(1), st.Overflow)
			// Once idle keys are evicted, new keys are tracked again.
			mock.Add(3 * time.Second)
			assert.Equal(t, 10, l.Evict())
			res, err = l.Allow(ctx, "new")
			require.NoError(t, err)
			assert.True(t, res.Allowed)
			assert.False(t, res.Degraded)
		})
	}
}

// newNodes returns n limiters sharing one memory store, on one mock clock,
// with background goroutines off: the test drives Sync.
func newNodes(t *testing.T, n int, cfg Config) ([]*Limiter, *store.Memory, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(t0)
	mem := store.NewMemory(mock)
	if cfg.Store == nil {
		cfg.Store = mem
	}
	cfg.Clock = mock
	cfg.Manual = true
	var nodes []*Limiter
	for range n {
		l, err := New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	return nodes, mem, mock
}

func syncAll(t *testing.T, nodes []*Limiter) {
	t.Helper()
	for _, l := range nodes {
		require.NoError(t, l.Sync(context.Background()))
	}
}

func TestAsyncNodesConvergeOnTheClusterTotal(t *testing.T) {
	rules := []Rule{{Limit: 100, Window: time.Minute}}
	nodes, mem, mock := newNodes(t, 3, Config{Rules: rules, Mode: ModeAsync, SyncRate: 100 * time.Millisecond})
	ctx := context.Background()
	for i, l := range nodes {
		for range 10 * (i + 1) { // 10, 20, 30
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, res.Allowed)
		}
	}
	syncAll(t, nodes)
	syncAll(t, nodes) // the first nodes see the later pushes on their next cycle
	for i, l := range nodes {
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, int64(40), res.Remaining, "node %d sees the cluster's 60", i)
	}
	id := t0.UnixMilli() / 60_000
	assert.Equal(t, int64(60), mem.Get("hl", store.Counter{Key: "k", Window: 60_000, ID: id}))

	// Each node can now admit only what the cluster has left (40), until
	// the next sync brings the others' admissions.
	admitted := 0
	for _, l := range nodes {
		for range 50 {
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			if res.Allowed {
				admitted++
			}
		}
	}
	assert.Equal(t, 120, admitted, "without a sync, each node admits the 40 it saw left")
	syncAll(t, nodes)
	syncAll(t, nodes)
	for _, l := range nodes {
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		assert.False(t, res.Allowed)
	}
	assert.Equal(t, int64(180), mem.Get("hl", store.Counter{Key: "k", Window: 60_000, ID: id}))

	// Across the rollover, every node reads the previous window's total
	// from the store: 180 weighs 180·(45/60) = 135 at 15 s in.
	mock.Add(75 * time.Second)
	_, err := nodes[0].Allow(ctx, "k") // rolls node 0 over; denied
	require.NoError(t, err)
	syncAll(t, nodes)
	res, err := nodes[0].Peek(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, 12*time.Second, res.RetryAfter, "180 weighs ≤ 99 from 27 s in")
	assert.Equal(t, 45*time.Second, res.ResetAfter, "the previous window slides out at the end of this one")
	st := nodes[0].Stats()
	assert.Equal(t, int64(0), st.Pending)
	assert.Equal(t, uint64(0), st.Dropped)
}

func TestSynchronousModeIsExactOnTheMemoryStore(t *testing.T) {
	nodes, _, _ := newNodes(t, 4, Config{Rules: []Rule{{Limit: 200, Window: time.Hour}, {Limit: 1000, Window: 24 * time.Hour}}, Mode: ModeSynchronous})
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for _, l := range nodes {
		for range 8 {
			wg.Go(func() {
				for range 50 {
					res, err := l.Allow(context.Background(), "k")
					if assert.NoError(t, err) && res.Allowed {
						admitted.Add(1)
					}
					assert.False(t, res.Degraded)
				}
			})
		}
	}
	wg.Wait()
	assert.Equal(t, int64(200), admitted.Load())
	res, err := nodes[0].Peek(context.Background(), "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, int64(0), res.Remaining)
	assert.Equal(t, 0, res.Rule)
}

// flaky is a store that fails while down is set; it wraps a real store.
type flaky struct {
	store.Store
	down atomic.Bool
}

var errDown = errors.New("store down")

func (f *flaky) Push(ctx context.Context, batches []*store.Batch) error {
	if f.down.Load() {
		for _, b := range batches {
			b.Status, b.Err = store.Failed, errDown
		}
		return nil
	}
	return f.Store.Push(ctx, batches)
}

func (f *flaky) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	if f.down.Load() {
		for _, r := range reqs {
			r.Status, r.Err = store.Failed, errDown
		}
		return nil
	}
	return f.Store.Take(ctx, reqs)
}

func TestFailurePolicies(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSynchronous} {
		for _, policy := range []FailurePolicy{FailOpen, FailClosed} {
			t.Run(mode.String()+"/"+policy.String(), func(t *testing.T) {
				mock := clock.NewMock()
				mock.Set(t0)
				mem := store.NewMemory(mock)
				f := &flaky{Store: mem}
				var seen atomic.Int64
				nodes, _, _ := newNodes(t, 1, Config{Rules: []Rule{{Limit: 10, Window: time.Hour}}, Mode: mode, Store: f, FailurePolicy: policy,
					OnError: func(err error) { seen.Add(1) }})
				l := nodes[0]
				t.Cleanup(func() { f.down.Store(false) }) // before Close flushes
				ctx := context.Background()
				for range 4 {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					require.True(t, res.Allowed)
				}
				require.NoError(t, l.Sync(ctx))
				f.down.Store(true)
				if mode == ModeAsync {
					assert.ErrorIs(t, l.Sync(ctx), errDown)
				}
				admitted := 0
				for range 10 {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err, "a store failure is not the caller's error")
					if res.Allowed {
						admitted++
					}
					if mode == ModeSynchronous || policy == FailClosed {
						assert.True(t, res.Degraded)
					}
				}
				assert.Positive(t, seen.Load(), "OnError saw the failure")
				st := l.Stats()
				assert.True(t, st.StoreFailing)
				assert.ErrorIs(t, st.LastError, errDown)
				if policy == FailClosed {
					assert.Equal(t, 0, admitted)
					return
				}
				assert.Equal(t, 6, admitted, "fail-open decides on the local view: 4 known + 6")
				assert.Equal(t, int64(6), st.Pending, "the 6 wait to be pushed")
				f.down.Store(false)
				require.NoError(t, l.Sync(ctx))
				id := t0.UnixMilli() / 3_600_000
				assert.Equal(t, int64(10), mem.Get("hl", store.Counter{Key: "k", Window: 3_600_000, ID: id}), "the store caught up")
				assert.Equal(t, int64(0), l.Stats().Pending)
				res, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				assert.False(t, res.Allowed)
				assert.False(t, res.Degraded)
			})
		}
	}
}

func TestCloseFlushesPendingIncrements(t *testing.T) {
	nodes, mem, _ := newNodes(t, 2, Config{Rules: []Rule{{Limit: 100, Window: time.Minute}, {Limit: 1000, Window: time.Hour}}, Mode: ModeAsync})
	ctx := context.Background()
	for i, l := range nodes {
		for k := range 5 {
			for range i + 1 {
				_, err := l.Allow(ctx, fmt.Sprint("key", k))
				require.NoError(t, err)
			}
		}
	}
	for _, l := range nodes {
		require.NoError(t, l.Close(ctx))
		require.NoError(t, l.Close(ctx), "Close twice is fine")
	}
	for k := range 5 {
		key := fmt.Sprint("key", k)
		assert.Equal(t, int64(3), mem.Get("hl", store.Counter{Key: key, Window: 60_000, ID: t0.UnixMilli() / 60_000}))
		assert.Equal(t, int64(3), mem.Get("hl", store.Counter{Key: key, Window: 3_600_000, ID: t0.UnixMilli() / 3_600_000}))
	}
}

func TestClockSkewFollowsTheStoreClock(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(t0.Add(59 * time.Second))
	mem := store.NewMemory(mock)
	skewed := &skewClock{Mock: mock, skew: 2 * time.Second} // this node runs 2 s fast
	l, err := New(Config{Rules: []Rule{{Limit: 10, Window: time.Minute, Type: Fixed}}, Mode: ModeAsync, Store: mem, Clock: skewed, Manual: true})
	require.NoError(t, err)
	defer l.Close(context.Background())
	ctx := context.Background()
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, 59*time.Second, res.ResetAfter+60*time.Second-time.Minute, "before measuring, the node's own clock: 1 s before 00:01:01")
	require.NoError(t, l.SyncClock(ctx))
	assert.Equal(t, -2*time.Second, l.Stats().ClockOffset)
	res, err = l.Allow(ctx, "k2")
	require.NoError(t, err)
	assert.Equal(t, time.Second, res.ResetAfter, "after measuring, windows follow the store: 1 s to the minute")
}

type skewClock struct {
	*clock.Mock
	skew time.Duration
}

func (c *skewClock) Now() time.Time { return c.Mock.Now().Add(c.skew) }
