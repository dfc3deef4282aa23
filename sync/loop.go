// Package syncloop is the sync loop of a hybridlimit Limiter: every cycle
// it takes the pending increments of the keys this node touched from the
// local table, sends them to the store in batches (INCRBY, which returns
// the merged cluster total), and hands the store's answers back to the
// table. It owns the delivery protocol: every batch carries this node's
// identity and a sequence number, and a batch whose answer was lost is sent
// again unchanged until the store answers, so that the store applies every
// increment exactly once (see package store).
//
// The package lives in the directory sync/ and is named syncloop. Users of
// hybridlimit never import it: a Limiter runs it.
package syncloop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Config configures a Loop.
type Config struct {
	// Tables are the tables the loop syncs (one per tier of rules).
	Tables []*local.Table
	Store  store.Store
	Prefix string // the store namespace of the counters
	Node   string // this node's identity in the store's markers: unique to this Loop (store.Batch.Node)
	// Now returns the current instant (ns since the Unix epoch) on the
	// cluster's clock, as decisions see it.
	Now func() int64
	// Clock drives the schedule and measures latencies.
	Clock clock.Clock
	// Rate is the time between cycles.
	Rate time.Duration
	// Recent is how long after its last decision a key keeps being read
	// back in every cycle, so that the node learns what others admit.
	Recent time.Duration
	// Timeout bounds every store call.
	Timeout time.Duration
	// ClockSync is the period of MeasureOffset in Run; 0 or less: never,
	// and the node's own clock is the one to use (FirstClock reads
	// nothing).
	ClockSync time.Duration
	// OnError, OnSync, Logger and LogEvery report store errors and
	// cycles; see hybridlimit.Config.
	OnError  func(error)
	OnSync   func(latency time.Duration, ops int, err error)
	Logger   *slog.Logger
	LogEvery time.Duration
}

// Limits of a cycle.
const (
	maxOps = 512  // counter operations per batch (one script call)
	chunk  = 4096 // entries taken and pushed at a time: bounds the scratch memory
	// wideChunk is chunk once a full chunk's entries fell in more than a
	// quarter as many groups (4096 entries over a Redis Cluster's 16,384
	// hash slots make batches of about one counter, each paying a script
	// call's marker and checks): about four entries per hash slot.
	wideChunk  = 4 * 16384
	maxBackoff = 5 * time.Second
	// backoffRates caps the backoff at this many sync periods (and at
	// maxBackoff): a node that waits out a backoff once the store is back
	// pushes nothing, so the other nodes see its share of the traffic
	// vanish and take it over (the share policy), until it syncs again.
	backoffRates = 10
)

// Backoff returns the wait after a cycle that reached no part of the
// store, the last wait having been delay, for a loop of period rate:
// twice delay, at least rate, at most 10 × rate and 5 s (but never below
// rate). Run adds up to a fifth of it as jitter; the simulation does the
// same with its own random source.
func Backoff(delay, rate time.Duration) time.Duration {
	return min(max(2*delay, rate), max(min(maxBackoff, backoffRates*rate), rate))
}

// Loop runs sync cycles for a set of tables. Its methods are safe for
// concurrent use; cycles run one at a time. Create one with New.
type Loop struct {
	cfg Config

	mu       sync.Mutex // one cycle at a time; guards the fields below
	flushing bool
	whole    bool  // this cycle waits for every store call (CycleAll)
	refusal  error // the final flush: why the store refused some ops
	seq      uint64
	doubt    []*batch       // batches in doubt, in the order they were first sent
	flights  []*flight      // store calls push stopped waiting for, in the order sent
	entries  []owned        // one chunk being sent
	scratch  []*local.Entry // one chunk of touched entries
	free     []*batch
	chunk    int // entries per chunk: chunk, or wideChunk

	stats  counters
	offset atomic.Int64
	// clockRTT is the round trip of the clock reading offset comes from
	// (negative: none yet), under clockMu.
	clockMu  sync.Mutex
	clockRTT time.Duration
	// clockKnown: a reading of the store's clock succeeded, or ClockSync
	// is off (the node's own clock is the one to use).
	clockKnown atomic.Bool
	firstMu    sync.Mutex
	firstRead  *clockRead // FirstClock's last reading, under firstMu
	// firstStop ends FirstClock's reading under way (Flush: no store
	// call or OnError after Close), under firstMu.
	firstStop context.CancelFunc
	failing   atomic.Bool
	// failed holds the groups whose batches failed in the last cycle, or
	// nil when the whole store failed (a probe).
	failed      atomic.Pointer[map[int]bool]
	cycleFailed map[int]bool // being filled by the cycle under way

	logMu      sync.Mutex
	lastLog    time.Time
	suppressed int
}

