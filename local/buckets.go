package local

// Buckets rules: a window divided into Buckets sub-windows, each with its
// counter; the count over the window is the sum of its last Buckets
// counters, the current one included (the Redis-patterns way: one counter
// per second summed over the last 15 seconds). Exact at the granularity of
// a bucket, and additive, so it syncs by INCRBY like the other windows: a
// knob between the two-window sliding estimate and an exact log.

// bucketSum returns the count over the window.
func (r *Rule) bucketSum(b []int64) int64 {
	n := int64(0)
	for _, x := range b {
		n += x
	}
	return n
}

// bucketLevel returns the whole cost still admitted and how long from el
// into the current bucket until every counted bucket has left the window.
func (r *Rule) bucketLevel(b []int64, el int64) (remaining, reset int64) {
	remaining = max(r.limit-r.bucketSum(b), 0)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] != 0 {
			// Bucket i leaves when the window has moved i+1 buckets on.
			return remaining, int64(i+1)*r.w - el
		}
	}
	return remaining, 0
}

// bucketRetry returns how long from el into the current bucket until a
// request of cost n fits, as the oldest buckets leave the window one by
// one at bucket boundaries.
func (r *Rule) bucketRetry(b []int64, el, n int64) int64 {
	sum := r.bucketSum(b)
	for i := range b {
		if sum+n <= r.limit {
			return max(int64(i)*r.w-el, 0)
		}
		sum -= b[i] // at the next boundary, the oldest bucket leaves
	}
	return int64(len(b))*r.w - el
}

// bucketSlot returns the slot of closed bucket id among the rule's span
// slots: id modulo span, which is not negative for the ids before the Unix
// epoch either.
func (r *Rule) bucketSlot(id int64) int {
	s := id % r.span
	if s < 0 {
		s += r.span
	}
	return int(s)
}
