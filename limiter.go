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
package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// Errors returned by decisions.
var (
	// ErrClosed is returned by decisions on a Limiter after Close.
	ErrClosed = errors.New("hybridlimit: limiter is closed")
	// ErrEmptyKey is returned for an empty key.
	ErrEmptyKey = errors.New("hybridlimit: empty key")
	// ErrKeyTooLong is wrapped by the error returned for a key longer than
	// Config.MaxKeyLen.
	ErrKeyTooLong = errors.New("hybridlimit: key too long")
	// ErrCost is wrapped by the error returned for a cost below 1 or above
	// the smallest limit.
	ErrCost = errors.New("hybridlimit: invalid cost")
)

// Result is the outcome of one decision. Limit, Remaining and ResetAfter
// describe one rule, Rule: when the request is denied, the denying rule that
// needs the longest wait; otherwise the tightest rule (the least remaining).
type Result struct {
	// Allowed reports whether the request was admitted (for Peek: would be).
	Allowed bool
	// Degraded reports that the store failed and the decision was made by
	// the FailurePolicy (or the key table was full).
	Degraded bool
	// Rule is the index in Config.Rules of the rule described below.
	Rule int
	// Limit and Window are that rule's.
	Limit  int64
	Window time.Duration
	// Remaining is the cost that rule still admits, after this request.
	Remaining int64
	// RetryAfter is how long until this same request would be admitted, if
	// nothing else is admitted meanwhile: zero when Allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until that rule is back to its full limit, if
	// nothing else is admitted meanwhile.
	ResetAfter time.Duration
}

// A Limiter enforces a set of rules per key. Create one with New; the zero
// value is not usable. A Limiter is safe for concurrent use by any number of
// goroutines. Close it to stop its background goroutines and push what is
// still pending.
type Limiter struct {
	cfg      Config
	rules    []rule
	minLimit int64
	minRule  int
	table    *local.Table
	loop     *syncloop.Loop
	clock    clock.Clock
	exact    bool
	coarse   atomic.Int64
	syncing  bool // the table keeps increments to push (async and synchronous)
	readPrev int64
	take     []store.TakeRule
	batch    *batcher
	emptyRes Result // the result for a key with no counts, cost 0

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
// started unless cfg.Manual is set. It never contacts the store: a store that
// is down at start is handled like any later failure.
func New(cfg Config) (*Limiter, error) {
	cfg, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	l := &Limiter{
		cfg:     cfg,
		clock:   cfg.Clock,
		exact:   cfg.ClockResolution < 0,
		syncing: cfg.Mode != ModeLocal,
		stop:    make(chan struct{}),
	}
	windows := make([]int64, len(cfg.Rules))
	var longest int64
	l.minLimit = math.MaxInt64
	for i, r := range cfg.Rules {
		cr := compileRule(r)
		l.rules = append(l.rules, cr)
		windows[i] = cr.w
		longest = max(longest, cr.w)
		if cr.limit < l.minLimit {
			l.minLimit, l.minRule = cr.limit, i
		}
		l.take = append(l.take, store.TakeRule{Limit: cr.limit, WindowMs: cr.wms, Fixed: cr.fixed})
	}
	l.emptyRes = Result{Allowed: true, Rule: l.minRule, Limit: l.minLimit, Window: l.rules[l.minRule].window, Remaining: l.minLimit}
	l.table = local.NewTable(windows, cfg.MaxKeys, l.syncing)
	rate := cfg.SyncRate
	if cfg.Mode == ModeSynchronous {
		rate = DefaultSyncRate // pushes what was decided locally while the store failed
	}
	l.readPrev = int64(2 * rate)
	l.loop = syncloop.New(syncloop.Config{
		Table:    l.table,
		Store:    cfg.Store,
		Prefix:   cfg.Prefix,
		Now:      l.now,
		Rate:     rate,
		Recent:   3 * rate,
		Timeout:  cfg.StoreTimeout,
		OnError:  cfg.OnError,
		OnSync:   cfg.OnSync,
		Logger:   cfg.Logger,
		LogEvery: cfg.LogEvery,
	})
	if cfg.Mode == ModeSynchronous {
		l.batch = &batcher{store: cfg.Store, timeout: cfg.StoreTimeout}
	}
	l.coarse.Store(l.clock.Now().UnixNano())
	if !l.exact {
		l.wg.Add(1)
		go l.tick(cfg.ClockResolution)
	}
	if cfg.Manual {
		return l, nil
	}
	clockSync := cfg.ClockSync
	if !l.syncing {
		clockSync = -1
	}
	evictEvery := min(max(time.Duration(longest)/2, time.Second), time.Minute)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.loop.Run(l.stop, syncloop.Schedule{
			Clock:      l.clock,
			ClockSync:  clockSync,
			Evict:      func() { l.Evict() },
			EvictEvery: evictEvery,
			Sync:       l.syncing,
		})
	}()
	return l, nil
}

