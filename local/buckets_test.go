package local

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The running sum of a Buckets rule's closed buckets always equals the sum
// of its slots in the counter's window, through decisions, rollovers
// (also several buckets at once), takes, settles with other nodes'
// counts, releases and undone decisions; and every decision matches the
// full bucket scan.
func TestBucketSumFollowsTheSlots(t *testing.T) {
	const span = 5
	buckets := NewRule(Spec{Kind: Buckets, Limit: 40, Window: time.Duration(span * w), Buckets: span})
	sliding := NewRule(Spec{Kind: Sliding, Limit: 1000, Window: time.Duration(w)})
	for k := range 4 {
		rules, syncing := []Rule{buckets, sliding}, k%2 == 1
		if k >= 2 {
			rules = rules[:1]
		}
		tb := NewTable(Options{Rules: rules, MaxKeys: 10, Syncing: syncing, ReadPrev: 3 * w, CountDenied: !syncing})
		rng := rand.New(rand.NewPCG(1, 2))
		now := 10 * span * w
		check := func(step int) {
			e := tb.load(tb.hash("k"), "k")
			if e == nil {
				return
			}
			tb.mu(e).Lock()
			got := tb.closedSum(e, 0).Load()
			tb.resum(e, 0)
			want := tb.closedSum(e, 0).Load()
			tb.mu(e).Unlock()
			require.Equal(t, want, got, "step %d (syncing %v)", step, syncing)
		}
		for step := range 5000 {
			switch x := rng.IntN(100); {
			case x < 3:
				now += int64(rng.IntN(3*span)) * w // several buckets at once
			case x < 30:
				now += int64(rng.IntN(int(w)))
			case x < 40 && syncing:
				if e := tb.load(tb.hash("k"), "k"); e != nil {
					pushes, _ := tb.Take(e, now, nil)
					if rng.IntN(4) == 0 {
						tb.Release(e, pushes)
						break
					}
					totals := make([]int64, len(pushes))
					for i, p := range pushes {
						totals[i] = p.Delta + int64(rng.IntN(5))
					}
					tb.Settle(e, now, pushes, totals)
				}
			default:
				n := int64(1 + rng.IntN(4))
				// The full scan of the buckets (views) predicts the
				// decision and describes it alike.
				before, after := make([]Counts, len(rules)), make([]Counts, len(rules))
				want := true
				if e := tb.load(tb.hash("k"), "k"); e != nil {
					tb.views(e, now, n, before)
					for i := range rules {
						want = want && rules[i].Admits(before[i], n)
					}
				}
				d, st := tb.Allow("k", n, now)
				require.Equal(t, Decided, st)
				require.Equal(t, want, d.Allowed, "step %d", step)
				if d.Allowed {
					tb.views(tb.load(tb.hash("k"), "k"), now, n, after)
					s := Summarize(rules, after, n, true, 1)
					require.Equal(t, s, d, "step %d", step)
				}
			}
			check(step)
		}
	}
}

// A Buckets rule decides alike on both sides of the Unix epoch (a clock
// set to it, as a mock clock starts): bucket ids before it are negative,
// and so are the windows' first ids just after it.
func TestBucketsAroundTheEpoch(t *testing.T) {
	rule := NewRule(Spec{Kind: Buckets, Limit: 3, Window: time.Duration(4 * w), Buckets: 4})
	steps := []struct {
		at      int64
		allowed bool
	}{
		{-6 * w, true}, {-6*w + 1, true}, // bucket −6: 2
		{-5 * w, true},    // window −8…−5: 3
		{-5*w + 1, false}, // full
		{-2 * w, true},    // window −5…−2: 1 + 1
		{-2*w + 1, true},  // 3
		{-2*w + 2, false}, // full
		{0, true},         // window −3…0: 2 (−2) + 1
		{1, false},        // full
		{w, false},        // window −2…1: still 3
		{2 * w, true},     // window −1…2: 1 + 1
		{2*w + 1, true},   // 3
		{3 * w, false},    // window 0…3: still 3
		{4 * w, true},     // window 1…4: 2 + 1
		{6 * w, true},     // window 3…6: 1 + 1
	}
	for _, syncing := range []bool{false, true} {
		tb := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: syncing, ReadPrev: w})
		store := map[syncedCounter]int64{}
		for i, s := range steps {
			p := tb.Peek("k", 1, s.at)
			require.Equal(t, s.allowed, p.Allowed, "syncing %v step %d (at %d): Peek", syncing, i, s.at)
			d, st := tb.Allow("k", 1, s.at)
			require.Equal(t, Decided, st)
			require.Equal(t, s.allowed, d.Allowed, "syncing %v step %d (at %d)", syncing, i, s.at)
			if syncing {
				syncForTest(t, tb, store, 0, s.at)
			}
		}
	}
}

