package syncloop_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// routed is a memory store whose keys go to two servers (a store.Router,
// as a Redis Cluster's masters): key "a" to server 1, whose calls wait
// while hang is open (a hung master, until the call's deadline), the
// others to server 0. A call to server s takes delay[s] at least.
type routed struct {
	*store.Memory
	delay   [2]time.Duration
	hang    chan struct{}
	aCalls  atomic.Int64
	others  atomic.Int64
	timeout atomic.Int64 // calls of "a" that ended at their deadline
}

func (r *routed) Route(_, key string) int {
	if key == "a" {
		return 1
	}
	return 0
}

func (r *routed) Push(ctx context.Context, bs []*store.Batch) error {
	if bs[0].Ops[0].Key != "a" {
		r.others.Add(1)
		time.Sleep(r.delay[0])
		return r.Memory.Push(ctx, bs)
	}
	r.aCalls.Add(1)
	time.Sleep(r.delay[1])
	select {
	case <-r.hang:
	case <-ctx.Done():
		r.timeout.Add(1)
		return ctx.Err() // sent, unanswered: in doubt
	}
	return r.Memory.Push(ctx, bs)
}

// flightFixture is a loop on a routed store, on the real clock: a cycle
// waits for a hung server's call at most one Rate.
func flightFixture(t *testing.T, timeout time.Duration) (*routed, *local.Table, *syncloop.Loop, func(string) int64) {
	t.Helper()
	clk := clock.New()
	st := &routed{Memory: store.NewMemory(clk), hang: make(chan struct{})}
	table := local.NewTable(local.Options{Rules: []local.Rule{local.NewRule(local.Spec{Kind: local.Fixed, Limit: 1_000_000, Window: time.Hour})}, MaxKeys: 1 << 10, Syncing: true})
	loop := syncloop.New(syncloop.Config{
		Tables: []*local.Table{table}, Store: st, Prefix: "hl", Node: "n1",
		Now:   func() int64 { return time.Now().UnixNano() },
		Clock: clk, Rate: 20 * time.Millisecond, Timeout: timeout,
	})
	total := func(key string) int64 {
		return st.Get("hl", store.Counter{Key: key, Window: 3_600_000, ID: time.Now().UnixMilli() / 3_600_000})
	}
	return st, table, loop, total
}

func admitEach(t *testing.T, table *local.Table, n int, keys ...string) {
	t.Helper()
	for _, k := range keys {
		for range n {
			_, st := table.Allow(k, 1, time.Now().UnixNano())
			require.Equal(t, local.Decided, st)
		}
	}
}

// A hung server holds up only its own keys: the cycle stops waiting for
// its call after one Rate, the other server's keys sync at every cycle,
// and the hung server's groups get no new batch until its call returns;
// then everything is applied exactly once.
func TestAHungServerHoldsOnlyItsGroups(t *testing.T) {
	st, table, loop, total := flightFixture(t, 5*time.Second)
	ctx := context.Background()
	admitEach(t, table, 2, "a", "b")
	start := time.Now()
	require.NoError(t, loop.Cycle(ctx))
	assert.Less(t, time.Since(start), time.Second, "the cycle waited for the hung call")
	assert.Equal(t, int64(2), total("b"), "the other server's key synced")
	admitEach(t, table, 3, "a", "b")
	require.NoError(t, loop.Cycle(ctx))
	assert.Equal(t, int64(5), total("b"), "and syncs at every cycle")
	assert.Equal(t, int64(1), st.aCalls.Load(), "no second batch for a group whose call is under way")
	assert.Zero(t, total("a"))
	close(st.hang)
	require.Eventually(t, func() bool {
		require.NoError(t, loop.Cycle(ctx))
		return total("a") == 5
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, loop.Cycle(ctx))
	assert.Equal(t, int64(5), total("a"), "applied once")
	assert.Equal(t, int64(5), total("b"))
	assert.Equal(t, int64(0), table.Stats().Unsynced)
}

// A hung call that ends at its deadline is in doubt once it lands: it is
// sent again, unchanged, and applied once.
func TestAHungCallInDoubtIsSentAgain(t *testing.T) {
	st, table, loop, total := flightFixture(t, 100*time.Millisecond)
	ctx := context.Background()
	admitEach(t, table, 2, "a", "b")
	require.NoError(t, loop.Cycle(ctx))
	require.Eventually(t, func() bool { return st.timeout.Load() == 1 }, 5*time.Second, 5*time.Millisecond)
	admitEach(t, table, 1, "a")
	// A later cycle lands the call, in doubt, and the next sends its
	// batch again (to time out again while the server hangs).
	require.Eventually(t, func() bool {
		_ = loop.Cycle(ctx)
		return st.aCalls.Load() >= 2
	}, 5*time.Second, 10*time.Millisecond)
	assert.Zero(t, total("a"))
	close(st.hang)
	require.Eventually(t, func() bool {
		_ = loop.Cycle(ctx)
		return total("a") == 3
	}, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, int64(3), total("a"), "the batch in doubt applied once, then the new increment")
	assert.Equal(t, int64(2), total("b"))
}

// Close's flush waits for a call under way, then pushes what its group
// holds since.
func TestFlushWaitsForAHungCall(t *testing.T) {
	st, table, loop, total := flightFixture(t, 5*time.Second)
	ctx := context.Background()
	admitEach(t, table, 2, "a", "b")
	require.NoError(t, loop.Cycle(ctx))
	admitEach(t, table, 1, "a", "b")
	go func() {
		time.Sleep(100 * time.Millisecond)
		close(st.hang)
	}()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, loop.Flush(fctx))
	assert.Equal(t, int64(3), total("a"))
	assert.Equal(t, int64(3), total("b"))
}

