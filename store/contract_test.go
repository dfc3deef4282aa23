package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// The store contract: every Store implementation passes the same tests.

func TestMemoryContract(t *testing.T) {
	runContract(t, func(t *testing.T) (store.Store, string) {
		return store.NewMemory(nil), "hl"
	})
}

func TestRedisContract(t *testing.T) {
	c := redistest.Client(t)
	runContract(t, func(t *testing.T) (store.Store, string) {
		return storetest.Redis(t, c), redistest.Prefix(t)
	})
}

// On a Redis Cluster a push script call carries the batches of many hash
// slots of one master, and a Take makes a call per slot.
func TestRedisClusterContract(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	t.Cleanup(func() { _ = c.Close() })
	runContract(t, func(t *testing.T) (store.Store, string) {
		return storetest.Redis(t, c), redistest.Prefix(t)
	})
}

// future is a minute boundary in 2030: counters of its windows expire long
// after the test, whatever the store's clock.
const future = int64(1_893_456_000_000) // ms

// batch returns a batch of ops on key for node, in key's group.
func batch(s store.Store, pfx, node, key string, seq uint64, ops ...store.Op) *store.Batch {
	for i := range ops {
		ops[i].Key = key
	}
	return &store.Batch{Prefix: pfx, Node: node, Group: s.Group(key), Seq: seq, Ops: ops}
}

func op(window, id, delta int64) store.Op {
	return store.Op{Counter: store.Counter{Window: window, ID: id}, Delta: delta}
}

func push(t *testing.T, s store.Store, bs ...*store.Batch) {
	t.Helper()
	require.NoError(t, s.Push(context.Background(), bs))
	for _, b := range bs {
		require.Equal(t, store.Applied, b.Status, "%v", b.Err)
		require.NoError(t, b.Err)
	}
}

func newTake(pfx, key string, nowMs, cost int64, peek, countDenied bool, rules ...local.Rule) *store.TakeRequest {
	return &store.TakeRequest{
		Prefix: pfx, Key: key, Rules: rules, Now: nowMs * 1000, Cost: cost, Peek: peek, CountDenied: countDenied,
		Deadline: time.Now().Add(time.Hour).UnixMicro(),
	}
}

func take(t *testing.T, s store.Store, rs ...*store.TakeRequest) {
	t.Helper()
	require.NoError(t, s.Take(context.Background(), rs))
	for _, r := range rs {
		require.Equal(t, store.Applied, r.Status, "%v", r.Err)
	}
}

