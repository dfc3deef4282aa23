// Package syncloop is the sync loop of a hybridlimit Limiter: every cycle it
// takes the pending increments of the keys this node touched, pushes them to
// the store in one round trip (INCRBY per counter, which returns the merged
// cluster total), and writes the totals back into the local table.
//
// The package lives in the directory sync/ but is named syncloop so that it
// reads well beside the standard library's sync; import it as
//
//	syncloop "github.com/hybridlimit/hybridlimit/sync"
//
// Users of hybridlimit never touch this package: Limiter runs it.
package syncloop

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	gosync "sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Config configures a Loop.
type Config struct {
	Table  *local.Table
	Store  store.Store
	Prefix string // counter key prefix, see store.KeyBase
	// Now returns the current instant (ns since the Unix epoch) on the
	// cluster's clock, as decisions see it.
	Now func() int64
	// Rate is the time between cycles.
	Rate time.Duration
	// Recent is how long after its last decision a key keeps being read
	// back in every cycle, so that the node learns what other nodes admit
	// for it even while it only pushes nothing.
	Recent time.Duration
	// Timeout bounds every store call.
	Timeout time.Duration
	// MaxBackoff bounds the wait between cycles while the store fails.
	MaxBackoff time.Duration
	// OnError, if set, receives every store error.
	OnError func(error)
	// OnSync, if set, receives every cycle's round-trip duration, counter
	// operations and error.
	OnSync func(latency time.Duration, ops int, err error)
	// Logger, if set, receives store errors, at most one record per
	// LogEvery.
	Logger   *slog.Logger
	LogEvery time.Duration
}

// Loop runs sync cycles for one table. Cycle, Flush and MeasureOffset are
// safe for concurrent use (cycles run one at a time); Run runs them on a
// schedule. The zero value is not usable: create one with New.
type Loop struct {
	cfg Config
	wms []int64 // window per rule, ms

	mu      gosync.Mutex // one cycle at a time; guards the scratch below
	entries []*local.Entry
	spans   []span
	pushes  []local.Push
	ops     []store.Op
	cur     []int64
	prev    []int64

	cycles    atomic.Uint64
	errs      atomic.Uint64
	calls     atomic.Uint64
	keys      atomic.Uint64
	latency   atomic.Int64
	failing   atomic.Bool
	lastError atomic.Pointer[errBox]
	offset    atomic.Int64
	backoff   atomic.Int64

	logMu      gosync.Mutex
	lastLog    time.Time
	suppressed int
}

type span struct {
	e          *local.Entry
	from, to   int // pushes[from:to]
	opFrom     int
	readLonger bool
}

type errBox struct{ err error }

// New returns a loop for cfg.
func New(cfg Config) *Loop {
	l := &Loop{cfg: cfg}
	for _, w := range cfg.Table.Windows() {
		l.wms = append(l.wms, w/int64(time.Millisecond))
	}
	if l.cfg.MaxBackoff == 0 {
		l.cfg.MaxBackoff = max(5*time.Second, cfg.Rate)
	}
	return l
}

// Stats is a snapshot of a loop's counters.
type Stats struct {
	Cycles      uint64        // cycles that reached the store (successful or not)
	Errors      uint64        // failed store calls
	StoreCalls  uint64        // round trips to the store
	KeysPushed  uint64        // counter operations sent
	LastLatency time.Duration // duration of the last successful cycle's round trip
	Failing     bool          // the last store call failed
	LastError   error         // the last store error, nil if none
	Offset      time.Duration // the store's clock minus this node's
	Backoff     time.Duration // current wait before the next cycle
}

// Stats returns the loop's counters.
func (l *Loop) Stats() Stats {
	s := Stats{
		Cycles:      l.cycles.Load(),
		Errors:      l.errs.Load(),
		StoreCalls:  l.calls.Load(),
		KeysPushed:  l.keys.Load(),
		LastLatency: time.Duration(l.latency.Load()),
		Failing:     l.failing.Load(),
		Offset:      time.Duration(l.offset.Load()),
		Backoff:     time.Duration(l.backoff.Load()),
	}
	if b := l.lastError.Load(); b != nil {
		s.LastError = b.err
	}
	return s
}

// Failing reports whether the last store call failed.
func (l *Loop) Failing() bool { return l.failing.Load() }

