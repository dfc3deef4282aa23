package local

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const w = int64(1000) // window size, ns, for these tests

func newTestTable(t *testing.T, syncing bool, limits ...int64) *Table {
	t.Helper()
	var rules []Rule
	for i, l := range limits {
		rules = append(rules, NewRule(Spec{Kind: Sliding, Limit: l, Window: time.Duration(w * int64(i+1))}))
	}
	return NewTable(Options{Rules: rules, MaxKeys: 1000, Syncing: syncing, ReadPrev: 3 * w})
}

func allow(t *testing.T, tb *Table, key string, n, now int64) bool {
	t.Helper()
	d, st := tb.Allow(key, n, now)
	require.Equal(t, Decided, st)
	return d.Allowed
}

func entry(t *testing.T, tb *Table, key string) *Entry {
	t.Helper()
	e := tb.load(tb.hash(key), key)
	require.NotNil(t, e)
	return e
}

// settleAll takes e's pushes and settles them with totals equal to what
// this node pushed plus others (per push).
func takeSettle(tb *Table, e *Entry, now int64, others int64) []Push {
	pushes, _ := tb.Take(e, now, nil)
	totals := make([]int64, len(pushes))
	for i, p := range pushes {
		totals[i] = p.Delta + others
	}
	tb.Settle(e, 0, pushes, totals)
	return pushes
}

func TestRolloverKeepsThePreviousWindow(t *testing.T) {
	tb := newTestTable(t, true, 100)
	assert.True(t, allow(t, tb, "k", 3, 5*w))
	e := entry(t, tb, "k")
	c, s := e.ctr(0), tb.sync(e, 0)
	assert.True(t, allow(t, tb, "k", 1, 6*w)) // rolls over
	assert.Equal(t, int64(6), c.win.Load())
	assert.Equal(t, int64(3), c.prev.Load())
	assert.Equal(t, int64(1), word(c.word.Load()).count())
	assert.Equal(t, int64(3), s.prevPending, "the 3 still have to be pushed to window 5")
	// Two windows on, the 3 were never pushed: they are kept as stale, to
	// be pushed still, and the 1 becomes the previous window's.
	assert.True(t, allow(t, tb, "k", 1, 7*w))
	st := tb.stale(e, 0)
	require.NotNil(t, st, "stale increments are kept in the entry's extension")
	assert.Equal(t, int64(3), st.n)
	assert.Equal(t, int64(5), st.win)
	pushes, _ := tb.Take(e, 7*w, nil)
	assert.Equal(t, []Push{{Rule: 0, Win: 7, Delta: 1, kind: pushCur}, {Rule: 0, Win: 6, Delta: 1, kind: pushPrev}, {Rule: 0, Win: 5, Delta: 3, kind: pushStale}}, pushes)
	assert.Equal(t, uint64(0), tb.Stats().Dropped, "nothing dropped while the loop takes")
}

