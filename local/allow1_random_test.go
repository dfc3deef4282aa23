package local

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestAllow1MatchesAllowRandomSets is TestAllow1MatchesAllow over random
// sets of one to four Sliding, Fixed and Buckets rules: limits from 1
// (costs up to the limit) to near MaxLimit, windows from 1 ms to a year,
// instants from an hour after the Unix epoch on, other nodes joining
// mid-sequence (keys become shared), and the tables closed mid-sequence.
func TestAllow1MatchesAllowRandomSets(t *testing.T) {
	ms := int64(time.Millisecond)
	windows := []time.Duration{time.Millisecond, 3 * time.Millisecond, 7 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond, time.Second, time.Hour, 366 * 24 * time.Hour}
	for set := range 200 {
		rng := rand.New(rand.NewPCG(uint64(set), 99))
		nr := 1 + rng.IntN(4)
		var specs []Spec
		minLimit := int64(1 << 40)
		used := map[time.Duration]bool{}
		for len(specs) < nr {
			w := windows[rng.IntN(len(windows))]
			if used[w] {
				continue
			}
			used[w] = true
			k := Sliding
			buckets := 0
			switch rng.IntN(4) {
			case 0:
				k = Fixed
			case 1:
				if w >= 20*time.Millisecond {
					k, buckets = Buckets, 4
				}
			}
			limit := 1 + rng.Int64N(6)
			if rng.IntN(6) == 0 {
				limit = 1<<40 - rng.Int64N(3)
			}
			specs = append(specs, Spec{Kind: k, Limit: limit, Window: w, Buckets: buckets})
			minLimit = min(minLimit, limit)
		}
		mode := []string{"local", "syncing", "share"}[rng.IntN(3)]
		denied := rng.IntN(2) == 0
		closeAt := -1
		if rng.IntN(4) == 0 {
			closeAt = rng.IntN(3000)
		}
		joinAt := rng.IntN(3000)
		t.Run(fmt.Sprintf("%d/%v/%s/countDenied=%v", set, specs, mode, denied), func(t *testing.T) {
			syncing := mode != "local"
			fast, slow := twinTables(specs, mode, denied)
			now := int64(time.Hour) * (1 + rng.Int64N(400000))
			fastStore, slowStore := map[syncedCounter]int64{}, map[syncedCounter]int64{}
			nextSync := now
			step := []int64{ms / 10, ms, 3 * ms}[rng.IntN(3)]
			for i := range 3000 {
				now += rng.Int64N(step)
				if i == closeAt {
					fast.Close()
					slow.Close()
				}
				if syncing && now >= nextSync && i != closeAt {
					others := int64(0)
					if i >= joinAt {
						others = rng.Int64N(4)
						if minLimit > 1000 {
							others = rng.Int64N(1 << 38)
						}
					}
					syncForTest(t, fast, fastStore, others, now)
					syncForTest(t, slow, slowStore, others, now)
					nextSync = now + 10*ms
				}
				key := fmt.Sprintf("k%d", rng.IntN(3))
				n := 1 + rng.Int64N(minLimit)
				if minLimit > 1000 && rng.IntN(2) == 0 {
					n = minLimit - rng.Int64N(3)
				}
				want, wst := slow.Allow(key, n, now)
				var got Decision
				gst := Decided
				if r, rem, reset := fast.Allow1(key, n, now); r >= 0 {
					got = Decision{Allowed: true, Rule: r, Remaining: rem, ResetAfter: reset}
				} else {
					got, gst = fast.Allow(key, n, now)
				}
				if got != want || gst != wst {
					t.Fatalf("decision %d (%s, n=%d, t=%d): Allow1 then Allow gave %+v %v, Allow alone %+v %v", i, key, n, now, got, gst, want, wst)
				}
			}
		})
	}
}