// keyBase returns the store key prefix of a user key.
func (l *Loop) keyBase(key string) string { return store.KeyBase(l.cfg.Prefix, key) }

// ReportError records a store error met outside the loop (a synchronous
// decision) in the loop's statistics and passes it to OnError.
func (l *Loop) ReportError(err error) { l.fail(err) }

func (l *Loop) fail(err error) {
	l.errs.Add(1)
	l.failing.Store(true)
	l.lastError.Store(&errBox{err})
	if l.cfg.OnError != nil {
		l.cfg.OnError(err)
	}
	if l.cfg.Logger != nil {
		l.logMu.Lock()
		now := time.Now()
		if now.Sub(l.lastLog) < l.cfg.LogEvery {
			l.suppressed++
			l.logMu.Unlock()
			return
		}
		n := l.suppressed + 1
		l.lastLog, l.suppressed = now, 0
		l.logMu.Unlock()
		l.cfg.Logger.Warn("hybridlimit: store error", "err", err, "errors", n, "since", l.cfg.LogEvery)
	}
}

// Cycle runs one sync cycle over the entries touched since the last one.
// It makes no store call when there is nothing to push or read.
func (l *Loop) Cycle(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = l.cfg.Table.Drain(l.entries)
	if len(l.entries) == 0 && l.failing.Load() {
		// Nothing to push, but the store was failing: probe it, so that
		// a fail-closed limiter learns that it is back.
		return l.probe(ctx)
	}
	return l.push(ctx, l.entries)
}

func (l *Loop) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	l.calls.Add(1)
	if _, err := l.cfg.Store.Time(ctx); err != nil {
		l.fail(err)
		return err
	}
	l.failing.Store(false)
	return nil
}

// Flush pushes the pending increments of every entry of the table, touched
// or not. Close uses it so that nothing admitted is left unpushed.
func (l *Loop) Flush(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = l.cfg.Table.Drain(l.entries)
	queued := make(map[*local.Entry]bool, len(l.entries))
	for _, e := range l.entries {
		queued[e] = true
	}
	l.cfg.Table.Range(func(e *local.Entry) bool {
		if !queued[e] {
			l.entries = append(l.entries, e)
		}
		return true
	})
	return l.push(ctx, l.entries)
}

func (l *Loop) push(ctx context.Context, entries []*local.Entry) error {
	if len(entries) == 0 {
		return nil
	}
	now := l.cfg.Now()
	l.spans, l.pushes, l.ops = l.spans[:0], l.pushes[:0], l.ops[:0]
	for _, e := range entries {
		base := e.StoreBase(l.keyBase) // built once per key, then cached
		s := span{e: e, from: len(l.pushes), opFrom: len(l.ops)}
		l.pushes, s.readLonger = e.Take(now, l.pushes)
		s.to = len(l.pushes)
		for _, p := range l.pushes[s.from:s.to] {
			wms := l.wms[p.Rule]
			// Counters are named by their parts: the store writes the
			// name without building a string.
			op := store.Op{Base: base, WindowMs: wms, ID: p.Win, Delta: p.Delta}
			if p.ExpireCur {
				op.ExpireAt = store.ExpireAt(wms, p.Win)
			}
			l.ops = append(l.ops, op)
			if p.Prev {
				op := store.Op{Base: base, WindowMs: wms, ID: p.Win - 1, Delta: p.PrevDelta}
				if p.ExpirePrev {
					op.ExpireAt = store.ExpireAt(wms, p.Win-1)
				}
				l.ops = append(l.ops, op)
			}
		}
		l.spans = append(l.spans, s)
	}
	// A large batch gets time in proportion: 10µs per operation on top of
	// Timeout (100k keys: +1s), so that a cycle after a long outage does
	// not time out again and again.
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout+time.Duration(len(l.ops))*10*time.Microsecond)
	start := time.Now()
	err := l.cfg.Store.Apply(ctx, l.ops)
	cancel()
	if l.cfg.OnSync != nil {
		l.cfg.OnSync(time.Since(start), len(l.ops), err)
	}
	l.cycles.Add(1)
	l.calls.Add(1)
	if err != nil {
		for _, s := range l.spans {
			l.cfg.Table.AddDropped(s.e.Fail(l.pushes[s.from:s.to]))
			l.cfg.Table.Touch(s.e)
		}
		l.release()
		l.fail(err)
		return err
	}
	l.latency.Store(int64(time.Since(start)))
	l.keys.Add(uint64(len(l.ops)))
	l.failing.Store(false)
	for _, s := range l.spans {
		l.cur, l.prev = l.cur[:0], l.prev[:0]
		k := s.opFrom
		for _, p := range l.pushes[s.from:s.to] {
			l.cur = append(l.cur, l.ops[k].Total)
			k++
			if p.Prev {
				l.prev = append(l.prev, l.ops[k].Total)
				k++
			} else {
				l.prev = append(l.prev, 0)
			}
		}
		s.e.Ack(l.pushes[s.from:s.to], l.cur, l.prev)
		if s.readLonger || now-s.e.LastSeen() < int64(l.cfg.Recent) {
			l.cfg.Table.Touch(s.e)
		}
	}
	l.release()
	return nil
}