// A Buckets counter that takes up a key (a new entry, or a rollover past
// the next bucket) reads, at its first take, every closed bucket of its
// window older than the previous one, after its stale increments; later
// takes and rollovers into the next bucket read only the previous bucket;
// a read the store did not answer is sent again.
func TestBucketsReadTheOlderBucketsWhenTakingUpAKey(t *testing.T) {
	tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Buckets, Limit: 100, Window: time.Duration(4 * w), Buckets: 4})}, MaxKeys: 10, Syncing: true, ReadPrev: w / 5})
	require.True(t, allow(t, tb, "k", 1, 10*w))
	e := entry(t, tb, "k")
	pushes, _ := tb.Take(e, 10*w, nil)
	require.Equal(t, []Push{{Win: 10, Delta: 1, kind: pushCur}, {Win: 9, kind: pushPrev}, {Win: 7, kind: pushOld}, {Win: 8, kind: pushOld}}, pushes)
	tb.Release(e, pushes)
	pushes, _ = tb.Take(e, 10*w+w/2, nil)
	require.Equal(t, []Push{{Win: 10, Delta: 1, kind: pushCur}, {Win: 9, kind: pushPrev}, {Win: 7, kind: pushOld}, {Win: 8, kind: pushOld}}, pushes, "the reads are sent again")
	tb.Settle(e, 10*w+w/2, pushes, []int64{1, 0, 30, 40})
	assert.True(t, allow(t, tb, "k", 29, 10*w+w/2), "the window holds 71")
	assert.False(t, allow(t, tb, "k", 1, 10*w+w/2), "the window holds 100")
	pushes, _ = tb.Take(e, 10*w+3*w/5, nil)
	assert.Equal(t, []Push{{Win: 10, Delta: 29, kind: pushCur}}, pushes, "read once")
	tb.Settle(e, 10*w+3*w/5, pushes, []int64{30})
	require.True(t, allow(t, tb, "k", 0, 11*w)) // rolls over into the next bucket
	pushes, _ = tb.Take(e, 11*w, nil)
	assert.Equal(t, []Push{{Win: 11, kind: pushCur}, {Win: 10, kind: pushPrev}}, pushes, "the previous bucket only")
	tb.Settle(e, 11*w, pushes, []int64{0, 30})
	// Back after skipping buckets 12 and 13, with 5 of bucket 11 not
	// pushed: they go first, as stale, then bucket 11 is read with them and
	// bucket 12 (13 is the previous one).
	require.True(t, allow(t, tb, "k", 5, 11*w+w/2))
	require.True(t, allow(t, tb, "k", 0, 14*w))
	pushes, _ = tb.Take(e, 14*w, nil)
	require.Equal(t, []Push{{Win: 14, kind: pushCur}, {Win: 13, kind: pushPrev}, {Win: 11, Delta: 5, kind: pushStale}, {Win: 11, kind: pushOld}, {Win: 12, kind: pushOld}}, pushes)
	tb.Settle(e, 14*w, pushes, []int64{0, 20, 10, 10, 50})
	assert.True(t, allow(t, tb, "k", 20, 14*w), "the window holds 80")
	assert.False(t, allow(t, tb, "k", 1, 14*w), "the window holds 100")
	// A bucket the store holds less of than this node counted there (its
	// increments in a batch not answered yet) keeps this node's count.
	require.True(t, allow(t, tb, "k", 0, 20*w))
	require.True(t, allow(t, tb, "k", 7, 20*w+w/2))
	pushes, _ = tb.Take(e, 20*w+w/2, nil) // no answer
	require.Equal(t, Push{Win: 20, Delta: 7, kind: pushCur}, pushes[0])
	require.True(t, allow(t, tb, "k", 0, 22*w)) // skips bucket 21
	pushes, _ = tb.Take(e, 22*w, nil)
	require.Equal(t, []Push{{Win: 22, kind: pushCur}, {Win: 21, kind: pushPrev}, {Win: 19, kind: pushOld}, {Win: 20, kind: pushOld}}, pushes)
	tb.Settle(e, 22*w, pushes, []int64{0, 0, 0, 3})
	assert.True(t, allow(t, tb, "k", 93, 22*w), "the window holds 7")
	assert.False(t, allow(t, tb, "k", 1, 22*w))
}

