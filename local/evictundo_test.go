package local

import (
	"testing"
	"time"
)

// A decision that committed on an entry that an eviction removed
// meanwhile takes its increment back and retries on a fresh entry. When
// the sync loop took the increment in between (the removed entry was
// still in the sync queue), taking it back is a negative adjustment for
// the next take, which the sync loop must push: the store then counts the
// request once, from the fresh entry.
func TestUndoOnAnEvictedEntryIsPushed(t *testing.T) {
	const w = int64(time.Second)
	rule := NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Second})
	tb := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true})
	stored := map[int64]int64{} // the store's totals by window
	cycle := func(now int64) {  // a sync cycle whose pushes are all applied
		tb.Detach()
		for _, e := range tb.Touched(nil, 100) {
			pushes, _ := tb.Take(e, now, nil)
			totals := make([]int64, len(pushes))
			for k, p := range pushes {
				stored[p.Win] += p.Delta
				totals[k] = stored[p.Win]
			}
			tb.Settle(e, now, pushes, totals)
		}
	}
	now := int64(100 * time.Hour)
	if d, st := tb.Allow("k", 1, now); st != Decided || !d.Allowed {
		t.Fatal("not admitted")
	}
	cycle(now)
	e := tb.load(tb.hash("k"), "k")
	tb.Requeue(e) // read again next cycle, as a key decided on recently is
	now += 3 * w
	if n := tb.Evict(now); n != 1 {
		t.Fatalf("evicted %d, want 1", n)
	}
	// A decision that loaded e before the eviction commits on it; the sync
	// loop takes e, still queued; then the decision sees e dead.
	var res reserved
	var buf [maxBuckets]int64
	if _, o, _ := tb.reserveWord(e, 0, 1, now, &res, buf[:]); o != admitted {
		t.Fatal("not admitted")
	}
	res.upto = 1
	cycle(now)
	if o := tb.committed(e, &res, 1, now); o != retry {
		t.Fatalf("outcome %d, want retry", o)
	}
	if d, st := tb.Allow("k", 1, now); st != Decided || !d.Allowed { // the retry
		t.Fatal("retry not admitted")
	}
	cycle(now)
	cycle(now)
	if got := stored[now/w]; got != 1 {
		t.Fatalf("the store counts %d for one admitted request", got)
	}
	if got := tb.Unsynced(e); got != 0 {
		t.Fatalf("the evicted entry still holds %d unpushed", got)
	}
}

// A decision taken back after its counter rolled over twice (a decision
// in a later window, on another goroutine, moved it on meanwhile) takes
// its increment back from the window it counted in, wherever that
// increment went: still stale on the node, or pushed already.
func TestUndoAfterTwoRolloversReachesTheStore(t *testing.T) {
	const w = int64(time.Second)
	rule := NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Second})
	for _, pushedFirst := range []bool{false, true} {
		tb := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true})
		stored := map[int64]int64{}
		cycle := func(now int64) {
			tb.Detach()
			for _, e := range tb.Touched(nil, 100) {
				pushes, again := tb.Take(e, now, nil)
				totals := make([]int64, len(pushes))
				for k, p := range pushes {
					stored[p.Win] += p.Delta
					totals[k] = stored[p.Win]
				}
				tb.Settle(e, now, pushes, totals)
				if again {
					tb.Requeue(e)
				}
			}
		}
		now := int64(100 * time.Hour)
		if d, st := tb.Allow("k", 1, now); st != Decided || !d.Allowed {
			t.Fatal("not admitted")
		}
		e := tb.load(tb.hash("k"), "k")
		var res reserved
		var buf [maxBuckets]int64
		if _, o, _ := tb.reserveWord(e, 0, 1, now, &res, buf[:]); o != admitted {
			t.Fatal("not admitted")
		}
		res.upto = 1
		later := now + 2*w
		tb.roll(e, 0, later/w, later)
		if pushedFirst {
			tb.Requeue(e)
			cycle(later)
		}
		tb.undoAll(e, &res, 1, now) // a later rule denied it
		cycle(later)
		cycle(later)
		if got := stored[now/w]; got != 1 {
			t.Fatalf("pushed first %v: the store counts %d for one admitted request", pushedFirst, got)
		}
		if got := tb.Unsynced(e); got != 0 {
			t.Fatalf("pushed first %v: %d left unpushed", pushedFirst, got)
		}
	}
}
