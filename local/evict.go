package local

// Eviction: entries idle long enough that their counters no longer matter.

// Evict removes the entries that have seen no decision for twice the
// longest window (their counters can no longer influence a decision) and
// hold nothing the store has not acknowledged, and returns how many it
// removed.
func (t *Table) Evict(now int64) int {
	n := 0
	idle := 2 * t.longest
	t.rangeEntries(func(e *Entry) bool {
		if now-e.lastSeen.Load() > idle && t.tryEvict(e, now-idle) {
			n++
		}
		return true
	})
	return n
}

func (t *Table) tryEvict(e *Entry, seenBefore int64) bool {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	if (t.syncing && t.hasUnsynced(e)) || e.has(flagSealed) {
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