// After a rollover past the next bucket, the first take reads the bucket
// the counter left and the later ones, not the older ones it read after
// they closed; a second rollover before that take makes it read them all.
func TestBucketsReadOnlyTheBucketsMissedWhenBack(t *testing.T) {
	tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Buckets, Limit: 100, Window: time.Duration(8 * w), Buckets: 8})}, MaxKeys: 10, Syncing: true, ReadPrev: w / 5})
	olds := func(pushes []Push) (ids []int64) {
		for _, p := range pushes {
			if p.kind == pushOld {
				ids = append(ids, p.Win)
			}
		}
		return ids
	}
	require.True(t, allow(t, tb, "k", 1, 10*w))
	e := entry(t, tb, "k")
	assert.Equal(t, []int64{3, 4, 5, 6, 7, 8}, olds(takeSettle(tb, e, 10*w, 0)), "a new entry reads every older bucket")
	require.True(t, allow(t, tb, "k", 1, 11*w))
	assert.Empty(t, olds(takeSettle(tb, e, 11*w, 0)), "the next bucket: the previous one only")
	require.True(t, allow(t, tb, "k", 1, 14*w))
	assert.Equal(t, []int64{11, 12}, olds(takeSettle(tb, e, 14*w, 0)), "back after 12 and 13: 11, last read while current, and 12")
	require.True(t, allow(t, tb, "k", 1, 17*w))
	require.True(t, allow(t, tb, "k", 1, 18*w)) // no take in between
	assert.Equal(t, []int64{11, 12, 13, 14, 15, 16}, olds(takeSettle(tb, e, 18*w, 0)), "rolled over again before the reads: all")
	require.True(t, allow(t, tb, "k", 1, 19*w))
	assert.Empty(t, olds(takeSettle(tb, e, 19*w, 0)))
}

// A Buckets counter whose read of the previous bucket the store has not
// answered when it rolls into the next bucket still reads that bucket,
// now older than the previous one: the read failed before the rollover
// (read again as an older bucket), the read is answered after it (its
// total kept), or it failed after it (read again).
func TestBucketsReadAPreviousBucketAcrossARollover(t *testing.T) {
	spec := Spec{Kind: Buckets, Limit: 100, Window: time.Duration(4 * w), Buckets: 4}
	olds := func(pushes []Push) (ids []int64) {
		for _, p := range pushes {
			if p.kind == pushOld {
				ids = append(ids, p.Win)
			}
		}
		return ids
	}
	// start leaves key k at bucket 11 with the read of bucket 10 taken,
	// not answered.
	start := func(t *testing.T) (*Table, *Entry, []Push) {
		tb := NewTable(Options{Rules: []Rule{NewRule(spec)}, MaxKeys: 10, Syncing: true, ReadPrev: w / 5})
		require.True(t, allow(t, tb, "k", 1, 10*w))
		e := entry(t, tb, "k")
		takeSettle(tb, e, 10*w, 0)
		require.True(t, allow(t, tb, "k", 1, 11*w))
		pushes, _ := tb.Take(e, 11*w, nil)
		require.Equal(t, []Push{{Win: 11, Delta: 1, kind: pushCur}, {Win: 10, kind: pushPrev}}, pushes)
		return tb, e, pushes
	}
	// holds checks that bucket 10 counts 60 (59 from other nodes), so
	// that the window 9–12 holds 61 with this node's 1 of bucket 11.
	holds := func(t *testing.T, tb *Table) {
		assert.True(t, allow(t, tb, "k", 39, 12*w+w/2), "the window holds 61")
		assert.False(t, allow(t, tb, "k", 1, 12*w+w/2), "the window holds 100")
	}
	// store answers what the store holds: bucket 10 60, bucket 11 this
	// node's 1, bucket 12 nothing, older buckets nothing.
	store := func(pushes []Push) []int64 {
		totals := make([]int64, len(pushes))
		for i, p := range pushes {
			totals[i] = map[int64]int64{10: 60, 11: 1}[p.Win]
		}
		return totals
	}
	t.Run("failed before the rollover", func(t *testing.T) {
		tb, e, pushes := start(t)
		tb.Release(e, pushes)
		require.True(t, allow(t, tb, "k", 0, 12*w))
		pushes, _ = tb.Take(e, 12*w, nil)
		require.Equal(t, []int64{10}, olds(pushes))
		tb.Settle(e, 12*w, pushes, store(pushes))
		holds(t, tb)
	})
	t.Run("answered after the rollover", func(t *testing.T) {
		tb, e, pushes := start(t)
		require.True(t, allow(t, tb, "k", 0, 12*w))
		tb.Settle(e, 12*w, pushes, []int64{1, 60})
		pushes, _ = tb.Take(e, 12*w, nil)
		require.Equal(t, []Push{{Win: 12, kind: pushCur}, {Win: 11, kind: pushPrev}}, pushes, "no older bucket to read")
		tb.Settle(e, 12*w, pushes, []int64{0, 1})
		holds(t, tb)
	})
	t.Run("failed after the rollover", func(t *testing.T) {
		tb, e, pushes := start(t)
		require.True(t, allow(t, tb, "k", 0, 12*w))
		tb.Release(e, pushes)
		pushes, _ = tb.Take(e, 12*w, nil)
		require.Equal(t, []int64{9, 10}, olds(pushes))
		tb.Settle(e, 12*w, pushes, store(pushes))
		holds(t, tb)
	})
}