// TestReadsPreviousWindow follows which takes read the store's total of
// the previous window after a rollover, and which leave the entry queued
// for that: with ReadPrev of w/5, the first take after a rollover into the
// next window, however late, and every take before w/5 into the window;
// none after a rollover that skipped a window.
func TestReadsPreviousWindow(t *testing.T) {
	prev := func(pushes []Push) bool {
		for _, p := range pushes {
			if p.kind == pushPrev {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		name   string
		decide []int64 // instants of decisions, in order, the last one rolling over
		takes  []int64 // instants of takes after them
		read   []bool  // whether each take reads window 4
		again  []bool  // whether each take keeps the entry queued
	}{
		{"rollover at the start", []int64{4 * w, 5 * w}, []int64{5 * w, 5*w + w/10, 5*w + w/5, 5*w + w/2},
			[]bool{true, true, false, false}, []bool{true, true, false, false}},
		{"late rollover", []int64{4 * w, 5*w + 9*w/10}, []int64{5*w + 9*w/10, 5*w + 19*w/20},
			[]bool{true, false}, []bool{false, false}},
		{"late first take", []int64{4 * w, 5 * w}, []int64{5*w + w/2, 5*w + 3*w/5},
			[]bool{true, false}, []bool{false, false}},
		// This node had nothing in window 4, but the others may have.
		{"skipped window", []int64{3 * w, 5 * w}, []int64{5 * w, 5*w + w/10, 5*w + w/2},
			[]bool{true, true, false}, []bool{true, true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Duration(w)})}, MaxKeys: 10, Syncing: true, ReadPrev: w / 5})
			for k, at := range tc.decide {
				require.True(t, allow(t, tb, "k", 1, at))
				if k == 0 {
					takeSettle(tb, entry(t, tb, "k"), at, 0) // nothing pending at the rollover
				}
			}
			e := entry(t, tb, "k")
			for k, at := range tc.takes {
				pushes, again := tb.Take(e, at, nil)
				assert.Equal(t, tc.read[k], prev(pushes), "take %d at %d reads the previous window", k, at)
				assert.Equal(t, tc.again[k], again, "take %d at %d keeps the entry queued", k, at)
				totals := make([]int64, len(pushes))
				tb.Settle(e, at, pushes, totals)
			}
		})
	}
}

// TestFailedPreviousWindowReadIsRetried hands back a late first take's
// read of the previous window (the store failed): the next take reads it
// again, though it is past ReadPrev into the window.
func TestFailedPreviousWindowReadIsRetried(t *testing.T) {
	tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Duration(w)})}, MaxKeys: 10, Syncing: true, ReadPrev: w / 5})
	require.True(t, allow(t, tb, "k", 1, 4*w))
	e := entry(t, tb, "k")
	takeSettle(tb, e, 4*w, 0)
	require.True(t, allow(t, tb, "k", 1, 5*w+w/2)) // rolls over, late
	pushes, _ := tb.Take(e, 5*w+w/2, nil)
	require.Equal(t, []Push{{Rule: 0, Win: 5, Delta: 1, kind: pushCur}, {Rule: 0, Win: 4, kind: pushPrev}}, pushes)
	tb.Release(e, pushes)
	pushes, _ = tb.Take(e, 5*w+3*w/5, nil)
	assert.Equal(t, []Push{{Rule: 0, Win: 5, Delta: 1, kind: pushCur}, {Rule: 0, Win: 4, kind: pushPrev}}, pushes, "the read is sent again")
	tb.Settle(e, 5*w+3*w/5, pushes, []int64{1, 7})
	assert.Equal(t, int64(7), e.ctr(0).prev.Load(), "the previous window's total as the store has it")
	pushes, _ = tb.Take(e, 5*w+4*w/5, nil)
	assert.Equal(t, []Push{{Rule: 0, Win: 5, kind: pushCur}}, pushes, "read once")
}

func TestTakeSettleRelease(t *testing.T) {
	tb := newTestTable(t, true, 100)
	assert.True(t, allow(t, tb, "k", 4, 5*w))
	e := entry(t, tb, "k")
	c, s := e.ctr(0), tb.sync(e, 0)
	// A key new to the node reads the previous window too.
	read := Push{Rule: 0, Win: 4, kind: pushPrev}
	pushes, _ := tb.Take(e, 5*w, nil)
	require.Equal(t, []Push{{Rule: 0, Win: 5, Delta: 4}, read}, pushes)
	assert.Equal(t, int64(4), s.inflight)
	assert.Equal(t, int64(4), c.base.Load(), "in flight still counts")
	// Not applied: back to the next take.
	tb.Release(e, pushes)
	assert.Equal(t, int64(0), s.inflight)
	assert.Equal(t, int64(4), s.adj)
	assert.Equal(t, int64(4), c.base.Load())
	assert.True(t, allow(t, tb, "k", 1, 5*w))
	pushes, _ = tb.Take(e, 5*w, nil)
	require.Equal(t, []Push{{Rule: 0, Win: 5, Delta: 5}, read}, pushes)
	// Applied, the others had pushed 10.
	tb.Settle(e, 0, pushes, []int64{15, 0})
	assert.Equal(t, int64(15), c.base.Load())
	assert.Equal(t, int64(0), tb.Unsynced(e))
	res, _ := tb.Peek("k", 1, 5*w+w/2), 0
	assert.Equal(t, int64(85), res.Remaining)
}

