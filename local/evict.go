package local

// Eviction: entries idle long enough that their counters no longer matter.

// Evict removes the entries that have seen no decision for twice the
// longest window and whose token and leaky buckets are full at now (their
// counters can no longer influence a decision), and that hold nothing the
// store has not acknowledged, and returns how many it removed.
func (t *Table) Evict(now int64) int {
	n := 0
	idle := 2 * t.longest
	t.rangeEntries(func(e *Entry) bool {
		if now-e.lastSeen.Load() > idle && t.tryEvict(e, now, now-idle) {
			n++
		}
		return true
	})
	return n
}

func (t *Table) tryEvict(e *Entry, now, seenBefore int64) bool {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	if (t.syncing && t.hasUnsynced(e)) || e.has(flagSealed) || !t.bucketsFull(e, now) {
		return false
	}
	var words [MaxRules]uint64
	for i := range t.rules {
		words[i] = e.ctr(i).word.Load()
	}
	e.set(flagDead, true)
	// A decision that committed after our first look sees the flag and
	// retries on a fresh entry, or we see its increment here and keep e.
	// One that committed before our first look records its time before it
	// reads the flag: if it did not see the flag, we see its time here
	// (both are sequentially consistent atomics) and keep e, which would
	// otherwise be removed with the increment.
	changed := e.lastSeen.Load() > seenBefore
	for i := range t.rules {
		changed = changed || e.ctr(i).word.Load() != words[i]
	}
	if changed {
		e.set(flagDead, false)
		return false
	}
	t.remove(t.hash(e.key), e)
	t.entries.Add(-1)
	t.keys.Add(-1)
	t.evicted.Add(1)
	return true
}

// bucketsFull reports whether every GCRA and Leaky rule of e admits its
// whole burst at now: a bucket whose arrival time is still ahead (a burst
// that refills over more than two windows, or CountDenied's charges)
// would be full again, and admit a burst at once, if e were removed. Call
// with e's mutex held.
func (t *Table) bucketsFull(e *Entry, now int64) bool {
	for i := range t.rules {
		r, c := &t.rules[i], e.ctr(i)
		switch {
		case r.kind != GCRA && r.kind != Leaky:
		case !t.syncing:
			if c.base.Load() > now { // the arrival time itself
				return false
			}
		case r.syncedAhead(c.prev.Load(), c.base.Load()+word(c.word.Load()).count(), now) > 0:
			return false
		}
	}
	return true
}
