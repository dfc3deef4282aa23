package local

import (
	"math/rand/v2"
	"testing"
	"time"

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
