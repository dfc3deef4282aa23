package local

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The slowest bucket the root package accepts: 1 per MaxWindow (366 days),
// burst 1. Its interval is 3.16e16 ns, so that some 235 charges from 2026
// take an arrival time past the end of int64 nanoseconds.
const (
	slowWindow = 366 * 24 * time.Hour
	now2026    = int64(1_767_225_600) * int64(time.Second) // 2026-01-01T00:00:00Z
)

func slowBucket(kind Kind) Rule {
	return NewRule(Spec{Kind: kind, Limit: 1, Window: slowWindow})
}

// Under CountDenied every denied request moves a bucket's arrival time
// on. A client that keeps retrying owes more and more, and must stay
// denied however many it sends: the arrival time saturates instead of
// wrapping into the past.
func TestCountDeniedBucketStaysDenied(t *testing.T) {
	for _, kind := range []Kind{GCRA, Leaky} {
		for _, syncing := range []bool{false, true} {
			name := map[bool]string{false: "local", true: "syncing"}[syncing]
			t.Run(kind.String()+"/"+name, func(t *testing.T) {
				tb := NewTable(Options{Rules: []Rule{slowBucket(kind)}, MaxKeys: 10, Syncing: syncing, CountDenied: true})
				require.True(t, allow(t, tb, "k", 1, now2026))
				last := int64(0)
				for i := range 1000 {
					d, st := tb.Allow("k", 1, now2026)
					require.Equal(t, Decided, st)
					require.False(t, d.Allowed, "request %d admitted", i)
					// The wait only grows, up to its saturation.
					require.GreaterOrEqual(t, d.RetryAfter, max(last, 1), "request %d", i)
					last = d.RetryAfter
				}
				// Two intervals later the debt of a thousand intervals (saturated at decades) is still
				// there.
				later := now2026 + 2*int64(slowWindow)
				d, _ := tb.Allow("k", 1, later)
				assert.False(t, d.Allowed)
				assert.GreaterOrEqual(t, d.RetryAfter, int64(50*slowWindow))
				assert.False(t, tb.Peek("k", 1, later).Allowed)
				var v [1]Counts
				tb.View("k", later, 1, v[:])
				assert.GreaterOrEqual(t, v[0].Tat, int64(50*slowWindow))
			})
		}
	}
}

// The store's arrival time (µs) comes back through Settle. However far
// ahead the store holds it, the node reads it as far ahead, not past.
func TestSettledArrivalTimeSaturates(t *testing.T) {
	tb := NewTable(Options{Rules: []Rule{slowBucket(GCRA)}, MaxKeys: 10, Syncing: true, CountDenied: true})
	require.True(t, allow(t, tb, "k", 1, now2026))
	e := entry(t, tb, "k")
	for _, tat := range []int64{math.MaxInt64 / 1000, math.MaxInt64/1000 + 1, math.MaxInt64} {
		pushes, _ := tb.Take(e, now2026, nil)
		tb.Settle(e, now2026, pushes, []int64{tat})
		d, _ := tb.Allow("k", 1, now2026)
		assert.False(t, d.Allowed, "store arrival time %d µs", tat)
		assert.Positive(t, d.RetryAfter, "store arrival time %d µs", tat)
	}
}

// The synchronous mode's view of a bucket comes from the store's reply
// (Observe, in a table that syncs): however far ahead it says, the node reads it as far ahead.
func TestObservedArrivalTimeSaturates(t *testing.T) {
	tb := NewTable(Options{Rules: []Rule{slowBucket(GCRA)}, MaxKeys: 10, Syncing: true, CountDenied: true})
	tb.Observe("k", now2026, []Counts{{Tat: math.MaxInt64}}, false, true)
	var v [1]Counts
	tb.View("k", now2026, 1, v[:])
	assert.GreaterOrEqual(t, v[0].Tat, int64(MaxAhead))
	assert.False(t, tb.Peek("k", 1, now2026).Allowed)
}

// At the extremes of what the root package accepts, the arrival-time
// arithmetic is exact up to its saturation, and what a decision adds to
// it stays within int64: checked against math/big.
func TestArrivalTimeArithmeticInRange(t *testing.T) {
	rules := []Rule{
		slowBucket(GCRA), // the longest interval
		NewRule(Spec{Kind: GCRA, Limit: 1, Window: slowWindow, Burst: 1}),
		// The largest limit and burst, an interval of just over 1µs
		// rounded up to 2µs.
		NewRule(Spec{Kind: Leaky, Limit: 1 << 40, Window: 1_099_511_628 * time.Millisecond, Burst: 1 << 40}),
		// 334µs rounded up from 333.3, the largest burst that refills
		// within MaxWindow.
		NewRule(Spec{Kind: GCRA, Limit: 3, Window: time.Millisecond, Burst: int64(slowWindow) * 3 / int64(time.Millisecond)}),
		NewRule(Spec{Kind: GCRA, Limit: 1 << 40, Window: slowWindow, Burst: 1 << 40}), // the longest refill
	}
	big0 := func(x int64) *big.Int { return big.NewInt(x) }
	limit := new(big.Int).Lsh(big.NewInt(1), 63)
	fits := func(x *big.Int) bool { return x.Cmp(limit) < 0 && x.Cmp(new(big.Int).Neg(limit)) >= 0 }
	for _, r := range rules {
		require.Less(t, r.burst*r.t, int64(1)<<56, "burst·T of %v", r)
		for _, prev := range []int64{0, now2026, 1 << 62} {
			for _, now := range []int64{0, now2026, 1<<62 - 1} {
				for _, cur := range []int64{0, 1, r.owed, maxPending, math.MaxInt64} {
					ahead := r.syncedAhead(prev, cur, now)
					want := new(big.Int).Sub(big0(prev), big0(now))
					if want.Sign() < 0 {
						want.SetInt64(0)
					}
					want.Add(want, new(big.Int).Mul(big0(min(cur, r.owed)), big0(r.t)))
					require.True(t, fits(want))
					require.Equal(t, min(want.Int64(), MaxAhead), ahead, "prev %d now %d cur %d", prev, now, cur)
					// What the decision adds to it.
					for _, n := range []int64{1, r.burst} {
						sum := new(big.Int).Add(big0(ahead), new(big.Int).Mul(big0(n), big0(r.t)))
						require.True(t, fits(sum))
						r.gcraAdmits(ahead, n)
						require.GreaterOrEqual(t, r.gcraRetry(ahead, n), int64(0))
					}
					// A local charge from any arrival time this far ahead.
					tat := r.chargedTat(now+min(ahead, MaxAhead), r.burst, now)
					require.Equal(t, now+min(min(ahead, MaxAhead)+r.burst*r.t, MaxAhead), tat)
				}
			}
		}
	}
}
