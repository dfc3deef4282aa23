package syncloop

import (
	"sync/atomic"
	"time"
)

// counters are a loop's statistics.
type counters struct {
	cycles    atomic.Uint64
	errors    atomic.Uint64
	calls     atomic.Uint64
	ops       atomic.Uint64
	latency   atomic.Int64 // last successful push's round trip, ns
	backoff   atomic.Int64 // the wait before the next cycle, ns
	doubt     atomic.Int64 // batches in doubt
	lastStart atomic.Int64 // Unix ns of the last cycle's start
	running   atomic.Int64 // Unix ns of the start of the cycle under way, 0 if none
	period    atomic.Int64 // between the starts of the last two cycles, ns
	took      atomic.Int64 // the last cycle's duration, ns
	keys      atomic.Int64 // the last cycle's keys
	lastError atomic.Pointer[errBox]
}

type errBox struct{ err error }

func (c *counters) cycle(start, end time.Time, keys int) {
	c.cycles.Add(1)
	if last := c.lastStart.Swap(start.UnixNano()); last != 0 {
		c.period.Store(start.UnixNano() - last)
	}
	c.took.Store(int64(end.Sub(start)))
	c.keys.Store(int64(keys))
}

// Stats is a snapshot of a loop's statistics.
type Stats struct {
	Cycles      uint64        // cycles that had something to send
	Errors      uint64        // failed store calls
	StoreCalls  uint64        // round trips to the store
	KeysPushed  uint64        // counter operations applied
	LastLatency time.Duration // the last successful push's round trip
	Failing     bool          // the last store call failed
	LastError   error         // the last store error, nil if none
	Offset      time.Duration // the store's clock minus this node's
	Backoff     time.Duration // the wait before the next cycle
	InDoubt     int           // batches sent whose answer was lost, to send again
	Period      time.Duration // between the starts of the last two cycles, or since the start of the cycle under way if longer
	CycleTime   time.Duration // the last cycle's duration
	CycleKeys   int           // the keys the last cycle handled
}

// Stats returns the loop's statistics.
func (l *Loop) Stats() Stats {
	s := Stats{
		Cycles:      l.stats.cycles.Load(),
		Errors:      l.stats.errors.Load(),
		StoreCalls:  l.stats.calls.Load(),
		KeysPushed:  l.stats.ops.Load(),
		LastLatency: time.Duration(l.stats.latency.Load()),
		Failing:     l.failing.Load(),
		Offset:      time.Duration(l.offset.Load()),
		Backoff:     time.Duration(l.stats.backoff.Load()),
		InDoubt:     int(l.stats.doubt.Load()),
		Period:      time.Duration(l.stats.period.Load()),
		CycleTime:   time.Duration(l.stats.took.Load()),
		CycleKeys:   int(l.stats.keys.Load()),
	}
	if r := l.stats.running.Load(); r != 0 {
		// A long cycle under way: the cluster view is at least this old.
		s.Period = max(s.Period, time.Duration(l.cfg.Clock.Now().UnixNano()-r))
	}
	if b := l.stats.lastError.Load(); b != nil {
		s.LastError = b.err
	}
	return s
}
