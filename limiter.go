// Package hybridlimit is a distributed rate limiter with local in-memory
// counters. Every node decides each request against sliding-window (or
// fixed-window) counters held in a lock-free table, in nanoseconds and
// without allocating. In ModeAsync a background loop pushes the node's
// increments to a shared store (Redis, with atomic INCRBY) and pulls the
// merged cluster counts back every SyncRate; in ModeSynchronous every
// decision is one atomic round trip to the store; ModeLocal needs no store.
//
// A Limiter enforces several rules at once per key (for example 1/s,
// 20/min, 200/h and 800/day), with a cost per request, and every decision
// reports what remains, when to retry and when the limit resets.
//
// Where the code lives: the decisions and every counter in package local,
// the sync loop in package sync (named syncloop), the stores in package
// store. This package turns a Config into those and their answers into
// Results.
package hybridlimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/hybridlimit/hybridlimit/local"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// A Limiter enforces a set of rules per key. Create one with New; the zero
// value is not usable. A Limiter is safe for concurrent use by any number
// of goroutines. Close it to stop its background goroutines and push what
// is still pending.
type Limiter struct {
	cfg      Config
	rules    []local.Rule
	minLimit int64 // the smallest limit, the largest valid cost
	minRule  int
	table    *local.Table
	loop     *syncloop.Loop // nil in ModeLocal
	clock    *clusterClock
	sync     *synchronous // nil unless ModeSynchronous

	untrackedAllowed atomic.Uint64
	untrackedDenied  atomic.Uint64
	degraded         atomic.Uint64
	overflow         atomic.Uint64

	closed    atomic.Bool
	stop      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New validates cfg and returns a Limiter, with its background goroutines
// started unless cfg.Manual is set. It never contacts the store: a store
// that is down at start is handled like any later failure.
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	l := &Limiter{cfg: cfg, minLimit: math.MaxInt64, stop: make(chan struct{})}
	var longest time.Duration
	for i, r := range cfg.Rules {
		spec := r.spec()
		if r.Type == Log && cfg.Mode == ModeAsync {
			// A log cannot be merged across nodes by increments: count in
			// buckets of at least a sync period (docs/algorithms.md).
			spec.Kind, spec.Buckets = local.Buckets, logBuckets(r.Window, cfg.SyncRate)
		}
		l.rules = append(l.rules, local.NewRule(spec))
		longest = max(longest, r.Window)
		if r.maxCost() < l.minLimit {
			l.minLimit, l.minRule = r.maxCost(), i
		}
	}
	syncing := cfg.Mode != ModeLocal
	rate := cfg.SyncRate
	if cfg.Mode == ModeSynchronous {
		rate = DefaultSyncRate // pushes what was decided locally while the store failed
	}
	l.table = local.NewTable(local.Options{
		Rules:       l.rules,
		MaxKeys:     cfg.MaxKeys,
		Syncing:     syncing,
		ReadPrev:    int64(2 * rate),
		CountDenied: cfg.CountDenied,
		Share:       cfg.Mode == ModeAsync && cfg.AsyncPolicy == Share,
		Seed:        cfg.Seed,
	})
	offset := new(atomic.Int64) // zero: this node's own clock
	if syncing {
		var id [8]byte
		_, _ = rand.Read(id[:])
		clockSync := cfg.ClockSync
		if cfg.Manual {
			clockSync = 0
		}
		l.loop = syncloop.New(syncloop.Config{
			Table:     l.table,
			Store:     cfg.Store,
			Prefix:    cfg.Prefix,
			Node:      hex.EncodeToString(id[:]),
			Now:       func() int64 { return l.clock.now() },
			Clock:     cfg.Clock,
			Rate:      rate,
			Recent:    3 * rate,
			Timeout:   cfg.StoreTimeout,
			ClockSync: clockSync,
			OnError:   cfg.OnError,
			OnSync:    cfg.OnSync,
			Logger:    cfg.Logger,
			LogEvery:  cfg.LogEvery,
		})
		if cfg.ClockSync >= 0 {
			offset = l.loop.OffsetVar()
		}
	}
	l.clock = newClusterClock(cfg.Clock, cfg.ClockResolution < 0, offset)
	if cfg.Mode == ModeSynchronous {
		l.sync = newSynchronous(l)
	}
	l.start(longest)
	return l, nil
}

