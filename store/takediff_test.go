package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// TestRedisTakeMatchesMemory sends the same calls to the Redis store and
// to the memory store: each call carries a few keys many times, at
// instants that cross window and bucket boundaries within the call, with
// peeks, costs up to the limit and CountDenied. Both stores decide a
// call's requests in order, each on the counts the earlier ones left, so
// every answer must be the same.
func TestRedisTakeMatchesMemory(t *testing.T) {
	c := redistest.Client(t)
	ms := time.Millisecond
	sets := map[string][]local.Spec{
		"sliding": {{Kind: local.Sliding, Limit: 4, Window: 100 * ms}},
		"fixed":   {{Kind: local.Fixed, Limit: 3, Window: 100 * ms}},
		"buckets": {{Kind: local.Buckets, Limit: 5, Window: 200 * ms, Buckets: 4}},
		"gcra":    {{Kind: local.GCRA, Limit: 2, Window: 100 * ms, Burst: 3}},
		"leaky":   {{Kind: local.Leaky, Limit: 3, Window: 100 * ms, Burst: 2}},
		"log":     {{Kind: local.Log, Limit: 4, Window: 100 * ms}},
		"mixed": {
			{Kind: local.Sliding, Limit: 3, Window: 50 * ms},
			{Kind: local.Fixed, Limit: 7, Window: 200 * ms},
			{Kind: local.Buckets, Limit: 8, Window: 300 * ms, Buckets: 3},
			{Kind: local.GCRA, Limit: 5, Window: 100 * ms, Burst: 4},
		},
		"mixedlog": {
			{Kind: local.Sliding, Limit: 3, Window: 50 * ms},
			{Kind: local.Log, Limit: 5, Window: 150 * ms},
			{Kind: local.Buckets, Limit: 8, Window: 300 * ms, Buckets: 3},
			{Kind: local.Leaky, Limit: 5, Window: 100 * ms, Burst: 4},
		},
	}
	for name, specs := range sets {
		t.Run(name, func(t *testing.T) {
			rules := make([]local.Rule, len(specs))
			minLimit := int64(1 << 40)
			for i, s := range specs {
				rules[i] = local.NewRule(s)
				minLimit = min(minLimit, s.Limit)
				if s.Kind == local.GCRA || s.Kind == local.Leaky {
					minLimit = min(minLimit, s.Burst)
				}
			}
			rs, mem := storetest.Redis(t, c), store.NewMemory(nil)
			pfx := redistest.Prefix(t)
			rng := rand.New(rand.NewPCG(3, uint64(len(name))))
			now := future * 1000 // µs
			allowed, total := 0, 0
			defer func() { t.Logf("%d of %d admitted", allowed, total) }()
			for call := range 60 {
				var rr, mr []*store.TakeRequest
				for range 1 + rng.IntN(40) {
					now += rng.Int64N(30_000)
					at := now - rng.Int64N(3)*rng.Int64N(5_000) // some instants out of order
					key := fmt.Sprint("k", rng.IntN(3))
					cost := 1 + rng.Int64N(minLimit)
					peek, denied := rng.IntN(8) == 0, rng.IntN(6) == 0
					for _, dst := range []*[]*store.TakeRequest{&rr, &mr} {
						*dst = append(*dst, &store.TakeRequest{Prefix: pfx, Key: key, Rules: rules, Now: at, Cost: cost,
							Peek: peek, CountDenied: denied, Deadline: time.Now().Add(time.Hour).UnixMicro()})
					}
				}
				require.NoError(t, rs.Take(context.Background(), rr))
				require.NoError(t, mem.Take(context.Background(), mr))
				for i := range rr {
					r, m := rr[i], mr[i]
					total++
					if r.Allowed {
						allowed++
					}
					require.Equal(t, store.Applied, r.Status, "%v", r.Err)
					require.Equal(t, store.Applied, m.Status, "%v", m.Err)
					require.Equal(t, m.Allowed, r.Allowed, "call %d request %d (%s at %d, cost %d, peek %v, countDenied %v): counts redis %+v memory %+v", call, i, r.Key, r.Now, r.Cost, r.Peek, r.CountDenied, r.Counts, m.Counts)
					require.Equal(t, m.Counts, r.Counts, "call %d request %d (%s at %d, cost %d, peek %v, countDenied %v)", call, i, r.Key, r.Now, r.Cost, r.Peek, r.CountDenied)
				}
			}
		})
	}
}