// tick refreshes the coarse clock until Close.
func (l *Limiter) tick(every time.Duration) {
	defer l.wg.Done()
	t := l.clock.Ticker(every)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.coarse.Store(l.clock.Now().UnixNano())
		}
	}
}

// now returns the current instant in ns on the cluster's clock.
func (l *Limiter) now() int64 {
	if l.exact {
		return l.clock.Now().UnixNano() + l.loop.Offset()
	}
	return l.coarse.Load() + l.loop.Offset()
}

// Rules returns a copy of the limiter's rules.
func (l *Limiter) Rules() []Rule { return append([]Rule(nil), l.cfg.Rules...) }

// Mode returns the limiter's mode.
func (l *Limiter) Mode() Mode { return l.cfg.Mode }

// FailurePolicy returns the limiter's failure policy.
func (l *Limiter) FailurePolicy() FailurePolicy { return l.cfg.FailurePolicy }

// Allow is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN decides a request of cost n for key and, if it is admitted,
// consumes n from every rule. In ModeLocal and ModeAsync it does no I/O and
// ignores ctx; in ModeSynchronous it makes one round trip to the store
// (shared with concurrent decisions) and returns ctx's error if ctx is done
// before it starts. The error is non-nil only for invalid input (an empty or
// oversized key, n < 1 or n above the smallest limit), after Close, or for a
// done ctx; store failures are decided by the FailurePolicy and reported in
// Result.Degraded.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Result, error) {
	if err := l.check(key, n, "AllowN"); err != nil {
		return Result{Rule: -1}, err
	}
	if l.cfg.Mode == ModeSynchronous {
		return l.decideStore(ctx, key, n, false)
	}
	now := l.now()
	if l.cfg.FailurePolicy == FailClosed && l.cfg.Mode == ModeAsync && l.loop.Failing() {
		return l.failClosed(key, now), nil
	}
	for {
		e := l.table.LoadOrCreate(key, now)
		if e == nil {
			return l.untracked(key, n, now), nil
		}
		switch best, rem, reset, st := l.decideLocal(e, n, now, false); st {
		case admitted:
			r := &l.rules[best]
			return Result{Allowed: true, Rule: best, Limit: r.limit, Window: r.window, Remaining: rem, ResetAfter: reset}, nil
		case denied:
			return l.deniedResult(e, n, now), nil
		}
	}
}

// Peek is PeekN(ctx, key, 1).
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	return l.PeekN(ctx, key, 1)
}

// PeekN reports whether a request of cost n for key would be admitted now,
// without consuming anything. Remaining is what is left before the request.
// It makes a store round trip in ModeSynchronous only.
func (l *Limiter) PeekN(ctx context.Context, key string, n int64) (Result, error) {
	if err := l.check(key, n, "PeekN"); err != nil {
		return Result{Rule: -1}, err
	}
	if l.cfg.Mode == ModeSynchronous {
		return l.decideStore(ctx, key, n, true)
	}
	now := l.now()
	e, ok := l.table.Load(key)
	if !ok {
		e = l.table.Scratch(key, now)
	}
	res, _ := l.decide(e, n, now, true)
	return res, nil
}

// Wait is WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) (Result, error) {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until a request of cost n for key is admitted, and consumes
// it. It returns an error, without waiting, if ctx's deadline comes before
// the request could be admitted, and ctx's error if ctx is done while
// waiting. Time is measured on the configured Clock.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (Result, error) {
	for {
		res, err := l.AllowN(ctx, key, n)
		if err != nil || res.Allowed {
			return res, err
		}
		wait := max(res.RetryAfter, time.Millisecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait { // deadlines are wall-clock time
			return res, fmt.Errorf("hybridlimit: WaitN(n=%d) would wait %v, past the context deadline", n, wait)
		}
		t := l.clock.Timer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, ctx.Err()
		case <-l.stop:
			t.Stop()
			return res, ErrClosed
		case <-t.C:
		}
	}
}