// start starts the background goroutines: the coarse clock, eviction and
// the sync loop, as the Config asks.
func (l *Limiter) start(longest time.Duration) {
	tick := l.cfg.ClockResolution
	evict := min(max(longest/2, time.Second), time.Minute)
	if l.cfg.Manual {
		evict = 0
	}
	if tick > 0 || evict > 0 {
		l.wg.Add(1)
		go l.housekeep(tick, evict)
	}
	if l.loop != nil && !l.cfg.Manual {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.loop.Run(l.stop)
		}()
	}
}

// housekeep refreshes the coarse clock every tick and evicts idle keys
// every evict (each when positive) until Close.
func (l *Limiter) housekeep(tick, evict time.Duration) {
	defer l.wg.Done()
	every := tick
	if every <= 0 {
		every = evict
	}
	t := l.cfg.Clock.Ticker(every)
	defer t.Stop()
	next := l.cfg.Clock.Now().Add(evict)
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		if tick > 0 {
			l.clock.tick()
		}
		if evict > 0 {
			if now := l.cfg.Clock.Now(); !now.Before(next) {
				l.Evict()
				next = now.Add(evict)
			}
		}
	}
}

// Rules returns a copy of the limiter's rules.
func (l *Limiter) Rules() []Rule { return append([]Rule(nil), l.cfg.Rules...) }

// Mode returns the limiter's mode.
func (l *Limiter) Mode() Mode { return l.cfg.Mode }

// FailurePolicy returns the limiter's failure policy.
func (l *Limiter) FailurePolicy() FailurePolicy { return l.cfg.FailurePolicy }

// Sync runs one sync cycle now: it pushes the pending increments of the
// keys touched since the last cycle, and the batches whose answer was
// lost, and pulls the keys' cluster totals. The background loop calls it
// every SyncRate; call it yourself with Config.Manual, or to push early.
// It returns the first store error, if any; what was not applied is kept
// for the next cycle. It does nothing in ModeLocal.
func (l *Limiter) Sync(ctx context.Context) error {
	if l.loop == nil {
		return nil
	}
	return l.loop.Cycle(ctx)
}

// SyncClock measures this node's clock offset to the store's clock now
// (the background loop does it every Config.ClockSync).
func (l *Limiter) SyncClock(ctx context.Context) error {
	if l.loop == nil || l.cfg.ClockSync < 0 {
		return nil
	}
	return l.loop.MeasureOffset(ctx)
}

// Evict removes keys idle for twice their longest window, whose counters
// can no longer influence any decision, and returns how many it removed.
// The background goroutine calls it periodically unless Config.Manual is
// set.
func (l *Limiter) Evict() int {
	return l.table.Evict(l.clock.now())
}

// Close stops the background goroutines, then pushes every pending
// increment to the store, trying again until ctx ends; a ctx without a
// deadline gets one of DefaultCloseTimeout or twice Config.StoreTimeout,
// whichever is longer. Decisions after Close return ErrClosed; a decision
// that returned Allowed before Close returned is pushed, or counted in
// Close's error. Close returns nil when every increment reached the store,
// and otherwise an error saying how many may not have; calling it again
// returns the same error.
func (l *Limiter) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		close(l.stop)
		l.wg.Wait()
		if l.loop != nil {
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, max(DefaultCloseTimeout, 2*l.cfg.StoreTimeout))
				defer cancel()
			}
			l.closeErr = l.loop.Flush(ctx)
			return
		}
		l.table.Close()
		l.table.FlushDone()
	})
	return l.closeErr
}

// Clock returns the clock the limiter measures time on: Config.Clock, or
// the system clock. Middleware that waits a Result's Delay waits on it.
func (l *Limiter) Clock() clock.Clock { return l.cfg.Clock }
