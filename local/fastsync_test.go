package local

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Decisions through Allow1's paths (Allow when it does not decide) racing
// with takes, settles and releases on one key lose nothing and count
// nothing twice, also when a later rule denies what an earlier one counted
// (taken back while a take moves it), within one window.
func TestConcurrentFastDecisionsAndTakesLoseNothing(t *testing.T) {
	sets := map[string][]Rule{
		"one":     {NewRule(Spec{Kind: Sliding, Limit: 5000, Window: time.Hour})},
		"two":     {NewRule(Spec{Kind: Sliding, Limit: 1 << 40, Window: time.Hour}), NewRule(Spec{Kind: Fixed, Limit: 5000, Window: 2 * time.Hour})},
		"buckets": {NewRule(Spec{Kind: Sliding, Limit: 1 << 40, Window: time.Hour}), NewRule(Spec{Kind: Buckets, Limit: 5000, Window: 4 * time.Hour, Buckets: 4})},
	}
	for name, rules := range sets {
		for _, share := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/share=%v", name, share), func(t *testing.T) {
				tb := NewTable(Options{Rules: rules, MaxKeys: 10, Syncing: true, Share: share, ReadPrev: int64(time.Minute)})
				now := int64(100 * time.Hour)
				const goroutines, each = 4, 4000
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for range goroutines {
					wg.Go(func() {
						for range each {
							if r, _, _ := tb.Allow1("k", 1, now); r >= 0 {
								admitted.Add(1)
							} else if d, st := tb.Allow("k", 1, now); st == Decided && d.Allowed {
								admitted.Add(1)
							}
						}
					})
				}
				pushed := make([]int64, len(rules))
				store := map[syncedCounter]int64{}
				sync1 := func(rng *rand.Rand) {
					e := tb.load(tb.hash("k"), "k")
					if e == nil {
						return
					}
					pushes, _ := tb.Take(e, now, nil)
					if rng.IntN(4) == 0 {
						tb.Release(e, pushes)
						return
					}
					totals := make([]int64, len(pushes))
					for i, p := range pushes {
						c := syncedCounter{"k", p.Rule, p.Win}
						store[c] += p.Delta
						totals[i] = store[c]
						pushed[p.Rule] += p.Delta
					}
					tb.Settle(e, now, pushes, totals)
				}
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					rng := rand.New(rand.NewPCG(1, 2))
					for {
						select {
						case <-stop:
							return
						default:
						}
						sync1(rng)
					}
				}()
				wg.Wait()
				close(stop)
				<-done
				e := tb.load(tb.hash("k"), "k")
				for tb.Unsynced(e) != 0 {
					sync1(rand.New(rand.NewPCG(3, 4)))
				}
				assert.Equal(t, int64(5000), admitted.Load())
				for i := range rules {
					assert.Equal(t, admitted.Load(), pushed[i], "rule %d", i)
				}
				assert.Zero(t, tb.Stats().Dropped)
			})
		}
	}
}