func runContract(t *testing.T, open func(t *testing.T) (store.Store, string)) {
	const w = 60_000
	id := future / w
	t.Run("PushIncrementsAndReads", func(t *testing.T) {
		s, pfx := open(t)
		b := batch(s, pfx, "n1", "user", 1, op(w, id, 3), op(w, id, 4), op(w, id+1, 0), op(w, id, -2))
		push(t, s, b)
		assert.Equal(t, []int64{3, 7, 0, 5}, b.Totals)
		b = batch(s, pfx, "n1", "user", 2, op(w, id, 0), op(w, id+1, 0))
		push(t, s, b)
		assert.Equal(t, []int64{5, 0}, b.Totals, "a read never creates a counter")
		require.NoError(t, s.Push(context.Background(), nil), "nothing to push is fine")
	})
	t.Run("PushIsAtMostOnce", func(t *testing.T) {
		s, pfx := open(t)
		b := batch(s, pfx, "n1", "once", 7, op(w, id, 5))
		push(t, s, b)
		again := batch(s, pfx, "n1", "once", 7, op(w, id, 5))
		push(t, s, again)
		assert.Equal(t, []int64{5}, again.Totals, "sent again: applied once, the total read back")
		older := batch(s, pfx, "n1", "once", 6, op(w, id, 5))
		push(t, s, older)
		assert.Equal(t, []int64{5}, older.Totals, "an older batch of the group is never applied after a newer one")
		other := batch(s, pfx, "n2", "once", 7, op(w, id, 1))
		push(t, s, other)
		assert.Equal(t, []int64{6}, other.Totals, "another node's batches are its own")
		next := batch(s, pfx, "n1", "once", 8, op(w, id, 1))
		push(t, s, next)
		assert.Equal(t, []int64{7}, next.Totals)
	})
	t.Run("GroupsHoldWholeKeys", func(t *testing.T) {
		s, _ := open(t)
		for _, k := range []string{"a", "b", "{x}", "long key with spaces"} {
			g := s.Group(k)
			assert.GreaterOrEqual(t, g, 0)
			assert.Equal(t, g, s.Group(k), "stable")
		}
	})
	t.Run("ConcurrentPushesLoseNothing", func(t *testing.T) {
		s, pfx := open(t)
		var wg sync.WaitGroup
		for n := range 8 {
			wg.Go(func() {
				for i := range 50 {
					b := batch(s, pfx, fmt.Sprint("n", n), "busy", uint64(i+1), op(w, id, 2))
					assert.NoError(t, s.Push(context.Background(), []*store.Batch{b}))
					assert.Equal(t, store.Applied, b.Status)
				}
			})
		}
		wg.Wait()
		b := batch(s, pfx, "reader", "busy", 1, op(w, id, 0))
		push(t, s, b)
		assert.Equal(t, int64(800), b.Totals[0])
	})
	t.Run("TakeAdmitsUpToTheLimit", func(t *testing.T) {
		s, pfx := open(t)
		rule := wr(5, w)
		var allowed []bool
		for _, cost := range []int64{2, 2, 2, 1, 1} {
			r := newTake(pfx, "k", future+30_000, cost, false, false, rule)
			take(t, s, r)
			allowed = append(allowed, r.Allowed)
		}
		assert.Equal(t, []bool{true, true, false, true, false}, allowed)
		p := newTake(pfx, "k", future+30_000, 1, true, false, rule)
		take(t, s, p)
		assert.False(t, p.Allowed)
		assert.Equal(t, [][2]int64{{5, 0}}, cp(p.Counts))
	})
	t.Run("TakeWeighsThePreviousWindow", func(t *testing.T) {
		s, pfx := open(t)
		// Cloudflare's example: 42 in the previous minute, 18 in this one,
		// 15 s in: 42·0.75 + 18 = 49.5, so a limit of 50 admits nothing
		// more and a limit of 51 admits one.
		push(t, s, batch(s, pfx, "n", "slide", 1, op(w, id-1, 42), op(w, id, 18)))
		now := future + 15_000
		r := newTake(pfx, "slide", now, 1, false, false, wr(50, w))
		take(t, s, r)
		assert.False(t, r.Allowed)
		assert.Equal(t, [][2]int64{{18, 42}}, cp(r.Counts))
		r = newTake(pfx, "slide", now, 1, false, false, wr(51, w))
		take(t, s, r)
		assert.True(t, r.Allowed)
		assert.Equal(t, [][2]int64{{19, 42}}, cp(r.Counts))
		r = newTake(pfx, "slide", now, 1, false, false, fr(20, w))
		take(t, s, r)
		assert.True(t, r.Allowed, "a fixed window ignores the previous one")
		assert.Equal(t, [][2]int64{{20, 0}}, cp(r.Counts))
	})
	t.Run("TakeLateRequestSeesNewerCounts", func(t *testing.T) {
		// Two nodes whose clocks straddle a boundary: one has counted in
		// the next bucket (window) already when the other's request,
		// stamped just before the boundary, reaches the store. The late
		// request is decided in the newer bucket (window), on the counts
		// already there: never more than the limit in any window.
		s, pfx := open(t)
		buckets := local.NewRule(local.Spec{Kind: local.Buckets, Limit: 10, Window: time.Minute, Buckets: 6})
		edge := future + 10_000 // a bucket boundary
		a := newTake(pfx, "b", edge+1, 6, false, false, buckets)
		take(t, s, a)
		require.True(t, a.Allowed)
		late := newTake(pfx, "b", edge-1, 6, false, false, buckets)
		take(t, s, late)
		assert.False(t, late.Allowed, "6 counted in the next bucket, 6 more exceed 10")
		assert.Equal(t, []int64{0, 0, 0, 0, 0, 6}, late.Counts[0].Buckets, "the window of the newer bucket")
		assert.Zero(t, late.Counts[0].Elapsed, "decided at the newer bucket's start")
		late = newTake(pfx, "b", edge-1, 4, false, false, buckets)
		take(t, s, late)
		assert.True(t, late.Allowed)
		assert.Equal(t, []int64{0, 0, 0, 0, 0, 10}, late.Counts[0].Buckets, "counted in the newer bucket")
		again := newTake(pfx, "b", edge+2, 1, false, false, buckets)
		take(t, s, again)
		assert.False(t, again.Allowed)

		sliding := wr(10, w)
		edge = future + w // a window boundary
		a = newTake(pfx, "s", edge+1, 6, false, false, sliding)
		take(t, s, a)
		require.True(t, a.Allowed)
		late = newTake(pfx, "s", edge-1, 6, false, false, sliding)
		take(t, s, late)
		assert.False(t, late.Allowed, "6 counted in the next window, 6 more exceed 10")
		assert.Equal(t, [][2]int64{{6, 0}}, cp(late.Counts))
		late = newTake(pfx, "s", edge-1, 4, false, false, sliding)
		take(t, s, late)
		assert.True(t, late.Allowed)
		assert.Equal(t, [][2]int64{{10, 0}}, cp(late.Counts), "counted in the next window")
		again = newTake(pfx, "s", edge+2, 1, false, false, sliding)
		take(t, s, again)
		assert.False(t, again.Allowed)
	})
	t.Run("TakeChecksEveryRuleBeforeCounting", func(t *testing.T) {
		s, pfx := open(t)
		rules := []local.Rule{wr(10, 1000), wr(2, w)}
		var got []bool
		for range 3 {
			r := newTake(pfx, "multi", future, 1, false, false, rules...)
			take(t, s, r)
			got = append(got, r.Allowed)
		}
		assert.Equal(t, []bool{true, true, false}, got)
		r := newTake(pfx, "multi", future, 1, true, false, rules...)
		take(t, s, r)
		assert.Equal(t, [][2]int64{{2, 0}, {2, 0}}, cp(r.Counts), "the denied request counted in no rule")
	})
	t.Run("TakeCountDenied", func(t *testing.T) {
		s, pfx := open(t)
		rule := wr(1, 1000)
		for _, want := range []bool{true, false, false} {
			r := newTake(pfx, "penalty", future, 1, false, true, rule)
			take(t, s, r)
			assert.Equal(t, want, r.Allowed)
		}
		r := newTake(pfx, "penalty", future, 1, true, false, rule)
		take(t, s, r)
		assert.Equal(t, int64(3), r.Counts[0].Cur)
	})
	t.Run("TakeCountedDenialWaitsForItsOwnCharge", func(t *testing.T) {
		// Under CountDenied a denied request is logged too: the wait it is
		// told (Counts.Expire) counts its own entries, on every Log rule,
		// also one that admitted it before the charge.
		s, pfx := open(t)
		short := local.NewRule(local.Spec{Kind: local.Log, Limit: 2, Window: time.Second})
		long := local.NewRule(local.Spec{Kind: local.Log, Limit: 3, Window: 10 * time.Second})
		for _, at := range []int64{0, 100} {
			r := newTake(pfx, "penalty-log", future+at, 1, false, true, short, long)
			take(t, s, r)
			require.True(t, r.Allowed, "at %d ms", at)
		}
		r := newTake(pfx, "penalty-log", future+200, 1, false, true, short, long)
		take(t, s, r)
		require.False(t, r.Allowed)
		// Logged at 0, 100 and 200 ms: the short rule fits one more once
		// 0 and 100 have left (at 1100 ms), the long one once 0 has (at
		// 10,000 ms).
		assert.Equal(t, []int64{3, 3}, []int64{r.Counts[0].Cur, r.Counts[1].Cur})
		assert.Equal(t, []int64{int64(900 * time.Millisecond), int64(9800 * time.Millisecond)},
			[]int64{r.Counts[0].Expire, r.Counts[1].Expire})
	})
	t.Run("TakeBatchBadRequestsAndDeadline", func(t *testing.T) {
		s, pfx := open(t)
		rule := wr(1, 1000)
		good := newTake(pfx, "batch", future, 1, false, false, rule)
		good2 := newTake(pfx, "batch", future, 1, false, false, rule)
		bad := newTake(pfx, "", future, 1, false, false, rule)
		late := newTake(pfx, "late", future, 1, false, false, rule)
		late.Deadline = time.Now().Add(-time.Second).UnixMicro()
		require.NoError(t, s.Take(context.Background(), []*store.TakeRequest{good, bad, good2}))
		assert.Equal(t, store.Applied, good.Status)
		assert.Equal(t, store.Failed, bad.Status)
		assert.ErrorContains(t, bad.Err, "empty key")
		assert.Equal(t, store.Applied, good2.Status)
		assert.Equal(t, []bool{true, false}, []bool{good.Allowed, good2.Allowed}, "in order")
		require.NoError(t, s.Take(context.Background(), []*store.TakeRequest{late}))
		assert.Equal(t, store.Failed, late.Status, "past its deadline: not decided")
		assert.ErrorIs(t, late.Err, store.ErrDeadline)
		assert.ErrorIs(t, late.Err, store.ErrUnavailable)
		assert.NotErrorIs(t, bad.Err, store.ErrDeadline)
		p := newTake(pfx, "late", future, 1, true, false, rule)
		take(t, s, p)
		assert.Equal(t, int64(0), p.Counts[0].Cur, "nothing counted")
	})
	t.Run("TakeMixedPrefixesAndRules", func(t *testing.T) {
		// One Take carries requests of two prefixes and two sets of
		// rules, interleaved: each is counted under its own prefix and
		// rules, in order.
		s, pfx := open(t)
		other := pfx + "_other"
		one, two := []local.Rule{wr(2, 1000)}, []local.Rule{fr(1, 2000)}
		var rs []*store.TakeRequest
		for range 3 {
			rs = append(rs,
				newTake(pfx, "k", future, 1, false, false, one...),
				newTake(other, "k", future, 1, false, false, one...),
				newTake(pfx, "k", future, 1, false, false, two...))
		}
		take(t, s, rs...)
		var got []bool
		for _, r := range rs {
			got = append(got, r.Allowed)
		}
		assert.Equal(t, []bool{true, true, true, true, true, false, false, false, false}, got)
		// A request that failed in an earlier Take (its key was empty) is
		// decided when sent again, valid.
		r := newTake(pfx, "", future, 1, false, false, one...)
		require.NoError(t, s.Take(context.Background(), []*store.TakeRequest{r}))
		require.Equal(t, store.Failed, r.Status)
		r.Key = "again"
		take(t, s, r, newTake(other, "again", future, 1, false, false, one...))
		assert.True(t, r.Allowed)
	})
	t.Run("TakeOneCallSeesItsOwnWrites", func(t *testing.T) {
		// One call carries the same key several times, between other keys:
		// each request is decided on the counts the earlier ones left,
		// whatever the algorithm.
		s, pfx := open(t)
		specs := []local.Spec{
			{Kind: local.Sliding, Limit: 3, Window: time.Minute},
			{Kind: local.Fixed, Limit: 3, Window: time.Minute},
			{Kind: local.Buckets, Limit: 3, Window: time.Minute, Buckets: 4},
			{Kind: local.Log, Limit: 3, Window: time.Minute},
			{Kind: local.GCRA, Limit: 1, Window: time.Minute, Burst: 3},
			{Kind: local.Leaky, Limit: 1, Window: time.Minute, Burst: 3},
		}
		for _, spec := range specs {
			rules := []local.Rule{local.NewRule(spec)} // shared: one call
			var reqs []*store.TakeRequest
			for i := range 5 {
				reqs = append(reqs, newTake(pfx, fmt.Sprint("own", spec.Kind), future+30_000, 1, false, false, rules...))
				reqs = append(reqs, newTake(pfx, fmt.Sprint("other", spec.Kind, i), future+30_000, 1, false, false, rules...))
			}
			take(t, s, reqs...)
			for i, r := range reqs {
				want := i%2 == 1 || i/2 < 3
				assert.Equal(t, want, r.Allowed, "kind %v request %d (%q)", spec.Kind, i, r.Key)
			}
		}
	})
	t.Run("TakeFollowsLocalAdmits", func(t *testing.T) {
		// The store's admission rule is local.Rule.Admits: random cases,
		// including the boundaries of the floating-point comparison.
		s, pfx := open(t)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 200 {
			limit := 1 + rng.Int64N(100)
			win := []int64{1000, 7000, 60_000}[rng.IntN(3)]
			fixed := rng.IntN(4) == 0
			prev, cur := rng.Int64N(2*limit), rng.Int64N(limit+2)
			cost := 1 + rng.Int64N(limit)
			wid := future/win + int64(i)
			elapsed := rng.Int64N(win * 1000) // µs
			key := fmt.Sprint("adm", i)
			push(t, s, batch(s, pfx, "n", key, uint64(i+1), op(win, wid-1, prev), op(win, wid, cur)))
			r := newTake(pfx, key, 0, cost, true, false, rk(limit, win, fixed))
			r.Now = wid*win*1000 + elapsed
			take(t, s, r)
			lr := rk(limit, win, fixed)
			want := lr.Admits(local.Counts{Prev: prev, Cur: cur, Elapsed: elapsed * 1000}, cost)
			require.Equal(t, want, r.Allowed, "counts %v case %d: limit %d window %d fixed %v prev %d cur %d elapsed %dµs cost %d", r.Counts, i, limit, win, fixed, prev, cur, elapsed, cost)
		}
	})
	t.Run("PushMixesCountsAndArrivalTimes", func(t *testing.T) {
		// Counts and arrival times interleaved in one batch, sent again:
		// every total comes back at its own op, each applied once.
		s, pfx := open(t)
		g := local.NewRule(local.Spec{Kind: local.GCRA, Limit: 10, Window: time.Second}) // 100ms apart
		a := store.CounterOf(&g, "", 0)
		before := time.Now().UnixMicro()
		b := batch(s, pfx, "n", "mix", 1, store.Op{Counter: a, Delta: 2}, op(w, id, 3), store.Op{Counter: a, Delta: 0}, op(w, id, 4))
		push(t, s, b)
		after := time.Now().UnixMicro()
		assert.Equal(t, []int64{3, 7}, []int64{b.Totals[1], b.Totals[3]}, "the counts, in op order")
		assert.GreaterOrEqual(t, b.Totals[0], before+200_000, "two intervals past now")
		assert.LessOrEqual(t, b.Totals[0], after+200_000)
		assert.Equal(t, b.Totals[0], b.Totals[2], "a read of the same arrival time after it")
		again := batch(s, pfx, "n", "mix", 1, store.Op{Counter: a, Delta: 2}, op(w, id, 3), store.Op{Counter: a, Delta: 0}, op(w, id, 4))
		push(t, s, again)
		assert.Equal(t, []int64{b.Totals[0], 7, b.Totals[0], 7}, again.Totals, "sent again: nothing applied twice, the current values read back")
	})
	t.Run("TakeFollowsLocalAdmitsAtLargeLimits", func(t *testing.T) {
		// Limits so large that the comparison's slack (local.Epsilon) is
		// below the estimate's rounding: requests that bring the estimate
		// to the limit exactly, or one off, are decided as
		// local.Rule.Admits decides them, to the last bit.
		s, pfx := open(t)
		rng := rand.New(rand.NewPCG(5, 6))
		for i := range 300 {
			limit := 1<<30 + rng.Int64N(1<<40-1<<30)
			win := []int64{1000, 60_000, 3_600_000, 86_400_000, 366 * 86_400_000}[rng.IntN(5)]
			prev := rng.Int64N(2*limit) &^ 1
			cost := 1 + rng.Int64N(1000)
			elapsed := win * 500 // µs: half the window, prev weighs prev/2
			cur := limit - cost - prev/2 + rng.Int64N(3) - 1
			if cur < 0 {
				continue
			}
			wid := future/win + int64(i)
			key := fmt.Sprint("large", i)
			push(t, s, batch(s, pfx, "n", key, uint64(i+1), op(win, wid-1, prev), op(win, wid, cur)))
			r := newTake(pfx, key, 0, cost, true, false, wr(limit, win))
			r.Now = wid*win*1000 + elapsed
			take(t, s, r)
			lr := wr(limit, win)
			want := lr.Admits(local.Counts{Prev: prev, Cur: cur, Elapsed: elapsed * 1000}, cost)
			require.Equal(t, want, r.Allowed, "case %d: limit %d window %d ms prev %d cur %d elapsed %dµs cost %d", i, limit, win, prev, cur, elapsed, cost)
		}
	})
	t.Run("ArrivalTimesSaturate", func(t *testing.T) {
		// CountDenied moves a bucket's arrival time on with every denied
		// request, without bound: the store holds it at most
		// local.MaxAhead past its now, where it neither wraps around nor
		// loses precision (µs as a Lua number), and the key stays denied.
		s, pfx := open(t)
		slowest := local.NewRule(local.Spec{Kind: local.GCRA, Limit: 1, Window: 366 * 24 * time.Hour})
		limit := int64(local.MaxAhead / 1000) // µs
		c := store.CounterOf(&slowest, "", 0)
		for i, d := range []int64{1 << 20, 1, 1 << 40, 5} {
			before := time.Now().UnixMicro()
			b := batch(s, pfx, "n", "owes", uint64(i+1), store.Op{Counter: c, Delta: d})
			push(t, s, b)
			after := time.Now().UnixMicro()
			assert.GreaterOrEqual(t, b.Totals[0], before+limit-1000, "push %d of %d", i, d)
			assert.LessOrEqual(t, b.Totals[0], after+limit, "push %d of %d", i, d)
		}
		// The synchronous mode's decisions charge the same way.
		last := int64(0)
		for i := range 400 {
			r := newTake(pfx, "owes-sync", future, 1, false, true, slowest)
			take(t, s, r)
			require.Equal(t, i == 0, r.Allowed, "request %d", i)
			tat := r.Counts[0].Tat
			require.GreaterOrEqual(t, tat, last, "request %d", i)
			require.LessOrEqual(t, tat, int64(local.MaxAhead), "request %d", i)
			last = tat
		}
		assert.Equal(t, int64(local.MaxAhead/1000*1000), last)
	})
}

// wr, fr and rk return a sliding or fixed rule of limit per window ms.
func wr(limit, window int64) local.Rule { return rk(limit, window, false) }
func fr(limit, window int64) local.Rule { return rk(limit, window, true) }
func rk(limit, window int64, fixed bool) local.Rule {
	k := local.Sliding
	if fixed {
		k = local.Fixed
	}
	return local.NewRule(local.Spec{Kind: k, Limit: limit, Window: time.Duration(window) * time.Millisecond})
}

// cp returns the current and previous windows' counts of cs.
func cp(cs []local.Counts) [][2]int64 {
	var out [][2]int64
	for _, c := range cs {
		out = append(out, [2]int64{c.Cur, c.Prev})
	}
	return out
}
