package syncloop_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
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

var t0 = time.Unix(1_800_000_000, 0) // a minute boundary

// faulty wraps a memory store: while down, every call fails unsent; with
// doubt > 0, that many pushes are applied but answered as lost; badGroup,
// when set, fails the batches of one group.
type faulty struct {
	*store.Memory
	down     atomic.Bool
	doubt    atomic.Int64
	badGroup atomic.Int64 // group+1, 0 for none
	pushes   atomic.Int64
	hold     chan struct{} // when set, Push waits for it to close
}

var errDown = errors.New("down")

func (f *faulty) Push(ctx context.Context, bs []*store.Batch) error {
	f.pushes.Add(1)
	if f.hold != nil {
		<-f.hold
	}
	if f.down.Load() {
		for _, b := range bs {
			b.Status, b.Err = store.Failed, errDown
		}
		return nil
	}
	var ok []*store.Batch
	for _, b := range bs {
		if g := f.badGroup.Load(); g != 0 && b.Group == int(g-1) {
			b.Status, b.Err = store.Failed, errDown
			continue
		}
		ok = append(ok, b)
	}
	err := f.Memory.Push(ctx, ok)
	if f.doubt.Add(-1) >= 0 {
		for _, b := range ok {
			b.Status, b.Err = store.InDoubt, errors.New("reply lost")
		}
	}
	return err
}

func (f *faulty) Time(ctx context.Context) (time.Time, error) {
	if f.down.Load() {
		return time.Time{}, errDown
	}
	return f.Memory.Time(ctx)
}

type fixture struct {
	mock  *clock.Mock
	st    *faulty
	table *local.Table
	loop  *syncloop.Loop
	errs  atomic.Int64
	log   strings.Builder
	logMu sync.Mutex
}

func (f *fixture) Write(p []byte) (int, error) {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	return f.log.Write(p)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{mock: clock.NewMock()}
	f.mock.Set(t0)
	f.st = &faulty{Memory: store.NewMemory(f.mock)}
	f.table = local.NewTable(local.Options{Rules: []local.Rule{local.NewRule(local.Spec{Kind: local.Sliding, Limit: 1_000_000, Window: time.Minute})}, MaxKeys: 1 << 20, Syncing: true})
	f.loop = syncloop.New(syncloop.Config{
		Tables: []*local.Table{f.table}, Store: f.st, Prefix: "hl", Node: "n1",
		Now:   func() int64 { return f.mock.Now().UnixNano() },
		Clock: f.mock, Rate: 100 * time.Millisecond, Recent: 0, Timeout: time.Second,
		OnError:  func(error) { f.errs.Add(1) },
		Logger:   slog.New(slog.NewTextHandler(f, nil)),
		LogEvery: time.Hour,
	})
	return f
}

// admit counts n requests on each of keys.
func (f *fixture) admit(t *testing.T, n int, keys ...string) {
	t.Helper()
	for _, k := range keys {
		for range n {
			_, st := f.table.Allow(k, 1, f.mock.Now().UnixNano())
			require.Equal(t, local.Decided, st)
		}
	}
}

func (f *fixture) total(key string) int64 {
	return f.st.Get("hl", store.Counter{Key: key, Window: 60_000, ID: f.mock.Now().UnixMilli() / 60_000})
}

func TestRunBacksOffAndRecovers(t *testing.T) {
	f := newFixture(t)
	f.st.down.Store(true)
	f.admit(t, 3, "k")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.loop.Run(stop)
	}()
	step := func() {
		for range 30 {
			f.mock.Add(100 * time.Millisecond)
		}
	}
	step() // 3 s of failures
	s := f.loop.Stats()
	assert.True(t, s.Failing)
	assert.GreaterOrEqual(t, s.Backoff, 800*time.Millisecond, "backing off")
	assert.Less(t, f.errs.Load(), int64(15), "backing off: far fewer attempts than 30")
	assert.Positive(t, f.errs.Load())
	step()
	step() // 9 s of failures
	s = f.loop.Stats()
	assert.GreaterOrEqual(t, s.Backoff, time.Second, "backing off")
	assert.LessOrEqual(t, s.Backoff, 1200*time.Millisecond, "at most 10 sync periods, plus 20 % jitter")
	f.logMu.Lock()
	assert.Equal(t, 1, strings.Count(f.log.String(), "store error"), "the log is rate-limited")
	f.logMu.Unlock()
	f.st.down.Store(false)
	for range 3 {
		step()
	}
	close(stop)
	<-done
	s = f.loop.Stats()
	assert.False(t, s.Failing)
	assert.Equal(t, 100*time.Millisecond, s.Backoff)
	assert.Equal(t, int64(3), f.total("k"), "the increments reached the store once")
}