// batch is one store.Batch with the entries it carries: the pushes of
// spans[k] are pushes[spans[k].from:spans[k].to], and op j of the batch is
// push j.
type batch struct {
	sb     store.Batch
	pushes []local.Push
	spans  []span
	doubt  bool // in doubt since an earlier call
}

type span struct {
	owned
	from, to int
	again    bool
}

// owned is an entry and its table.
type owned struct {
	t *local.Table
	e *local.Entry
}

// touched starts a cycle in every table (local.Table.Detach) and reports
// whether any entry was touched.
func (l *Loop) touched() bool {
	found := false
	for _, t := range l.cfg.Tables {
		if t.Detach() {
			found = true
		}
	}
	return found
}

// sendTouched takes every table's touched entries in chunks and sends
// them, the batches in doubt first. It returns the outcome and the number
// of entries sent. Only a chunk of entries is held at a time: the queue
// itself is linked through the entries.
func (l *Loop) sendTouched(ctx context.Context, final bool) (result, int) {
	var res result
	keys := 0
	for _, t := range l.cfg.Tables {
		for {
			l.scratch = t.Touched(l.scratch[:0], l.chunk)
			if len(l.scratch) == 0 {
				break
			}
			keys += len(l.scratch)
			for _, e := range l.scratch {
				l.entries = append(l.entries, owned{t, e})
			}
			clear(l.scratch)
			res.add(l.send(ctx, l.entries, final))
			clear(l.entries)
			l.entries = l.entries[:0]
		}
	}
	if keys == 0 && len(l.doubt) > 0 {
		res.add(l.send(ctx, nil, final))
	}
	return res, keys
}

// New returns a loop for cfg. Its Backoff is cfg.Rate until Run changes
// it, also when Run never runs (the caller runs the cycles).
func New(cfg Config) *Loop {
	l := &Loop{cfg: cfg, clockRTT: -1, chunk: chunk}
	l.stats.backoff.Store(int64(cfg.Rate))
	l.clockKnown.Store(cfg.ClockSync <= 0)
	return l
}

// clockRead is one reading of the store's clock by FirstClock: err is set
// when done is closed.
type clockRead struct {
	done chan struct{}
	err  error
}