// release drops the scratch slices' references, and the slices themselves
// after an unusually large cycle, so that a burst of keys does not pin
// memory for the life of the limiter.
func (l *Loop) release() {
	clear(l.ops) // key strings
	clear(l.entries)
	clear(l.spans)
	const keep = 1 << 14
	if cap(l.ops) > keep && len(l.ops) < cap(l.ops)/4 {
		l.ops, l.pushes, l.spans, l.entries = nil, nil, nil, nil
	}
}

// MeasureOffset reads the store's clock and records its offset to this
// node's clock (c), correcting for half the round trip. Decisions add the
// offset (see Offset) so that every node's windows follow the store's clock.
func (l *Loop) MeasureOffset(ctx context.Context, c clock.Clock) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	t0 := c.Now()
	st, err := l.cfg.Store.Time(ctx)
	l.calls.Add(1)
	if err != nil {
		l.fail(err)
		return err
	}
	l.failing.Store(false)
	t1 := c.Now()
	mid := t0.Add(t1.Sub(t0) / 2)
	l.offset.Store(int64(st.Sub(mid)))
	return nil
}

// Offset returns the last measured offset of the store's clock to this
// node's, in nanoseconds.
func (l *Loop) Offset() int64 { return l.offset.Load() }

// Schedule is what Run does besides sync cycles.
type Schedule struct {
	Clock clock.Clock
	// ClockSync is the period of MeasureOffset; 0 or negative never.
	ClockSync time.Duration
	// Evict, if set, is called every EvictEvery.
	Evict      func()
	EvictEvery time.Duration
	// Sync disables cycles when false (local mode: eviction only).
	Sync bool
}

// Run runs cycles every Rate (backing off exponentially, with jitter, up to
// MaxBackoff while the store fails), measures the clock offset and calls
// Evict, until stop is closed.
func (l *Loop) Run(stop <-chan struct{}, s Schedule) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	c := s.Clock
	now := c.Now()
	nextSync, nextClock, nextEvict := now, now, now.Add(s.EvictEvery)
	if s.ClockSync > 0 {
		_ = l.MeasureOffset(ctx, c)
		nextClock = now.Add(s.ClockSync)
	}
	delay := l.cfg.Rate
	l.backoff.Store(int64(delay))
	if s.Sync {
		nextSync = now.Add(delay)
	}
	for {
		next := nextEvict
		if s.Evict == nil {
			next = now.Add(time.Hour)
		}
		if s.Sync && nextSync.Before(next) {
			next = nextSync
		}
		if s.ClockSync > 0 && nextClock.Before(next) {
			next = nextClock
		}
		t := c.Timer(next.Sub(now))
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		now = c.Now()
		if s.Sync && !now.Before(nextSync) {
			err := l.Cycle(ctx)
			switch {
			case err == nil:
				delay = l.cfg.Rate
			case errors.Is(err, context.Canceled) && ctx.Err() != nil:
				return
			default:
				delay = min(max(2*delay, l.cfg.Rate), l.cfg.MaxBackoff)
				delay += time.Duration(rand.Int64N(int64(delay)/5 + 1))
			}
			l.backoff.Store(int64(delay))
			nextSync = now.Add(delay)
		}
		if s.ClockSync > 0 && !now.Before(nextClock) {
			_ = l.MeasureOffset(ctx, c)
			nextClock = now.Add(s.ClockSync)
		}
		if s.Evict != nil && !now.Before(nextEvict) {
			s.Evict()
			nextEvict = now.Add(s.EvictEvery)
		}
	}
}
