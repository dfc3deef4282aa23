package local

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// An eviction marks its entry dead, looks again, and clears the mark when
// a decision counted meanwhile (tryEvict): a decision that saw the mark
// and then finds it cleared keeps its increment in the entry, which stays.
// It must not wait for a final flush: the table is not closed. Here a
// goroutine marks and clears one key's entry as such evictions do, while
// decisions on the key go through every path.
func TestDecisionSeesACancelledEviction(t *testing.T) {
	sliding := NewRule(Spec{Kind: Sliding, Limit: 1 << 40, Window: time.Hour})
	fixed := NewRule(Spec{Kind: Fixed, Limit: 1 << 40, Window: 2 * time.Hour})
	buckets := NewRule(Spec{Kind: Buckets, Limit: 1 << 40, Window: 4 * time.Hour, Buckets: 4})
	sets := map[string][]Rule{"one": {sliding}, "two": {sliding, fixed}, "buckets": {sliding, buckets}}
	for name, rules := range sets {
		for _, share := range []bool{false, true} {
			for _, fast := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/share=%v/Allow1=%v", name, share, fast), func(t *testing.T) {
					tb := NewTable(Options{Rules: rules, MaxKeys: 10, Syncing: share, Share: share})
					now := int64(100 * time.Hour)
					if _, st := tb.Allow("k", 1, now); st != Decided {
						t.Fatal(st)
					}
					e := tb.load(tb.hash("k"), "k")
					var stop atomic.Bool
					var wg sync.WaitGroup
					started := make(chan struct{})
					wg.Go(func() {
						close(started)
						for i := 0; !stop.Load(); i++ {
							tb.mu(e).Lock()
							e.set(flagDead, true)
							for range i % 64 { // looking again takes a while
								_ = e.lastSeen.Load()
							}
							e.set(flagDead, false)
							tb.mu(e).Unlock()
						}
					})
					defer func() { stop.Store(true); wg.Wait() }()
					<-started
					done := make(chan int)
					go func() {
						admitted, n := 0, 0
						for start := time.Now(); time.Since(start) < 200*time.Millisecond; n++ {
							if fast {
								if r, _, _ := tb.Allow1("k", 1, now); r >= 0 {
									admitted++
									continue
								}
							}
							if d, st := tb.Allow("k", 1, now); st == Decided && d.Allowed {
								admitted++
							}
						}
						done <- n - admitted
					}()
					select {
					case denied := <-done:
						if denied != 0 {
							t.Fatalf("%d decisions not admitted", denied)
						}
					case <-time.After(5 * time.Second):
						t.Fatal("a decision is blocked")
					}
				})
			}
		}
	}
}
