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

// gcraAdmits reports whether a request of cost n fits when TAT − now is
// ahead (ns).
func (r *Rule) gcraAdmits(ahead, n int64) bool {
	return max(ahead, 0)+n*r.t <= r.burst*r.t
}

// gcraLevel returns, for TAT − now = ahead, the whole cost still admitted
// now and how long until the bucket is back to its full size.
func (r *Rule) gcraLevel(ahead int64) (remaining, reset int64) {
	ahead = max(ahead, 0)
	return (r.burst*r.t - ahead) / r.t, ahead
}

// gcraRetry returns how long until a request of cost n fits when TAT − now
// is ahead: until TAT has come n intervals within the burst.
func (r *Rule) gcraRetry(ahead, n int64) int64 {
	return max(max(ahead, 0)+n*r.t-r.burst*r.t, 0)
}
