package local

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestAllow1MatchesAllow runs one random sequence of decisions on two
// tables of the same rules: one asked through Allow1 first (Allow when it
// does not decide, as the root package does), the other through Allow
// only. Every answer and every count must be the same: Allow1 is a
// shorter path to Allow's decision, never a different one.
func TestAllow1MatchesAllow(t *testing.T) {
	ms := int64(time.Millisecond)
	sets := map[string][]Spec{
		"sliding":  {{Kind: Sliding, Limit: 20, Window: 100 * time.Millisecond}},
		"fixed":    {{Kind: Fixed, Limit: 20, Window: 100 * time.Millisecond}},
		"buckets":  {{Kind: Buckets, Limit: 30, Window: 200 * time.Millisecond, Buckets: 4}},
		"gcra":     {{Kind: GCRA, Limit: 20, Window: 100 * time.Millisecond, Burst: 5}},
		"two":      {{Kind: Sliding, Limit: 5, Window: 20 * time.Millisecond}, {Kind: Sliding, Limit: 30, Window: 300 * time.Millisecond}},
		"four":     {{Kind: Sliding, Limit: 6, Window: 30 * time.Millisecond}, {Kind: Fixed, Limit: 15, Window: 90 * time.Millisecond}, {Kind: Buckets, Limit: 40, Window: 400 * time.Millisecond, Buckets: 8}, {Kind: Sliding, Limit: 100, Window: time.Second}},
		"windows3": {{Kind: Fixed, Limit: 8, Window: 40 * time.Millisecond}, {Kind: Sliding, Limit: 25, Window: 150 * time.Millisecond}, {Kind: Sliding, Limit: 60, Window: 500 * time.Millisecond}},
		"windows4": {{Kind: Sliding, Limit: 6, Window: 30 * time.Millisecond}, {Kind: Fixed, Limit: 15, Window: 90 * time.Millisecond}, {Kind: Sliding, Limit: 40, Window: 400 * time.Millisecond}, {Kind: Sliding, Limit: 100, Window: time.Second}},
		"five":     {{Kind: Sliding, Limit: 6, Window: 30 * time.Millisecond}, {Kind: Fixed, Limit: 15, Window: 90 * time.Millisecond}, {Kind: Sliding, Limit: 20, Window: 200 * time.Millisecond}, {Kind: Sliding, Limit: 40, Window: 400 * time.Millisecond}, {Kind: Sliding, Limit: 100, Window: time.Second}},
		"mixedlog": {{Kind: Sliding, Limit: 6, Window: 30 * time.Millisecond}, {Kind: Log, Limit: 10, Window: 100 * time.Millisecond}},
	}
	for name, specs := range sets {
		for _, mode := range []string{"local", "syncing", "share"} {
			for _, denied := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/countDenied=%v", name, mode, denied), func(t *testing.T) {
					syncing := mode != "local"
					fast, slow := twinTables(specs, mode, denied)
					rng := rand.New(rand.NewPCG(1, uint64(len(name))))
					now := int64(time.Hour)
					fastHits := 0
					fastStore, slowStore := map[syncedCounter]int64{}, map[syncedCounter]int64{}
					nextSync := now
					for i := range 20000 {
						now += rng.Int64N(3 * ms)
						if syncing && now >= nextSync {
							// Both tables sync at the same instants to
							// stores where other nodes add the same counts.
							others := rng.Int64N(4)
							syncForTest(t, fast, fastStore, others, now)
							syncForTest(t, slow, slowStore, others, now)
							nextSync = now + 10*ms
						}
						key := fmt.Sprintf("k%d", rng.IntN(4))
						n := 1 + rng.Int64N(3)
						want, wst := slow.Allow(key, n, now)
						var got Decision
						gst := Decided
						if r, rem, reset := fast.Allow1(key, n, now); r >= 0 {
							fastHits++
							got = Decision{Allowed: true, Rule: r, Remaining: rem, ResetAfter: reset}
							want.Delay = 0 // Allow1 serves no rule that delays
						} else {
							got, gst = fast.Allow(key, n, now)
						}
						if got != want || gst != wst {
							t.Fatalf("decision %d (%s, n=%d, t=%d): Allow1 then Allow gave %+v %v, Allow alone %+v %v", i, key, n, now, got, gst, want, wst)
						}
					}
					t.Logf("%d of 20000 decisions taken by Allow1", fastHits)
				})
			}
		}
	}
}

// twinTables returns two tables of the rules specs in mode (local,
// syncing or share), counting denied requests when denied: one for
// Allow1, one for Allow.
func twinTables(specs []Spec, mode string, denied bool) (fast, slow *Table) {
	rules := make([]Rule, len(specs))
	for i, s := range specs {
		rules[i] = NewRule(s)
	}
	o := Options{Rules: rules, MaxKeys: 100, Syncing: mode != "local", ReadPrev: 20 * int64(time.Millisecond), CountDenied: denied, Share: mode == "share", Seed: 7}
	return NewTable(o), NewTable(o)
}

// syncedCounter names a store counter in syncForTest's map.
type syncedCounter struct {
	key  string
	rule int
	win  int64
}

// syncForTest runs one sync cycle of tb against the store st, in which
// other nodes add others to every counter pushed to.
func syncForTest(t *testing.T, tb *Table, st map[syncedCounter]int64, others, now int64) {
	t.Helper()
	var pushes []Push
	tb.Detach()
	for _, e := range tb.Touched(nil, math.MaxInt) {
		var again bool
		pushes, again = tb.Take(e, now, pushes[:0])
		totals := make([]int64, len(pushes))
		for j, p := range pushes {
			c := syncedCounter{e.key, p.Rule, p.Win}
			st[c] += p.Delta
			if p.Delta != 0 {
				st[c] += others
			}
			totals[j] = st[c]
		}
		tb.Settle(e, now, pushes, totals)
		if again {
			tb.Requeue(e)
		}
	}
}

// TestAllow1RulesAllOrNothing races decisions through Allow1 (Allow when
// it does not decide) on one key of three rules whose last is the
// tightest, at one instant: a request is counted on every rule or on
// none, so the tightest admits exactly its limit and every counter holds
// exactly what was admitted.
func TestAllow1RulesAllOrNothing(t *testing.T) {
	rules := []Rule{
		NewRule(Spec{Kind: Sliding, Limit: 1000, Window: time.Second}),
		NewRule(Spec{Kind: Fixed, Limit: 1000, Window: time.Minute}),
		NewRule(Spec{Kind: Sliding, Limit: 50, Window: time.Second}),
	}
	for _, syncing := range []bool{false, true} {
		tb := NewTable(Options{Rules: rules, MaxKeys: 10, Syncing: syncing})
		now := int64(time.Hour)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 200 {
					if r, _, _ := tb.Allow1("k", 1, now); r >= 0 {
						admitted.Add(1)
					} else if d, _ := tb.Allow("k", 1, now); d.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if admitted.Load() != 50 {
			t.Fatalf("syncing=%v: admitted %d, want 50", syncing, admitted.Load())
		}
		e := tb.load(tb.hash("k"), "k")
		for i := range rules {
			if got := word(e.ctr(i).word.Load()).count(); got != 50 {
				t.Errorf("syncing=%v: rule %d counts %d, want 50", syncing, i, got)
			}
		}
	}
}
