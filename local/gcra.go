package local

// GCRA and Leaky rules: the generic cell rate algorithm. A key keeps its
// theoretical arrival time (TAT): the instant at which its bucket would be
// full again. A request of cost n at now takes the slot max(TAT, now) and
// moves TAT n emission intervals T (Window/Limit) past it; it is admitted
// when the new TAT is at most Burst·T ahead of now:
//
//	tat' = max(tat, now) + n·T      admit iff tat' − now ≤ Burst·T
//
// For GCRA, Burst is the bucket size (x/time/rate's burst: the same
// arrivals are admitted) and an admitted request proceeds at once. For
// Leaky, Burst is the queue size and an admitted request waits until its
// slot, max(tat, now): requests leave at the fixed rate, and are refused
// when the queue is full.

// MaxAhead is the furthest past now that a GCRA or Leaky rule's arrival
// time runs (ns), some 73 years. Only CountDenied moves it past Burst
// intervals: every denied request charges its cost, without end while a
// client keeps retrying, so the arrival time saturates there (the key
// stays denied; a retry in decades is as good as never) instead of
// wrapping past the end of int64 into the past, which would admit. The
// stores of package store saturate their arrival times at the same point.
//
// The bound keeps every sum of the arrival-time arithmetic within int64.
// With now in [0, 2^62) (1970 to 2116), an arrival time read from the
// store in [0, 2^62] ns (storedTat clamps it), a pending cost counted as
// at most MaxAhead (Rule.owed) and a request's cost of at most Burst
// intervals, which the root package's validation keeps below 2^56
// (Burst·Window/Limit ≤ MaxWindow < 2^55, and an interval, rounded up to
// a whole µs, is less than twice Window/Limit ≥ 1µs): syncedAhead's sum
// is at most 2^62 + 2^61 before its cap, chargedTat's too, and a decision
// adds a cost of at most 2^56 to a TAT − now of at most MaxAhead.
// TestArrivalTimeArithmeticInRange checks the extremes.
const MaxAhead = 1 << 61

// syncedAhead returns TAT − now in a table that syncs, at most MaxAhead:
// the store's arrival time as last read, prev, moved by cur, this node's
// cost not yet in it.
func (r *Rule) syncedAhead(prev, cur, now int64) int64 {
	return min(max(prev-now, 0)+min(cur, r.owed)*r.t, MaxAhead)
}

// storedTat returns, in ns, an arrival time a store holds in µs, clamped
// to [0, 2^62] ns: a store saturates its arrival times at MaxAhead past
// its now, and the clamp keeps a value it did not (a foreign writer, a
// clock far off) from wrapping around.
func storedTat(us int64) int64 {
	return min(max(us, 0), 1<<62/1000) * 1000
}

// chargedTat returns the arrival time tat moved by a charge of cost n at
// now, saturated at MaxAhead past now.
func (r *Rule) chargedTat(tat, n, now int64) int64 {
	return now + min(max(tat-now, 0)+n*r.t, MaxAhead)
}

// gcraAdmits reports whether a request of cost n fits when TAT − now is
// ahead (ns).
func (r *Rule) gcraAdmits(ahead, n int64) bool {
	return max(ahead, 0)+n*r.t <= r.burst*r.t
}

// gcraLevel returns, for TAT − now = ahead, the whole cost still admitted
// now and how long until the bucket is back to its full size.
func (r *Rule) gcraLevel(ahead int64) (remaining, reset int64) {
	ahead = max(ahead, 0)
	return max(r.burst*r.t-ahead, 0) / r.t, ahead
}

// gcraRetry returns how long until a request of cost n fits when TAT − now
// is ahead: until TAT has come n intervals within the burst.
func (r *Rule) gcraRetry(ahead, n int64) int64 {
	return max(max(ahead, 0)+n*r.t-r.burst*r.t, 0)
}