func (l *Limiter) check(key string, n int64, op string) error {
	switch {
	case l.closed.Load():
		return ErrClosed
	case len(key) == 0:
		return ErrEmptyKey
	case len(key) > l.cfg.MaxKeyLen:
		return &inputError{fmt.Sprintf("hybridlimit: key of %d bytes exceeds Config.MaxKeyLen %d", len(key), l.cfg.MaxKeyLen), ErrKeyTooLong}
	case n < 1:
		return &inputError{fmt.Sprintf("hybridlimit: %s(n=%d): cost must be at least 1", op, n), ErrCost}
	case n > l.minLimit:
		return &inputError{fmt.Sprintf("hybridlimit: %s(n=%d) exceeds Config.Rules[%d].Limit %d: it can never be admitted", op, n, l.minRule, l.minLimit), ErrCost}
	}
	return nil
}

// status is how decideLocal ended.
type status uint8

const (
	admitted status = iota // the request fits every rule (and, unless peeking, was counted)
	denied                 // a rule denies it; nothing is left reserved
	evicted                // the entry was evicted under the decision: retry with a fresh one
)

// inputError is an error about the caller's input, wrapping a sentinel.
type inputError struct {
	msg  string
	kind error
}

func (e *inputError) Error() string { return e.msg }
func (e *inputError) Unwrap() error { return e.kind }

// decideLocal decides a request of cost n on entry e at now. When it
// admits, it returns the tightest rule, its remaining quota and its reset.
// The caller builds the Result: returning scalars rather than a Result
// spares a whole-struct copy (which stalls on store forwarding) on the
// hot path.
func (l *Limiter) decideLocal(e *local.Entry, n, now int64, peek bool) (best int, bestRem int64, bestReset time.Duration, st status) {
	var words [4]local.Word // reservations to undo, for the first 4 rules
	best, bestRem = -1, math.MaxInt64
	for i := range l.rules {
		r, c := &l.rules[i], &e.C[i]
		var prev, cur, el int64
		var est float64
		admit := false
		for {
			w := c.Load()
			if w.Rolling() {
				e.WaitRoll()
				continue
			}
			win := c.Window()
			// Most decisions fall in the counter's window: no division.
			if el = now - win*r.w; el < 0 || el >= r.w {
				id, _ := windowOf(now, r.w)
				if win < id {
					l.table.AddDropped(e.Roll(i, id, now+l.readPrev, l.syncing))
					continue
				}
				el = 0 // another decision already moved on: its window has begun
			}
			prev, cur = c.Prev(), c.Synced()+w.Count()
			est = r.estimate(prev, cur, el)
			admit = r.admits(est, n)
			if peek || !admit {
				break
			}
			if c.CompareAndAdd(w, n) {
				if i < len(words) {
					words[i] = w
				}
				est += float64(n)
				cur += n
				break
			}
		}
		if !admit {
			if !peek {
				l.release(e, i, &words, n, now)
			}
			return -1, 0, 0, denied
		}
		if rem := r.remaining(est); rem < bestRem {
			best, bestRem = i, rem
			bestReset = r.resetAfter(prev, cur, el)
		}
	}
	if !peek {
		if e.Dead() {
			for i := range l.rules {
				l.undo(e, i, &words, n)
			}
			return -1, 0, 0, evicted
		}
		e.Seen(now)
		e.Count(true)
		if l.syncing {
			l.table.Touch(e)
		}
	}
	return best, bestRem, bestReset, admitted
}

// undo takes back the n that rule i reserved on e.
func (l *Limiter) undo(e *local.Entry, i int, words *[4]local.Word, n int64) {
	w := local.Word(0)
	if i < len(words) {
		w = words[i]
	} else {
		w = e.C[i].Load() // beyond the first rules: assume no rollover since
	}
	e.Undo(i, w, n)
}

