package local

import (
	"sync/atomic"
	"unsafe"
)

// The table's counters: decisions, evictions, dropped increments.

// countStripes is the number of decision counters of a table: a decision
// counts itself in the stripe of its entry's address, so that decisions on
// different keys seldom write the same cache line (and none writes its
// entry's line for it).
const countStripes = 64

// decisionCount is one stripe of a table's decision counters, a cache line.
type decisionCount struct {
	allowed, denied atomic.Uint64
	_               [48]byte
}

// count returns the decision counters of e's stripe.
func (t *Table) count(e *Entry) *decisionCount {
	return &t.decisions[uintptr(unsafe.Pointer(e))/entryAlign%countStripes]
}

// Stats is a snapshot of a table's counters.
type Stats struct {
	Keys     int    // entries in the table
	Evicted  uint64 // entries removed by Evict
	Dropped  uint64 // increments discarded unpushed, as too old to matter
	Allowed  uint64 // admitted decisions, including those of evicted entries
	Denied   uint64 // denied decisions, including those of evicted entries
	Unsynced int64  // increments the store has not acknowledged
}

// Stats walks the table and returns its counters, in time linear in the
// number of entries.
func (t *Table) Stats() Stats {
	s := Stats{
		Evicted: t.evicted.Load(),
		Dropped: t.dropped.Load(),
	}
	for i := range t.decisions {
		s.Allowed += t.decisions[i].allowed.Load()
		s.Denied += t.decisions[i].denied.Load()
	}
	t.rangeEntries(func(e *Entry) bool {
		s.Keys++
		if t.syncing {
			t.mu(e).Lock()
			for i := range t.rules {
				s.Unsynced += word(e.ctr(i).word.Load()).count() + t.unsynced(e, i)
			}
			t.mu(e).Unlock()
		}
		return true
	})
	return s
}

func (t *Table) addDropped(n int64) {
	if n > 0 {
		t.dropped.Add(uint64(n))
	}
}
