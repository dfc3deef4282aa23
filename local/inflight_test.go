package local

import (
	"fmt"
	"testing"
	"time"
)

// Increments that a take moved into a batch stay counted as
// unacknowledged (Unsynced, Stats, and so Close's error and Stats.Pending)
// until the store answers, however many rollovers happen meanwhile, and
// keep their entry from being evicted: a batch that then fails hands its
// increments back to the entry, which must still be in the table to push
// them.
func TestTakenIncrementsStayUnsyncedAcrossRollovers(t *testing.T) {
	const w = int64(time.Second)
	rule := NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Second})
	start := int64(100 * time.Hour) // a window boundary
	cases := []struct {
		name  string
		rolls []int64 // windows (after the take's) the counter rolls into before the answer
	}{
		{"no rollover", nil},
		{"one rollover", []int64{1}},
		{"two windows at once", []int64{2}},
		{"two rollovers", []int64{1, 2}},
		{"three rollovers", []int64{1, 2, 3}},
	}
	for _, c := range cases {
		for _, applied := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/applied=%v", c.name, applied), func(t *testing.T) {
				tb := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true})
				for range 5 {
					if d, st := tb.Allow("k", 1, start); st != Decided || !d.Allowed {
						t.Fatal("not admitted")
					}
				}
				e := tb.load(tb.hash("k"), "k")
				pushes, _ := tb.Take(e, start, nil)
				now := start
				for _, r := range c.rolls {
					now = start + r*w
					tb.roll(e, 0, start/w+r, now)
				}
				if got := tb.Unsynced(e); got != 5 {
					t.Fatalf("taken, unanswered: Unsynced %d, want 5", got)
				}
				if got := tb.Stats().Unsynced; got != 5 {
					t.Fatalf("taken, unanswered: Stats.Unsynced %d, want 5", got)
				}
				now += 3 * w // idle beyond twice the window
				if n := tb.Evict(now); n != 0 {
					t.Fatalf("evicted %d entries holding a batch the store has not answered", n)
				}
				if applied {
					totals := make([]int64, len(pushes)) // the reads' totals: 0
					totals[0] = 5
					tb.Settle(e, now, pushes, totals)
					if got := tb.Unsynced(e); got != 0 {
						t.Fatalf("applied: Unsynced %d, want 0", got)
					}
					if n := tb.Evict(now); n != 1 {
						t.Fatalf("applied and idle: evicted %d, want 1", n)
					}
					return
				}
				tb.Release(e, pushes)
				if got := tb.Unsynced(e); got+int64(tb.Stats().Dropped) != 5 {
					t.Fatalf("released: Unsynced %d + Dropped %d, want 5", got, tb.Stats().Dropped)
				}
				// The next take carries them (or they were dropped as too
				// old, and counted so); once applied, nothing is left.
				pushes, _ = tb.Take(e, now, nil)
				sum := int64(0)
				for _, p := range pushes {
					sum += p.Delta
				}
				if sum+int64(tb.Stats().Dropped) != 5 {
					t.Fatalf("pushed again %d + dropped %d, want 5", sum, tb.Stats().Dropped)
				}
				if got := tb.Unsynced(e); got != sum {
					t.Fatalf("taken again: Unsynced %d, want %d", got, sum)
				}
				totals := make([]int64, len(pushes))
				tb.Settle(e, now, pushes, totals)
				if got := tb.Unsynced(e); got != 0 {
					t.Fatalf("applied: Unsynced %d, want 0", got)
				}
			})
		}
	}
}