func TestSettleAndReleaseAfterRollover(t *testing.T) {
	tb := newTestTable(t, true, 100)
	assert.True(t, allow(t, tb, "k", 4, 5*w))
	e := entry(t, tb, "k")
	c, s := e.ctr(0), tb.sync(e, 0)
	pushes, _ := tb.Take(e, 5*w, nil)
	assert.True(t, allow(t, tb, "k", 1, 6*w)) // rolls over while the push is on its way
	tb.Settle(e, 0, pushes, []int64{10})
	assert.Equal(t, int64(10), c.prev.Load(), "the pushed window is the previous one now")
	assert.Equal(t, int64(0), s.prevInflight)

	assert.True(t, allow(t, tb, "k", 2, 6*w))
	pushes, _ = tb.Take(e, 6*w, nil)
	require.Len(t, pushes, 2, "current window, and the previous one still read")
	assert.True(t, allow(t, tb, "k", 1, 7*w)) // rolls over again
	tb.Release(e, pushes)
	assert.Equal(t, int64(3), s.prevPending, "window 6's 3 go back to be pushed as the previous window")
	assert.Equal(t, int64(0), s.prevInflight)
	assert.Equal(t, int64(4), tb.Unsynced(e), "3 of window 6, 1 of window 7")
}

// undo takes back exactly what a decision counted, whatever moved its
// increment since: nothing, a take, or a rollover; for any number of rules.
func TestUndoIsExact(t *testing.T) {
	limits := []int64{100, 100, 100, 100, 100, 2}
	tb := newTestTable(t, true, limits...)
	// The 6th rule denies the third request: the five others take back
	// what they counted.
	assert.True(t, allow(t, tb, "k", 1, 60*w))
	assert.True(t, allow(t, tb, "k", 1, 60*w))
	assert.False(t, allow(t, tb, "k", 1, 60*w))
	e := entry(t, tb, "k")
	for i := range 5 {
		assert.Equal(t, int64(2), word(e.ctr(i).word.Load()).count(), "rule %d", i)
	}
	// After a take: the taken-back increment becomes −1 in the next push.
	var words [MaxRules]word
	var wins [MaxRules]int64
	words[0], wins[0] = word(e.ctr(0).word.Load()), e.ctr(0).win.Load()
	pushes, _ := tb.Take(e, 60*w, nil)
	tb.undo(e, 0, words[0], wins[0], 1)
	assert.Equal(t, int64(-1), tb.sync(e, 0).adj)
	assert.Equal(t, int64(1), e.ctr(0).base.Load(), "the view drops it at once")
	totals := make([]int64, len(pushes)) // the previous windows' reads: 0
	for k, p := range pushes {
		if p.kind == pushCur {
			totals[k] = 2
		}
	}
	tb.Settle(e, 0, pushes, totals)
	pushes, _ = tb.Take(e, 60*w, nil)
	assert.Equal(t, int64(-1), pushes[0].Delta)
	// After a rollover: taken back from the previous window.
	tb = newTestTable(t, true, 100, 100)
	assert.True(t, allow(t, tb, "r", 1, 60*w))
	e = entry(t, tb, "r")
	words[1], wins[1] = word(e.ctr(1).word.Load()), e.ctr(1).win.Load()
	assert.True(t, allow(t, tb, "r", 1, 62*w)) // rule 1 (window 2w) rolls over
	assert.Equal(t, int64(1), e.ctr(1).prev.Load())
	tb.undo(e, 1, words[1], wins[1], 1)
	assert.Equal(t, int64(0), e.ctr(1).prev.Load())
	assert.Equal(t, int64(0), tb.sync(e, 1).prevPending, "1 pending for window 30, taken back")
	assert.Equal(t, int64(3), tb.Unsynced(e), "rule 0: both requests (one stale); rule 1: the second only")
}