// CycleAll (Limiter.Sync) waits for the calls an earlier cycle stopped
// waiting for, and for each of its own: when it returns, every key's
// increments are in the store, the hung server's too once it answers.
func TestCycleAllWaitsForEveryCall(t *testing.T) {
	st, table, loop, total := flightFixture(t, 5*time.Second)
	ctx := context.Background()
	admitEach(t, table, 2, "a", "b")
	require.NoError(t, loop.Cycle(ctx))
	assert.Zero(t, total("a"), "the cycle did not wait for the hung call")
	admitEach(t, table, 1, "a", "b")
	time.AfterFunc(100*time.Millisecond, func() { close(st.hang) })
	require.NoError(t, loop.CycleAll(ctx))
	assert.Equal(t, int64(3), total("a"), "the earlier call landed, then the group's new batch went out")
	assert.Equal(t, int64(3), total("b"))
	assert.Equal(t, int64(0), table.Stats().Unsynced)
	assert.Equal(t, int64(2), st.aCalls.Load())
	st.delay[1] = 100 * time.Millisecond // 5 Rates: Cycle would not wait
	admitEach(t, table, 1, "a", "b")
	require.NoError(t, loop.CycleAll(ctx))
	assert.Equal(t, int64(4), total("a"), "its own call landed")
	assert.Equal(t, int64(4), total("b"))
}

// A large cycle is no hang: when the first call to return took more than
// half a Rate, the cycle waits for the others until twice its latency,
// and lands them all.
func TestALargeCycleWaitsForEveryServer(t *testing.T) {
	st, table, loop, total := flightFixture(t, 5*time.Second)
	close(st.hang)
	st.delay = [2]time.Duration{100 * time.Millisecond, 120 * time.Millisecond} // both > Rate (20 ms)
	ctx := context.Background()
	admitEach(t, table, 2, "a", "b")
	require.NoError(t, loop.Cycle(ctx))
	assert.Equal(t, int64(2), total("a"), "the slower server's call landed in the cycle")
	assert.Equal(t, int64(2), total("b"))
	assert.Equal(t, int64(0), table.Stats().Unsynced)
}

// A store with many groups (a Redis Cluster's 16,384 hash slots) gets its
// keys in chunks of 65,536 entries once a chunk of 4096 fell in more than
// 1024 groups, so that a batch holds several keys; a store with few groups
// (one server's lanes) in chunks of 4096. A cycle and the final flush
// push every key.
func TestManyGroupsWidenChunks(t *testing.T) {
	keys := make([]string, 66_000)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	for _, tc := range []struct {
		name  string
		slots bool
		flush bool
		calls int64
	}{
		{"16384 groups", true, false, 2}, // 4096, then 61,904
		{"16 groups", false, false, 17},  // 4096 at a time
		{"16384 groups, flush", true, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.New()
			mem := store.NewMemory(clk)
			st := &countedStore{Memory: mem, slots: tc.slots}
			table := local.NewTable(local.Options{Rules: []local.Rule{local.NewRule(local.Spec{Kind: local.Fixed, Limit: 10, Window: time.Hour})}, MaxKeys: 1 << 17, Syncing: true})
			loop := syncloop.New(syncloop.Config{
				Tables: []*local.Table{table}, Store: st, Prefix: "hl", Node: "n1",
				Now:   func() int64 { return time.Now().UnixNano() },
				Clock: clk, Rate: time.Second, Timeout: 10 * time.Second,
			})
			for _, k := range keys {
				table.Allow(k, 1, time.Now().UnixNano())
			}
			if tc.flush {
				require.NoError(t, loop.Flush(context.Background()))
			} else {
				require.NoError(t, loop.CycleAll(context.Background()))
			}
			assert.Equal(t, tc.calls, st.pushes.Load(), "Push calls for %d keys", len(keys))
			id := time.Now().UnixMilli() / 3_600_000
			missing := 0
			for _, k := range keys {
				if mem.Get("hl", store.Counter{Key: k, Window: 3_600_000, ID: id}) != 1 {
					missing++
				}
			}
			assert.Zero(t, missing, "keys whose counter is not 1")
		})
	}
}

// countedStore is a memory store that counts its Push calls, and groups
// keys by hash slot when slots is set.
type countedStore struct {
	*store.Memory
	slots  bool
	pushes atomic.Int64
}

func (c *countedStore) Group(key string) int {
	if c.slots {
		return store.Slot(key)
	}
	return c.Memory.Group(key)
}

func (c *countedStore) Push(ctx context.Context, bs []*store.Batch) error {
	c.pushes.Add(1)
	return c.Memory.Push(ctx, bs)
}