// release finishes a decision that rule denied after rules [0, denied)
// were reserved: it undoes them, or with CountDenied charges the
// remaining rules too.
func (l *Limiter) release(e *local.Entry, denied int, words *[4]local.Word, n, now int64) {
	if l.cfg.CountDenied {
		for i := denied; i < len(l.rules); i++ {
			l.charge(e, i, n, now)
		}
	} else {
		for i := range denied {
			l.undo(e, i, words, n)
		}
	}
	e.Seen(now)
	e.Count(false)
	if l.syncing {
		// A node that only denies still needs the cluster's counts of the
		// key, to learn when others' admissions slide out.
		l.table.Touch(e)
	}
}

// decide runs decideLocal and builds the Result, for the callers off the
// hot path. It reports false when the entry was evicted under it.
func (l *Limiter) decide(e *local.Entry, n, now int64, peek bool) (Result, bool) {
	best, rem, reset, st := l.decideLocal(e, n, now, peek)
	switch st {
	case admitted:
		r := &l.rules[best]
		return Result{Allowed: true, Rule: best, Limit: r.limit, Window: r.window, Remaining: rem, ResetAfter: reset}, true
	case denied:
		return l.deniedResult(e, n, now), true
	}
	return Result{}, false
}

// deniedResult describes a denied request of cost n on e at now: the
// reported rule is the one that needs the longest wait.
func (l *Limiter) deniedResult(e *local.Entry, n, now int64) Result {
	var v views
	for i := range l.rules {
		v[i] = l.view(e, i, now)
	}
	return l.summarize(&v, n, false)
}

// charge adds n to rule i of e unconditionally (CountDenied).
func (l *Limiter) charge(e *local.Entry, i int, n, now int64) {
	r, c := &l.rules[i], &e.C[i]
	id, _ := windowOf(now, r.w)
	for {
		w := c.Load()
		switch {
		case w.Rolling():
			e.WaitRoll()
		case c.Window() < id:
			l.table.AddDropped(e.Roll(i, id, now+l.readPrev, l.syncing))
		case c.CompareAndAdd(w, n):
			return
		}
	}
}

// view is one rule's counts as a decision sees them.
type view struct {
	prev, cur, elapsed int64
}

type views [MaxRules]view

// view reads rule i of e at now without changing it, as if rolled over.
func (l *Limiter) view(e *local.Entry, i int, now int64) view {
	r, c := &l.rules[i], &e.C[i]
	id, el := windowOf(now, r.w)
	w := c.Load()
	win := c.Window()
	prev, cur := c.Prev(), c.Synced()+w.Count()
	switch {
	case win == id-1:
		prev, cur = cur, 0
	case win < id-1:
		prev, cur = 0, 0
	case win > id:
		el = 0
	}
	return view{prev: prev, cur: cur, elapsed: el}
}

// summarize builds the result of a decision from every rule's view. For a
// denied request the reported rule is the one that needs the longest wait.
func (l *Limiter) summarize(v *views, n int64, allowed bool) Result {
	res := Result{Allowed: allowed, Rule: -1, Remaining: math.MaxInt64, RetryAfter: -1}
	for i := range l.rules {
		r, x := &l.rules[i], &v[i]
		est := r.estimate(x.prev, x.cur, x.elapsed)
		var better bool
		if allowed {
			rem := r.remaining(est)
			better = rem < res.Remaining
		} else {
			retry := r.retryAfter(x.prev, x.cur, x.elapsed, n)
			better = retry > res.RetryAfter
			if better {
				res.RetryAfter = retry
			}
		}
		if better {
			res.Rule, res.Limit, res.Window = i, r.limit, r.window
			res.Remaining = r.remaining(est)
			res.ResetAfter = r.resetAfter(x.prev, x.cur, x.elapsed)
		}
	}
	if allowed {
		res.RetryAfter = 0
	}
	return res
}

// untracked decides a request for a new key while the table is full.
func (l *Limiter) untracked(key string, n, now int64) Result {
	l.overflow.Add(1)
	res := l.emptyRes
	res.Degraded = true
	if l.cfg.FailurePolicy == FailClosed {
		l.untrackedDenied.Add(1)
		res.Allowed = false
		res.RetryAfter = time.Second
		return res
	}
	l.untrackedAllowed.Add(1)
	res.Remaining -= n
	return res
}

