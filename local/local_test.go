package local

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const w = int64(1000) // window size, ns, for these tests

func newTestEntry(t *testing.T, syncing bool) (*Table, *Entry) {
	t.Helper()
	tb := NewTable([]int64{w}, 10, syncing)
	e := tb.LoadOrCreate("k", 5*w)
	require.NotNil(t, e)
	return tb, e
}

func add(t *testing.T, e *Entry, n int64) Word {
	t.Helper()
	for {
		wd := e.C[0].Load()
		if e.C[0].CompareAndAdd(wd, n) {
			return wd
		}
	}
}

func TestCompareAndAddFailsAcrossRollover(t *testing.T) {
	_, e := newTestEntry(t, false)
	wd := e.C[0].Load()
	e.Roll(0, 6, 0, false)
	assert.False(t, e.C[0].CompareAndAdd(wd, 1), "a word read before the rollover must not commit after it")
	add(t, e, 2)
	assert.Equal(t, int64(2), e.C[0].Load().Count())
}

func TestRollKeepsThePreviousWindow(t *testing.T) {
	tb, e := newTestEntry(t, true)
	add(t, e, 3)
	assert.Equal(t, int64(0), e.Roll(0, 6, 42, true))
	c := &e.C[0]
	assert.Equal(t, int64(6), c.Window())
	assert.Equal(t, int64(3), c.Prev())
	assert.Equal(t, int64(0), c.Load().Count())
	assert.Equal(t, int64(3), c.prevPending, "the 3 still have to be pushed to window 5")
	// Skipping a window: the previous one is empty, and the 3 that were
	// never pushed can no longer matter.
	assert.Equal(t, int64(3), e.Roll(0, 8, 0, true))
	assert.Equal(t, int64(0), c.Prev())
	tb.AddDropped(3)
	assert.Equal(t, uint64(3), tb.Stats().Dropped)
}

func TestTakeAckFail(t *testing.T) {
	_, e := newTestEntry(t, true)
	c := &e.C[0]
	add(t, e, 4)
	pushes, again := e.Take(0, nil)
	require.Len(t, pushes, 1)
	assert.False(t, again)
	p := pushes[0]
	assert.Equal(t, Push{Rule: 0, Win: 5, epoch: p.epoch, Delta: 4, ExpireCur: true, oldExpWin: -1}, p)
	assert.Equal(t, int64(4), c.Synced(), "in flight still counts")
	add(t, e, 1)

	// The store failed: the 4 come back to pending, expiry is asked again.
	assert.Equal(t, int64(0), e.Fail(pushes))
	assert.Equal(t, int64(5), c.Load().Count())
	assert.Equal(t, int64(0), c.inflight.Load())
	pushes, _ = e.Take(0, pushes[:0])
	assert.Equal(t, int64(5), pushes[0].Delta)
	assert.True(t, pushes[0].ExpireCur)

	// The store answered 12 (other nodes pushed 7): that is the cluster total.
	e.Ack(pushes, []int64{12}, []int64{0})
	assert.Equal(t, int64(12), c.Synced())
	assert.Equal(t, int64(0), c.Load().Count())
	pushes, _ = e.Take(0, pushes[:0])
	assert.False(t, pushes[0].ExpireCur, "expiry is set once per window")
	assert.Equal(t, int64(0), pushes[0].Delta, "nothing pending: a read")
}