// FirstClock reads the store's clock unless the offset is known (a
// reading succeeded, or ClockSync is off), and returns the reading's error. Concurrent callers share
// the reading under way, made apart from any caller's context (bounded by
// Timeout): each waits for it or for its own ctx to end, whose error it
// then returns; a caller after a finished reading starts another. A failed
// reading marks the store failing. The synchronous mode calls it
// before the decisions it would otherwise make at the node's own instant,
// in another window than the store's, and a cycle before pushing.
func (l *Loop) FirstClock(ctx context.Context) error {
	if l.clockKnown.Load() {
		return nil
	}
	l.firstMu.Lock()
	if l.clockKnown.Load() {
		l.firstMu.Unlock()
		return nil
	}
	r := l.firstRead
	if r != nil {
		select {
		case <-r.done:
			r = nil // finished, and failed (the offset is not known): read again
		default: // under way: wait for it
		}
	}
	if r == nil {
		r = &clockRead{done: make(chan struct{})}
		l.firstRead = r
		rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		l.firstStop = stop
		go func() {
			defer stop()
			_, err := l.measureOffset(rctx)
			if err != nil && rctx.Err() == nil {
				l.failing.Store(true)
			}
			r.err = err
			close(r.done)
		}()
	}
	l.firstMu.Unlock()
	select {
	case <-r.done:
		return r.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopFirstClock ends FirstClock's reading under way, if any: it reports
// nothing more.
func (l *Loop) stopFirstClock() {
	l.firstMu.Lock()
	defer l.firstMu.Unlock()
	if l.firstStop != nil {
		l.firstStop()
	}
}

// Failing reports whether a batch failed in the last cycle whose calls returned.
func (l *Loop) Failing() bool { return l.failing.Load() }

// KeyFailing reports whether the store failed for key's group in the last
// cycle (or failed as a whole). It is meaningful only while Failing.
func (l *Loop) KeyFailing(key string) bool {
	m := l.failed.Load()
	return m == nil || (*m)[l.cfg.Store.Group(key)]
}

// Backoff returns the wait before the next cycle.
func (l *Loop) Backoff() time.Duration { return time.Duration(l.stats.backoff.Load()) }

// Offset returns the last measured offset of the store's clock to this
// node's, in nanoseconds.
func (l *Loop) Offset() int64 { return l.offset.Load() }

// OffsetVar returns the variable holding Offset, for readers that cannot
// afford a call.
func (l *Loop) OffsetVar() *atomic.Int64 { return &l.offset }

// ReportError records a store error met outside the loop (a synchronous
// decision) in the loop's statistics, log and OnError.
func (l *Loop) ReportError(err error) { l.fail(err) }

func (l *Loop) fail(err error) {
	l.failing.Store(true)
	l.report(err)
}

// report counts, logs and passes on a store error.
func (l *Loop) report(err error) {
	l.stats.errors.Add(1)
	l.stats.lastError.Store(&errBox{err})
	if l.cfg.OnError != nil {
		l.cfg.OnError(err)
	}
	l.log("hybridlimit: store error", "err", err)
}

// log writes a warning, at most one per LogEvery, with the count of those
// suppressed since the last one.
func (l *Loop) log(msg string, args ...any) {
	if l.cfg.Logger == nil {
		return
	}
	l.logMu.Lock()
	now := l.cfg.Clock.Now()
	if !l.lastLog.IsZero() && now.Sub(l.lastLog) < l.cfg.LogEvery {
		l.suppressed++
		l.logMu.Unlock()
		return
	}
	n := l.suppressed
	l.lastLog, l.suppressed = now, 0
	l.logMu.Unlock()
	l.cfg.Logger.Warn(msg, append(args, "suppressed", n, "since", l.cfg.LogEvery)...)
}

// Cycle runs one sync cycle over the entries touched since the last one
// and the batches still in doubt. It makes no store call when there is
// nothing to send, except a probe while the store is failing. It returns
// the first store error, and errNoneApplied-wrapping errors when no batch
// of the cycle was applied.
func (l *Loop) Cycle(ctx context.Context) error {
	return l.cycle(ctx, false)
}

// CycleAll is Cycle waiting for every store call: for the calls still
// under way from earlier cycles (a hung Cluster master's, which Cycle
// stops waiting for, see push) before it sends, and for each call it
// makes. When it returns, every batch it sent has its outcome, unless ctx
// ended first (Limiter.Sync).
func (l *Loop) CycleAll(ctx context.Context) error {
	return l.cycle(ctx, true)
}

func (l *Loop) cycle(ctx context.Context, whole bool) error {
	if err := ctx.Err(); err != nil {
		return err // the caller gave up: nothing sent, nothing learnt of the store
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	start := l.cfg.Clock.Now()
	l.stats.running.Store(start.UnixNano())
	defer l.stats.running.Store(0)
	l.whole = whole
	defer func() { l.whole = false }()
	if whole {
		l.waitFlights(ctx)
	}
	if !l.clockKnown.Load() {
		// Called by hand (Limiter.Sync): no push into the windows of a
		// guessed clock either (Run cycles only once the clock is known).
		if err := l.FirstClock(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w (%w)", err, errNoneApplied)
		}
	}
	l.cycleFailed = l.stillFailing()
	landed := l.landDone()
	if !l.touched() && len(l.doubt) == 0 && landed.applied+landed.failed+landed.gone == 0 {
		if len(l.flights) > 0 {
			return nil // nothing to send, and an answer to wait for
		}
		if l.failing.Load() {
			// Nothing to send, but the store was failing: probe it, so
			// that a fail-closed limiter learns that it is back.
			if err := l.probe(ctx); err != nil {
				return err
			}
			l.failing.Store(false)
		}
		return nil
	}
	res, keys := l.sendTouched(ctx, false)
	res.add(landed)
	l.noteFailing(res)
	failed := l.cycleFailed
	l.failed.Store(&failed)
	if res.applied == 0 && res.failed > 0 && ctx.Err() == nil {
		// (A probe on the caller's ended context would fail without
		// reaching the store.)
		res.down = l.probe(ctx) != nil // a failed probe marks every group failing
	}
	end := l.cfg.Clock.Now()
	l.stats.cycle(start, end, keys)
	if d := end.Sub(start); d > l.cfg.Rate {
		l.log("hybridlimit: sync cycle slower than Config.SyncRate: decisions see the cluster later than the rate says",
			"cycle", d, "rate", l.cfg.Rate, "keys", keys)
	}
	return res.err()
}

// noteFailing sets Failing from the calls that returned in a cycle, res:
// whether some batch failed, as long as one returned (the failures of
// calls the caller gave up on early, res.gone, say nothing of the store).
func (l *Loop) noteFailing(res result) {
	switch {
	case res.failed > 0:
		l.failing.Store(true)
	case res.applied > 0:
		l.failing.Store(false)
	}
}

// stillFailing returns a new cycle's failing groups: those of the flights
// under way that the last cycle found failing (their groups get no batch
// until the flight lands).
func (l *Loop) stillFailing() map[int]bool {
	m := map[int]bool{}
	last := l.failed.Load()
	if last == nil || *last == nil {
		return m
	}
	for _, f := range l.flights {
		for _, b := range f.batches {
			if (*last)[b.sb.Group] {
				m[b.sb.Group] = true
			}
		}
	}
	return m
}

// result sums the outcome of the calls of a cycle.
type result struct {
	applied, failed int // batches
	first           error
	down            bool // nothing applied, and the store failed a probe
	// gone counts the batches not applied in calls whose caller gave up
	// early (its context ended within half of Timeout: Limiter.Sync's or
	// Close's caller, or the loop stopping): the failure may be the
	// caller's, not the store's.
	gone int
}

func (r *result) add(o result) {
	r.applied += o.applied
	r.failed += o.failed
	r.gone += o.gone
	if r.first == nil {
		r.first = o.first
	}
}

// errNoneApplied marks a cycle in which no batch reached the store and the
// store did not answer a probe either: Run backs off after it. A cycle in
// which some batches were applied, or whose failed batches all belong to a
// part of the store that is down (a dead shard of a cluster) while the rest
// answers, keeps the rate.
var errNoneApplied = errors.New("the store does not answer")

func (r *result) err() error {
	if r.first == nil {
		return nil
	}
	if r.down {
		return fmt.Errorf("%w (%w)", r.first, errNoneApplied)
	}
	return r.first
}

func (l *Loop) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	l.stats.calls.Add(1)
	if _, err := l.cfg.Store.Time(ctx); err != nil {
		l.failed.Store(nil)
		l.fail(err)
		return fmt.Errorf("%w (%w)", err, errNoneApplied)
	}
	return nil
}

// MeasureOffset reads the store's clock and records its offset to this
// node's clock, correcting for half the round trip. Decisions add the
// offset so that every node's windows follow the store's clock.
//
// The offset's error is up to half the round trip, and a synchronous
// request's deadline, half of Timeout after its sending, is set on that
// offset: a clock read slowed by a hung server or network (up to Timeout)
// would move every deadline by up to half of it, until the next read, and
// a server resuming from a hang would then count requests its client had
// given up on. A reading whose round trip exceeds a quarter of Timeout is
// therefore imprecise: it replaces the offset only if none was measured
// yet or the offset in use came from a slower reading, and Run reads again
// at its next cycle rather than after ClockSync.
func (l *Loop) MeasureOffset(ctx context.Context) error {
	_, err := l.measureOffset(ctx)
	return err
}

// measureOffset is MeasureOffset, and reports whether the reading was
// precise.
func (l *Loop) measureOffset(parent context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(parent, l.cfg.Timeout)
	defer cancel()
	c := l.cfg.Clock
	t0 := c.Now()
	st, err := l.cfg.Store.Time(ctx)
	l.stats.calls.Add(1)
	if err != nil {
		if parent.Err() == nil { // not the caller giving up
			l.report(err) // the next cycle or probe tells whether the store fails
		}
		return false, err
	}
	t1 := c.Now()
	rtt := t1.Sub(t0)
	precise := rtt <= l.cfg.Timeout/4
	l.clockMu.Lock()
	defer l.clockMu.Unlock()
	if precise || l.clockRTT < 0 || rtt < l.clockRTT {
		l.offset.Store(int64(st.Sub(t0.Add(rtt / 2))))
		l.clockRTT = rtt
	}
	l.clockKnown.Store(true)
	return precise, nil
}

// Run runs cycles every Rate (backing off exponentially, with jitter, up
// to max(5s, Rate) while no batch reaches the store) and measures the
// clock offset every ClockSync, until stop is closed. It measures the
// offset once before the first cycle and, until a reading succeeds, again
// at each cycle (every ClockSync, if that is shorter than Rate), skipping
// the cycles meanwhile (marking the store failing).
func (l *Loop) Run(stop <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-stop
		cancel()
	}()
	c := l.cfg.Clock
	now := c.Now()
	// The clock is read again after ClockSync, or at the next cycle after
	// an imprecise reading (see MeasureOffset), or, until a reading
	// succeeds, after a failed one: the store is then failing, and no
	// cycle pushes increments into windows of this node's own clock.
	clockAfter := func() time.Duration {
		ok, err := l.measureOffset(ctx)
		if err != nil && !l.clockKnown.Load() && ctx.Err() == nil {
			l.failing.Store(true)
		}
		if (err != nil && !l.clockKnown.Load() || err == nil && !ok) && l.cfg.Rate < l.cfg.ClockSync {
			return l.cfg.Rate
		}
		return l.cfg.ClockSync
	}
	nextClock := now.Add(l.cfg.ClockSync)
	if l.cfg.ClockSync > 0 {
		nextClock = now.Add(clockAfter())
	}
	delay := l.cfg.Rate
	l.stats.backoff.Store(int64(delay))
	// The first cycle at a random point of the first period: nodes started
	// together then sync at independent instants, as the async share
	// policy assumes (and as is kinder to the store).
	nextSync := now.Add(time.Duration(rand.Int64N(int64(delay))) + 1)
	for {
		next := nextSync
		if l.cfg.ClockSync > 0 && nextClock.Before(next) {
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
		if l.cfg.ClockSync > 0 && !now.Before(nextClock) {
			nextClock = now.Add(clockAfter())
		}
		if !now.Before(nextSync) && !l.clockKnown.Load() {
			nextSync = now.Add(l.cfg.Rate) // no push on a guessed clock
		} else if !now.Before(nextSync) {
			err := l.Cycle(ctx)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, errNoneApplied):
				delay = Backoff(delay, l.cfg.Rate)
				delay += time.Duration(rand.Int64N(int64(delay)/5 + 1))
			default:
				delay = l.cfg.Rate
			}
			l.stats.backoff.Store(int64(delay))
			nextSync = now.Add(delay)
		}
	}
}