// failClosed denies a request while the store fails, under FailClosed.
func (l *Limiter) failClosed(key string, now int64) Result {
	l.degraded.Add(1)
	l.untrackedDenied.Add(1)
	res := l.emptyRes
	res.Allowed, res.Degraded = false, true
	res.Remaining = 0
	res.RetryAfter = l.loop.Stats().Backoff
	return res
}

// decideStore makes one decision in the store (ModeSynchronous). When the
// store fails, FailOpen decides on the local view, whose increments the
// background loop pushes once the store is back.
func (l *Limiter) decideStore(ctx context.Context, key string, n int64, peek bool) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{Rule: -1}, err
	}
	now := l.now()
	e := l.table.LoadOrCreate(key, now)
	tracked := e != nil
	if !tracked {
		l.overflow.Add(1)
		e = l.table.Scratch(key, now)
	}
	c := getCall(len(l.rules))
	defer putCall(c)
	req := &c.req
	req.Rules, req.NowUs, req.Cost, req.Peek, req.CountDenied = l.take, now/int64(time.Microsecond), n, peek, l.cfg.CountDenied
	ids := c.ids[:len(l.rules)]
	for i := range l.rules {
		r := &l.rules[i]
		id, _ := windowOf(now, r.w)
		ids[i] = id
		req.Keys[2*i], req.Keys[2*i+1] = e.StoreKeys(i, id, l.keyBase, r.counterKey)
		req.ExpireAt[i] = store.ExpireAt(r.wms, id)
	}
	err := l.batch.do(c)
	if err == nil {
		err = req.Err
	}
	if err != nil {
		l.degraded.Add(1)
		l.loop.ReportError(err)
		if l.cfg.FailurePolicy == FailClosed {
			return l.failClosed(key, now), nil
		}
		for {
			res, ok := l.decide(e, n, now, peek)
			if ok {
				res.Degraded = true
				return res, nil
			}
			e = l.table.LoadOrCreate(key, now)
			if e == nil {
				return l.untracked(key, n, now), nil
			}
		}
	}
	var v views
	for i := range l.rules {
		r := &l.rules[i]
		_, el := windowOf(now, r.w)
		v[i] = view{cur: req.Counts[2*i], prev: req.Counts[2*i+1], elapsed: el}
		if tracked {
			e.Observe(i, ids[i], v[i].cur, v[i].prev)
		}
	}
	if tracked && !peek {
		e.Seen(now)
		e.Count(req.Allowed)
	} else if !peek {
		if req.Allowed {
			l.untrackedAllowed.Add(1)
		} else {
			l.untrackedDenied.Add(1)
		}
	}
	return l.summarize(&v, n, req.Allowed), nil
}

// keyBase returns the store key prefix of a user key.
func (l *Limiter) keyBase(key string) string { return store.KeyBase(l.cfg.Prefix, key) }

// Sync runs one sync cycle now: it pushes the pending increments of the
// keys touched since the last cycle and pulls their cluster totals. The
// background loop calls it every SyncRate; call it yourself with
// Config.Manual, or to push early. It returns the store's error, if any; the
// increments are then kept for the next cycle.
func (l *Limiter) Sync(ctx context.Context) error {
	if !l.syncing {
		return nil
	}
	return l.loop.Cycle(ctx)
}

// SyncClock measures this node's clock offset to the store's clock now
// (the background loop does it every Config.ClockSync).
func (l *Limiter) SyncClock(ctx context.Context) error {
	if !l.syncing || l.cfg.ClockSync < 0 {
		return nil
	}
	return l.loop.MeasureOffset(ctx, l.clock)
}

// Evict removes keys idle for twice their longest window, whose counters
// can no longer influence any decision, and returns how many it removed.
// The background loop calls it periodically.
func (l *Limiter) Evict() int {
	return l.table.Evict(l.now())
}

// Close stops the background goroutines, then pushes every pending
// increment to the store, within ctx. Decisions after Close return
// ErrClosed. Close returns the store's error if the final push failed
// (the increments are then lost); calling it again returns the same error.
func (l *Limiter) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		close(l.stop)
		l.wg.Wait()
		if l.syncing {
			l.closeErr = l.loop.Flush(ctx)
		}
	})
	return l.closeErr
}