// Batches whose answer was lost are sent again, unchanged, until the store
// answers: every increment is applied exactly once.
func TestInDoubtBatchesAreAppliedOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	keys := []string{"a", "b", "c", "{d}", "e e"}
	f.admit(t, 2, keys...)
	f.st.doubt.Store(3) // three calls in a row lose their answer
	for i := range 3 {
		require.Error(t, f.loop.Cycle(ctx), "cycle %d", i)
		assert.Positive(t, f.loop.Stats().InDoubt)
		f.admit(t, 1, keys...) // decisions go on; new batches queue behind the doubtful ones
		for _, k := range keys {
			st := f.table.Stats()
			assert.Equal(t, int64(len(keys)*(3+i)), st.Unsynced, "nothing acknowledged yet, nothing lost (%s)", k)
		}
	}
	require.NoError(t, f.loop.Cycle(ctx))
	assert.Equal(t, 0, f.loop.Stats().InDoubt)
	for _, k := range keys {
		assert.Equal(t, int64(2), f.total(k), "key %q: the batch in doubt, applied once", k)
	}
	// Its groups got no new batch while it was in doubt: the increments
	// since go in the next cycle.
	require.NoError(t, f.loop.Cycle(ctx))
	for _, k := range keys {
		assert.Equal(t, int64(5), f.total(k), "key %q: 5 admitted, 5 in the store", k)
	}
	assert.Equal(t, int64(0), f.table.Stats().Unsynced)
}

// A failure of one group (a dead shard) leaves the others synced, and the
// loop keeps its rate rather than backing off.
func TestPartialFailure(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprint("key", i))
	}
	f.admit(t, 1, keys...)
	bad := f.st.Group(keys[0])
	f.st.badGroup.Store(int64(bad + 1))
	err := f.loop.Cycle(ctx)
	require.Error(t, err)
	healthy := 0
	for _, k := range keys {
		if f.st.Group(k) == bad {
			assert.Equal(t, int64(0), f.total(k))
			assert.True(t, f.loop.KeyFailing(k))
		} else {
			assert.Equal(t, int64(1), f.total(k))
			assert.False(t, f.loop.KeyFailing(k))
			healthy++
		}
	}
	require.Positive(t, healthy)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.loop.Run(stop)
	}()
	for range 10 {
		f.mock.Add(100 * time.Millisecond)
	}
	assert.Equal(t, 100*time.Millisecond, f.loop.Stats().Backoff, "some batches applied: no backoff")
	close(stop)
	<-done
	f.st.badGroup.Store(0)
	require.NoError(t, f.loop.Cycle(ctx))
	for _, k := range keys {
		assert.Equal(t, int64(1), f.total(k), "key %q caught up", k)
	}
}

// A cycle over more keys than a chunk pushes them all, a chunk per call,
// and the statistics tell the cycle's length.
func TestLargeCycleIsChunked(t *testing.T) {
	f := newFixture(t)
	var keys []string
	for i := range 10_000 {
		keys = append(keys, fmt.Sprint("k", i))
	}
	f.admit(t, 1, keys...)
	require.NoError(t, f.loop.Cycle(context.Background()))
	assert.Equal(t, int64(3), f.st.pushes.Load(), "10,000 keys in chunks of 4096")
	st := f.loop.Stats()
	assert.Equal(t, 10_000, st.CycleKeys)
	assert.Equal(t, uint64(20_000), st.KeysPushed, "an INCRBY per key, and a read of the previous window of a key new to the node")
	for _, k := range keys[:100] {
		assert.Equal(t, int64(1), f.total(k))
	}
}

// Flush pushes everything, trying again while the store fails, until its
// context ends; then it says how many increments may be missing.
func TestFlush(t *testing.T) {
	f := newFixture(t)
	f.admit(t, 4, "x", "y")
	f.st.down.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := f.loop.Flush(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "8 increments (per rule) of 2 keys may not have reached the store")
	_, st := f.table.Allow("x", 1, f.mock.Now().UnixNano())
	assert.Equal(t, local.Closed, st)

	g := newFixture(t)
	g.admit(t, 4, "x", "y")
	g.st.down.Store(true)
	go func() {
		time.Sleep(50 * time.Millisecond)
		g.st.down.Store(false)
	}()
	require.NoError(t, g.loop.Flush(context.Background()), "the store came back within the flush")
	assert.Equal(t, int64(4), g.total("x"))
	assert.Equal(t, int64(4), g.total("y"))
}

// While a cycle is under way, Stats.Period is at least the time since it
// began: a loop stuck in a long cycle says so.
func TestPeriodCountsTheCycleUnderWay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.admit(t, 1, "a")
	require.NoError(t, f.loop.Cycle(ctx))
	f.mock.Add(100 * time.Millisecond)
	f.admit(t, 1, "a")
	require.NoError(t, f.loop.Cycle(ctx))
	assert.Equal(t, 100*time.Millisecond, f.loop.Stats().Period)

	f.st.hold = make(chan struct{})
	f.mock.Add(100 * time.Millisecond)
	f.admit(t, 1, "a")
	done := make(chan error)
	go func() { done <- f.loop.Cycle(ctx) }()
	for f.st.pushes.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	f.mock.Add(2 * time.Second)
	assert.Equal(t, 2*time.Second, f.loop.Stats().Period, "the cycle under way")
	close(f.st.hold)
	require.NoError(t, <-done)
	assert.Equal(t, 100*time.Millisecond, f.loop.Stats().Period, "between the starts once it ended")
}
