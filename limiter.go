// Package hybridlimit is a distributed rate limiter with local in-memory
// counters. Every node decides each request against counters held in a
// lock-free table (sliding, fixed or bucketed windows, an exact log, a
// token or a leaky bucket), in nanoseconds and without allocating. In
// ModeAsync a background loop pushes the node's increments to a shared
// store (Redis: INCRBY in one script per batch, which a call applies at
// most once and the loop sends until one has: exactly once, see
// docs/failures.md) and pulls the merged cluster counts back every
// SyncRate, and between syncs each node spends only its share of what is
// left; in ModeSynchronous every decision is one atomic round trip to the
// store; ModeLocal needs no store.
//
// A Limiter enforces several rules at once per key (for example 1/s,
// 20/min, 200/h and 800/day), with a cost per request, and every decision
// reports what remains, when to retry and when the limit resets. Tiers of
// rules, per-key overrides and blocks change the limits at runtime.
package hybridlimit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/puzpuzpuz/xsync/v3"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// A Limiter enforces a set of rules per key. Create one with New; the zero
// value is not usable. A Limiter is safe for concurrent use by any number
// of goroutines. Close it to stop its background goroutines and push what
// is still pending.
type Limiter struct {
	cfg    Config
	def    *tier            // Rules
	tiers  []*tier          // def, then Config.Tiers by name
	byName map[string]*tier // every tier, def as ""
	pol    policies
	hit    hitters
	bans   *bans          // nil without Config.Ban
	loop   *syncloop.Loop // nil in ModeLocal
	clock  *clusterClock
	sync   *synchronous // nil unless ModeSynchronous

	untrackedAllowed atomic.Uint64
	untrackedDenied  atomic.Uint64
	degraded         atomic.Uint64
	overflow         atomic.Uint64
	blocked          atomic.Uint64

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
	l := &Limiter{cfg: cfg, stop: make(chan struct{}), byName: map[string]*tier{}}
	syncing := cfg.Mode != ModeLocal
	rate := cfg.SyncRate
	if cfg.Mode == ModeSynchronous {
		rate = DefaultSyncRate // pushes what was decided locally while the store failed
	}
	var longest time.Duration
	var tables []*local.Table
	for _, nr := range cfg.tierList() {
		t := newTier(&cfg, nr.name, nr.field, nr.rules)
		t.table = local.NewTable(local.Options{
			Rules:       t.rules,
			MaxKeys:     cfg.MaxKeys,
			Syncing:     syncing,
			ReadPrev:    int64(2 * rate),
			SyncRate:    int64(rate),
			CountDenied: cfg.CountDenied,
			Share:       cfg.Mode == ModeAsync && cfg.AsyncPolicy == Share,
			Seed:        cfg.Seed,
		})
		l.tiers = append(l.tiers, t)
		l.byName[t.name] = t
		tables = append(tables, t.table)
		longest = max(longest, t.longest)
	}
	l.def = l.tiers[0]
	l.pol.prefix, l.pol.tiers, l.pol.tierOf = cfg.Prefix, l.byName, cfg.TierOf != nil
	l.pol.active.Store(l.pol.tierOf)
	if cfg.Mode == ModeLocal {
		l.pol.st = store.NewMemory(cfg.Clock)
	} else if ps, ok := cfg.Store.(store.PolicyStore); ok {
		l.pol.st = ps
	}
	l.hit.m = xsync.NewMapOf[string, *sketch]()
	if ts, ok := cfg.Store.(store.TagStore); ok && cfg.Mode != ModeLocal {
		l.hit.st = ts
	}
	if cfg.Ban.Denials > 0 {
		if l.pol.st == nil {
			return nil, ErrNoPolicies
		}
		l.bans = newBans(cfg.Ban)
	}
	offset := new(atomic.Int64) // zero: this node's own clock
	if syncing {
		var id [8]byte
		_, _ = rand.Read(id[:])
		l.loop = syncloop.New(syncloop.Config{
			Tables:    tables,
			Store:     cfg.Store,
			Prefix:    cfg.Prefix,
			Node:      hex.EncodeToString(id[:]),
			Now:       func() int64 { return l.clock.now() },
			Clock:     cfg.Clock,
			Rate:      rate,
			Recent:    3 * rate,
			Timeout:   cfg.StoreTimeout,
			ClockSync: cfg.ClockSync,
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
	// A decision may go straight to the table unless it is made in the
	// store, or FailClosed in ModeAsync must first ask whether the store
	// failed.
	l.pol.direct = l.sync == nil && !(cfg.FailurePolicy == FailClosed && l.loop != nil)
	l.pol.closed = &l.closed
	l.pol.setCommon()
	l.start(longest, rate)
	return l, nil
}

// start starts the background goroutines: the coarse clock, eviction, the
// sync loop and the policy reloads (every rate), as the Config asks.
func (l *Limiter) start(longest, rate time.Duration) {
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
		if l.pol.st != nil || l.hit.st != nil {
			l.wg.Add(1)
			go l.watchPolicies(rate)
		}
	}
}

// watchPolicies reloads the policies every rate when their version
// changed, and adds the tags seen to the store, until Close. Close cancels
// a reload under way: it does not wait for a store that does not answer.
func (l *Limiter) watchPolicies(rate time.Duration) {
	defer l.wg.Done()
	t := l.cfg.Clock.Ticker(rate)
	defer t.Stop()
	stopped, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	go func() {
		select {
		case <-l.stop:
			cancelAll()
		case <-stopped.Done():
		}
	}()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(stopped, l.cfg.StoreTimeout)
		if err := l.pol.reload(ctx, false); err != nil && stopped.Err() == nil {
			l.loop.ReportError(err)
		}
		if err := l.flushTags(ctx); err != nil && stopped.Err() == nil {
			l.loop.ReportError(err)
		}
		cancel()
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

// Rules returns a copy of the limiter's rules (the default tier's).
func (l *Limiter) Rules() []Rule { return append([]Rule(nil), l.cfg.Rules...) }

// Mode returns the limiter's mode.
func (l *Limiter) Mode() Mode { return l.cfg.Mode }

// FailurePolicy returns the limiter's failure policy.
func (l *Limiter) FailurePolicy() FailurePolicy { return l.cfg.FailurePolicy }

// Sync runs one sync cycle now: it pushes the pending increments of the
// keys touched since the last cycle, and the batches whose answer was
// lost, and pulls the keys' cluster totals; and it reloads the overrides
// and blocks if they changed, and adds the tags seen (AllowTagged) to the
// store. The background loop calls it every SyncRate; call it yourself
// with Config.Manual, or to push early. It waits for every store call it
// makes, and for those of earlier cycles still under way (the background
// loop does not wait for a hung Redis Cluster master), or until ctx ends.
// It returns the first store error, if any; what was not applied is kept
// for the next cycle. A ctx that ends first makes Sync return its error
// and is not taken for a store failure: it marks nothing failing, and
// counts in neither Stats.SyncErrors nor Config.OnError. It does nothing
// in ModeLocal.
func (l *Limiter) Sync(ctx context.Context) error {
	if l.loop == nil {
		return nil
	}
	err := l.loop.CycleAll(ctx)
	if perr := l.pol.reload(ctx, false); err == nil {
		err = perr
	}
	if terr := l.flushTags(ctx); err == nil {
		err = terr
	}
	return err
}

// SyncClock measures this node's clock offset to the store's clock now
// (the background loop does it every Config.ClockSync). As with Sync, a
// ctx that ends first is not taken for a store failure.
func (l *Limiter) SyncClock(ctx context.Context) error {
	if l.loop == nil || l.cfg.ClockSync < 0 {
		return nil
	}
	return l.loop.MeasureOffset(ctx)
}

// Evict removes keys idle for twice their longest window whose token and
// leaky buckets are full again, whose counters can no longer influence
// any decision, and returns how many it removed. Keys holding increments
// the store has not acknowledged stay.
// The background goroutine calls it periodically unless Config.Manual is
// set.
func (l *Limiter) Evict() int {
	n := 0
	for _, t := range l.tiers {
		n += t.table.Evict(l.clock.now())
	}
	return n
}

// Close stops the background goroutines, then pushes every pending
// increment to the store, trying again until ctx ends; a ctx without a
// deadline gets one of DefaultCloseTimeout or twice Config.StoreTimeout,
// whichever is longer. Decisions after Close return ErrClosed; a decision
// that returned Allowed before Close returned is pushed, or counted in
// Close's error. Close returns nil when every increment reached the store,
// and otherwise an error saying how many may not have (counted per rule,
// as Stats.Pending); calling it again returns the same error.
func (l *Limiter) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		l.pol.common.Store(false)
		close(l.stop)
		l.wg.Wait()
		if l.bans != nil {
			l.bans.close()
		}
		if l.hit.st != nil {
			tctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
			_ = l.flushTags(tctx) // best effort: contributors are a report
			cancel()
		}
		if l.loop != nil {
			if _, ok := ctx.Deadline(); !ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, max(DefaultCloseTimeout, 2*l.cfg.StoreTimeout))
				defer cancel()
			}
			l.closeErr = l.loop.Flush(ctx)
			return
		}
		for _, t := range l.tiers {
			t.table.Close()
			t.table.FlushDone()
		}
	})
	return l.closeErr
}

// Clock returns the clock the limiter measures time on: Config.Clock, or
// the system clock. Middleware that waits a Result's Delay waits on it.
func (l *Limiter) Clock() clock.Clock { return l.cfg.Clock }
