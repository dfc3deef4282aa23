package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// The bounds the root package accepts (hybridlimit.MaxLimit,
// hybridlimit.MaxWindow, MaxBuckets, MaxLogLimit), restated here: the
// store package does not import the root package.
const (
	maxLimit  = int64(1) << 40
	maxWindow = 366 * 24 * time.Hour
)

// Limits, costs and windows at their bounds: the Redis store decides as
// the memory store does (Lua numbers hold every value exactly: counts up
// to a few times 2^40, instants and windows in µs below 2^55, multiples of
// 1,000), and a counter expires when ExpireAt says.
func TestRedisExtremes(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	sets := map[string][]local.Spec{
		"sliding":  {{Kind: local.Sliding, Limit: maxLimit, Window: maxWindow}},
		"fixed":    {{Kind: local.Fixed, Limit: maxLimit, Window: maxWindow}},
		"buckets":  {{Kind: local.Buckets, Limit: maxLimit, Window: maxWindow, Buckets: 64}},
		"log":      {{Kind: local.Log, Limit: 1 << 16, Window: maxWindow}},
		"gcra":     {{Kind: local.GCRA, Limit: 1, Window: maxWindow, Burst: 1}},
		"gcra-max": {{Kind: local.GCRA, Limit: maxLimit, Window: maxWindow, Burst: maxLimit}},
		"leaky":    {{Kind: local.Leaky, Limit: 1, Window: maxWindow, Burst: 1}},
		"mixed": {
			{Kind: local.Sliding, Limit: maxLimit, Window: maxWindow},
			{Kind: local.Fixed, Limit: maxLimit, Window: time.Millisecond},
		},
	}
	for name, specs := range sets {
		t.Run(name, func(t *testing.T) {
			rules := make([]local.Rule, len(specs))
			cost := maxLimit
			for i, s := range specs {
				rules[i] = local.NewRule(s)
				cost = min(cost, s.Limit)
				if s.Kind == local.GCRA || s.Kind == local.Leaky {
					cost = min(cost, s.Burst)
				}
			}
			rs, mem := storetest.Redis(t, c), store.NewMemory(nil)
			pfx := redistest.Prefix(t)
			now := time.Now().UnixMicro()
			deadline := time.Now().Add(time.Hour).UnixMicro()
			steps := []struct {
				cost              int64
				peek, countDenied bool
				at                int64 // µs after now
			}{
				{cost, false, false, 0}, // the whole limit at once
				{1, false, false, 1},    // denied
				{cost, true, false, 2},  // peek
				{cost, false, true, 3},  // counted though denied
				{1, false, true, int64(maxWindow / time.Microsecond)},
			}
			for i, st := range steps {
				r := &store.TakeRequest{Prefix: pfx, Key: "k", Rules: rules, Now: now + st.at, Cost: st.cost, Peek: st.peek, CountDenied: st.countDenied, Deadline: deadline}
				m := *r
				require.NoError(t, rs.Take(ctx, []*store.TakeRequest{r}))
				require.NoError(t, mem.Take(ctx, []*store.TakeRequest{&m}))
				require.Equal(t, store.Applied, r.Status, "step %d: %v", i, r.Err)
				require.Equal(t, m.Allowed, r.Allowed, "step %d: redis %+v memory %+v", i, r.Counts, m.Counts)
				require.Equal(t, m.Counts, r.Counts, "step %d", i)
			}
			if specs[0].Kind == local.Sliding || specs[0].Kind == local.Fixed {
				w, span := rules[0].Counter()
				id := now / w.Microseconds()
				key := store.CounterKey(pfx, store.CounterOf(&rules[0], "k", id))
				ttl, err := c.PTTL(ctx, key).Result()
				require.NoError(t, err)
				want := time.Until(time.UnixMilli(store.ExpireAt(w.Milliseconds(), id, span)))
				assert.InDelta(t, float64(want), float64(ttl), float64(2*time.Second), "the counter expires when ExpireAt says")
			}
		})
	}
}

// Pushes at the bounds: a window of MaxWindow and deltas of MaxLimit are
// added exactly, and the counter expires when ExpireAt says.
func TestRedisPushExtremes(t *testing.T) {
	c := redistest.Client(t)
	s := storetest.Redis(t, c)
	pfx := redistest.Prefix(t)
	ctx := context.Background()
	w := maxWindow.Milliseconds()
	id := time.Now().UnixMilli() / w
	for _, span := range []int64{1, 64} {
		win := w / span
		bid := time.Now().UnixMilli() / win
		if span == 1 {
			bid = id
		}
		o := store.Op{Counter: store.Counter{Window: win, ID: bid, Span: span}, Delta: maxLimit}
		for seq := uint64(1); seq <= 3; seq++ {
			b := batch(s, pfx, "n", "k", 10*uint64(span)+seq, o)
			push(t, s, b)
			assert.Equal(t, []int64{int64(seq) * maxLimit}, b.Totals)
		}
		o.Key = "k"
		ttl, err := c.PTTL(ctx, store.CounterKey(pfx, o.Counter)).Result()
		require.NoError(t, err)
		want := time.Until(time.UnixMilli(store.ExpireAt(win, bid, span)))
		assert.InDelta(t, float64(want), float64(ttl), float64(2*time.Second), "span %d", span)
	}
}

// A Log request of the largest cost (MaxLogLimit instants) on a full log
// takes the memory store time in proportion to the log, not to its square
// (which held the store's lock for a minute).
func TestMemoryLogLargeCost(t *testing.T) {
	s := store.NewMemory(nil)
	rules := []local.Rule{local.NewRule(local.Spec{Kind: local.Log, Limit: 1 << 16, Window: time.Hour})}
	start := time.Now()
	for i := range 3 {
		r := newTake("hl", "k", future+int64(i), 1<<16, false, true, rules...)
		take(t, s, r)
		assert.Equal(t, i == 0, r.Allowed, "request %d", i)
	}
	assert.Less(t, time.Since(start), 2*time.Second)
}
