package hybridlimit

import "time"

// Stats is a snapshot of a Limiter's counters and state, for monitoring.
// The uint64 counters only grow over the limiter's life; the other fields
// are current values.
type Stats struct {
	// Allowed and Denied count decisions (Peek excluded), over every tier.
	Allowed, Denied uint64
	// Blocked counts the denials of blocked keys (Denied includes them).
	Blocked uint64
	// Degraded counts decisions (Peek excluded) made by the FailurePolicy
	// because the store failed.
	Degraded uint64
	// Overflow counts decisions on new keys while the table held MaxKeys.
	Overflow uint64
	// Keys is the number of keys tracked now, over every tier; Evicted
	// counts keys removed after being idle.
	Keys    int
	Evicted uint64
	// Pending is the increments not yet acknowledged by the store, per
	// rule: a request of cost n on a key with three rules is 3n.
	Pending int64
	// Dropped counts increments discarded unpushed because their window
	// could no longer influence a decision and the store did not take them
	// for several windows (it was unreachable, or the sync loop lagged that
	// far behind).
	Dropped uint64
	// SyncCycles counts sync cycles that had something to send (this
	// node's increments, or recently decided keys to read again), whether
	// the store took it or not; a cycle with nothing to send, which at
	// most probes a failing store, is not counted. SyncErrors counts the
	// store errors met: failed sync pushes, probes and clock reads, each
	// synchronous decision or Peek the store did not decide, and failed
	// policy reloads, tag updates and ban escalations (those of Sync are
	// returned by Sync instead).
	SyncCycles, SyncErrors uint64
	// StoreCalls counts round trips to the store: sync pushes, probes,
	// clock reads and batches of synchronous decisions (policy reads and
	// changes are not counted).
	StoreCalls uint64
	// KeysPushed counts counter operations (increments, and reads of
	// counters) the store applied for sync cycles.
	KeysPushed uint64
	// LastSyncLatency is the round trip of the last successful push.
	LastSyncLatency time.Duration
	// SyncPeriod is the time between the starts of the last two sync
	// cycles, or since the start of the cycle under way when that is
	// longer: SyncRate while the loop keeps up, more when a cycle takes
	// longer than SyncRate (many keys, a slow store) or the loop backs off
	// while the store fails. Async decisions see the other nodes' counts
	// up to two SyncPeriods plus round trips late. SyncCycleTime is the last
	// cycle's duration and SyncCycleKeys the keys it handled.
	SyncPeriod, SyncCycleTime time.Duration
	SyncCycleKeys             int
	// InDoubt counts batches of increments sent to the store whose answer
	// was lost; they are sent again, unchanged, until the store answers,
	// which applies each exactly once.
	InDoubt int
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
	st := Stats{
		Allowed:  l.untrackedAllowed.Load(),
		Denied:   l.untrackedDenied.Load() + l.blocked.Load(),
		Blocked:  l.blocked.Load(),
		Degraded: l.degraded.Load(),
		Overflow: l.overflow.Load(),
	}
	for _, tr := range l.tiers {
		t := tr.table.Stats()
		st.Allowed += t.Allowed
		st.Denied += t.Denied
		st.Keys += t.Keys
		st.Evicted += t.Evicted
		st.Pending += t.Unsynced
		st.Dropped += t.Dropped
	}
	if l.loop != nil {
		s := l.loop.Stats()
		st.SyncCycles, st.SyncErrors = s.Cycles, s.Errors
		st.StoreCalls, st.KeysPushed = s.StoreCalls, s.KeysPushed
		st.LastSyncLatency = s.LastLatency
		st.SyncPeriod, st.SyncCycleTime, st.SyncCycleKeys = s.Period, s.CycleTime, s.CycleKeys
		st.InDoubt = s.InDoubt
		st.StoreFailing, st.LastError = s.Failing, s.LastError
		st.ClockOffset = s.Offset
	}
	if l.sync != nil {
		st.StoreCalls += l.sync.calls.Load()
	}
	return st
}