// Decisions and takes racing on one key lose nothing and count nothing
// twice: within one window, and across rollovers, where what a counter
// cannot keep (it holds one window older than the previous one) is
// counted as dropped.
func TestConcurrentDecisionsAndTakesLoseNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		span int64 // decision instants spread over [0, span) ns
	}{{"one window", 1}, {"rollovers", 16 * w}} {
		t.Run(c.name, func(t *testing.T) {
			tb := newTestTable(t, true, 1<<40, 1<<40)
			const goroutines, each = 8, 2000
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					for i := range each {
						if allow(t, tb, "k", 1, int64(g*each+i)*c.span/(goroutines*each)) {
							admitted.Add(1)
						}
					}
				})
			}
			var pushed [2]int64
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if e := tb.load(tb.hash("k"), "k"); e != nil {
						for _, p := range takeSettle(tb, e, 0, 0) {
							pushed[p.Rule] += p.Delta
						}
					}
				}
			}()
			wg.Wait()
			close(stop)
			<-done
			e := entry(t, tb, "k")
			for range 3 { // the previous and a stale window come in later takes
				for _, p := range takeSettle(tb, e, 0, 0) {
					pushed[p.Rule] += p.Delta
				}
			}
			assert.Equal(t, int64(goroutines*each), admitted.Load())
			dropped := int64(tb.Stats().Dropped)
			assert.Equal(t, 2*admitted.Load(), pushed[0]+pushed[1]+dropped, "pushed %v, dropped %d", pushed, dropped)
			if c.span == 1 {
				assert.Zero(t, dropped)
				assert.Equal(t, admitted.Load(), pushed[0])
				assert.Equal(t, admitted.Load(), pushed[1])
			}
		})
	}
}

// MaxKeys is exact: however many goroutines race to create keys, the
// table never holds more.
func TestMaxKeysIsExact(t *testing.T) {
	tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Sliding, Limit: 10, Window: 1000})}, MaxKeys: 100})
	var full atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 50 {
				if _, st := tb.Allow(fmt.Sprint(g, "-", i), 1, 0); st == Full {
					full.Add(1)
				}
				assert.LessOrEqual(t, tb.Len(), 100)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, 100, tb.Stats().Keys)
	assert.Equal(t, int64(64*50-100), full.Load())
}

func TestEvictIdleOnly(t *testing.T) {
	tb := newTestTable(t, true, 100)
	assert.True(t, allow(t, tb, "idle", 1, 5*w))
	assert.True(t, allow(t, tb, "pending", 1, 5*w))
	e := entry(t, tb, "idle")
	takeSettle(tb, e, 5*w, 0)
	assert.Equal(t, 0, tb.Evict(7*w), "idle for exactly two windows")
	assert.Equal(t, 1, tb.Evict(7*w+1), "the key with unpushed increments stays")
	assert.Nil(t, tb.load(tb.hash("idle"), "idle"))
	assert.True(t, e.has(flagDead))
	assert.Equal(t, 1, tb.Len())
}

// The synchronous mode's mirror: Observe rolls the key's counters to the
// decision's window, so State stays right after the key's first window.
func TestObserveRollsOver(t *testing.T) {
	tb := newTestTable(t, true, 10)
	for win := int64(5); win < 9; win++ {
		tb.Observe("k", win*w+1, []Counts{{Prev: 0, Cur: 3}}, true, true)
		var v [1]Counts
		require.True(t, tb.View("k", win*w+1, 1, v[:]))
		assert.Equal(t, int64(3), v[0].Cur, "window %d", win)
		rem, _ := tb.rules[0].Level(v[0])
		assert.Equal(t, int64(7), rem, "window %d", win)
	}
}