func TestAckAfterRolloverLandsInThePreviousWindow(t *testing.T) {
	_, e := newTestEntry(t, true)
	c := &e.C[0]
	add(t, e, 4)
	pushes, _ := e.Take(0, nil)
	e.Roll(0, 6, 6*w+100, true) // rollover while the push is in flight
	add(t, e, 1)
	assert.Equal(t, int64(4), c.Prev(), "the in-flight 4 count in the previous window meanwhile")
	e.Ack(pushes, []int64{9}, []int64{0})
	assert.Equal(t, int64(9), c.Prev(), "window 5 totals 9 in the store")
	assert.Equal(t, int64(1), c.Load().Count())
	// The next cycle reads window 5 again until 6w+100.
	pushes, again := e.Take(6*w, pushes[:0])
	assert.True(t, again)
	assert.True(t, pushes[0].Prev)
	assert.Equal(t, int64(0), pushes[0].PrevDelta)
	e.Ack(pushes, []int64{1}, []int64{11})
	assert.Equal(t, int64(11), c.Prev())
	_, again = e.Take(6*w+100, nil)
	assert.False(t, again)
}

func TestFailAfterRolloverKeepsTheIncrementsForThePreviousWindow(t *testing.T) {
	_, e := newTestEntry(t, true)
	c := &e.C[0]
	add(t, e, 4)
	pushes, _ := e.Take(0, nil)
	e.Roll(0, 6, 0, true)
	assert.Equal(t, int64(0), e.Fail(pushes))
	assert.Equal(t, int64(4), c.prevPending)
	pushes, _ = e.Take(0, nil)
	assert.True(t, pushes[0].Prev)
	assert.Equal(t, int64(4), pushes[0].PrevDelta)
	assert.Equal(t, int64(5), pushes[0].Win-1)
	assert.True(t, pushes[0].ExpirePrev)
}

func TestUndo(t *testing.T) {
	_, e := newTestEntry(t, true)
	c := &e.C[0]
	add(t, e, 2)
	wd := add(t, e, 3)
	e.Undo(0, wd, 3)
	assert.Equal(t, int64(2), c.Load().Count())
	wd = add(t, e, 3)
	e.Roll(0, 6, 0, true)
	e.Undo(0, wd, 3) // the 3 moved to the previous window
	assert.Equal(t, int64(2), c.Prev())
	assert.Equal(t, int64(2), c.prevPending)
}

func TestConcurrentAddsAndSyncLoseNothing(t *testing.T) {
	tb, e := newTestEntry(t, true)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				add(t, e, 1)
				tb.Touch(e)
			}
		})
	}
	var pushed int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		var buf []Push
		var entries []*Entry
		for range 200 {
			entries = tb.Drain(entries)
			for _, x := range entries {
				buf, _ = x.Take(0, buf[:0])
				pushed += buf[0].Delta
				x.Ack(buf, []int64{pushed}, []int64{0})
			}
		}
	}()
	wg.Wait()
	<-done
	buf, _ := e.Take(0, nil)
	pushed += buf[0].Delta
	assert.Equal(t, int64(4000), pushed)
}

func TestEvictIdleOnly(t *testing.T) {
	tb := NewTable([]int64{w, 10 * w}, 10, true)
	a := tb.LoadOrCreate("a", 0)
	b := tb.LoadOrCreate("b", 0)
	for range 3 {
		wd := b.C[1].Load()
		require.True(t, b.C[1].CompareAndAdd(wd, 1))
	}
	b.Seen(0)
	a.Seen(0)
	assert.Equal(t, 0, tb.Evict(20*w), "idle for exactly twice the longest window")
	assert.Equal(t, 1, tb.Evict(20*w+1), "b still has increments to push")
	assert.True(t, a.Dead())
	assert.False(t, b.Dead())
	_, ok := tb.Load("a")
	assert.False(t, ok)
	pushes, _ := b.Take(0, nil)
	b.Ack(pushes, []int64{0, 3}, []int64{0, 0})
	assert.Equal(t, 1, tb.Evict(20*w+1))
	assert.Equal(t, uint64(2), tb.Stats().Evicted)
	assert.Nil(t, NewTable([]int64{w}, 1, false).fill(t), "full table")
}

func (t *Table) fill(tt *testing.T) *Entry {
	require.NotNil(tt, t.LoadOrCreate("x", 0))
	return t.LoadOrCreate("y", 0)
}
