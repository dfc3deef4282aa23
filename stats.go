package hybridlimit

import "time"

// Stats is a snapshot of a Limiter's counters, for monitoring. Counters only
// grow over the limiter's life.
type Stats struct {
	// Allowed and Denied count decisions (Peek excluded).
	Allowed, Denied uint64
	// Degraded counts decisions made by the FailurePolicy because the store
	// failed.
	Degraded uint64
	// Overflow counts decisions on new keys while the table held MaxKeys.
	Overflow uint64
	// Keys is the number of keys tracked now; Evicted counts keys removed
	// after being idle.
	Keys    int
	Evicted uint64
	// Pending is the increments not yet acknowledged by the store.
	Pending int64
	// Dropped counts increments discarded unpushed because their window
	// could no longer influence a decision (the store was unreachable for
	// longer than a window).
	Dropped uint64
	// SyncCycles counts sync cycles that reached out to the store, and
	// SyncErrors the store calls that failed (cycles, clock reads and
	// synchronous decisions).
	SyncCycles, SyncErrors uint64
	// StoreCalls counts round trips to the store: sync cycles, clock reads
	// and batches of synchronous decisions.
	StoreCalls uint64
	// KeysPushed counts counter operations sent by sync cycles.
	KeysPushed uint64
	// LastSyncLatency is the duration of the last successful cycle's round
	// trip.
	LastSyncLatency time.Duration
	// StoreFailing reports whether the last store call failed, and
	// LastError holds the last store error (nil if none).
	StoreFailing bool
	LastError    error
	// ClockOffset is the store's clock minus this node's clock, as last
	// measured.
	ClockOffset time.Duration
}

// Stats returns a snapshot of the limiter's counters. It walks the key
// table, so it costs time linear in the number of keys: call it for
// monitoring, not per request.
func (l *Limiter) Stats() Stats {
	t := l.table.Stats()
	s := l.loop.Stats()
	st := Stats{
		Allowed:         t.Allowed + l.untrackedAllowed.Load(),
		Denied:          t.Denied + l.untrackedDenied.Load(),
		Degraded:        l.degraded.Load(),
		Overflow:        l.overflow.Load(),
		Keys:            t.Keys,
		Evicted:         t.Evicted,
		Pending:         t.Unsynced,
		Dropped:         t.Dropped,
		SyncCycles:      s.Cycles,
		SyncErrors:      s.Errors,
		StoreCalls:      s.StoreCalls,
		KeysPushed:      s.KeysPushed,
		LastSyncLatency: s.LastLatency,
		StoreFailing:    s.Failing,
		LastError:       s.LastError,
		ClockOffset:     s.Offset,
	}
	if l.batch != nil {
		st.StoreCalls += l.batch.calls.Load()
	}
	return st
}
