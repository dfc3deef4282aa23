package hybridlimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// The synchronous mode: every decision is a TakeRequest decided by the
// store, atomically. Concurrent decisions share round trips: while a batch
// is on its way, those that arrive queue up, and the first of them sends
// them all next. At most maxInFlight batches are on their way at once, and
// a second one leaves only once the queue holds as many decisions as the
// one on its way (a lone decision beside a lone one): a batch's end hands
// the queue on when no other batch is on its way, or when the queue is as
// large as the other one. Under load a round trip then carries more
// decisions, and a decision that finds no batch on its way leaves at once.
// With a store that is a store.Router (the Redis store on a Redis
// Cluster), each route (master) has its own queue and batches, so that a
// master that hangs holds only the decisions on its own keys.
//
// A request the store did not decide (it failed, or its answer was lost)
// is decided by the FailurePolicy on this node's table, whose increments
// the sync loop pushes later. A request whose answer was lost may still
// have been counted by the store before its deadline (half of
// Config.StoreTimeout after it was sent), and is then counted twice: at
// most the requests of the batches in flight when the answers stopped, and
// of one batch per probe of the store's circuit breaker while answers stay
// lost from a server that still runs the calls (docs/failures.md). A
// store that hung and resumes counts nothing past a request's deadline,
// and the store's circuit breaker fails requests at once while it does not
// answer.

const (
	maxBatch    = 512 // decisions per round trip
	maxInFlight = 2   // round trips on their way at once
	maxRoutes   = 64  // queues of a store.Router's routes (more share them)
)

type synchronous struct {
	l       *Limiter
	timeout time.Duration
	router  store.Router // nil: one queue
	calls   atomic.Uint64

	one    route                            // the queue without a Router
	routes [maxRoutes]atomic.Pointer[route] // with one, made on first use
}

// route is the queue of the decisions of one route of the store (all of
// them without a store.Router): its batches go out, at most maxInFlight
// at once, whatever the other routes' do, so that a server that hangs
// holds only the decisions on its own keys.
type route struct {
	s        *synchronous
	mu       sync.Mutex
	queue    []*call
	inflight int // batches on their way
	flying   int // calls in the batches on their way
	free     []*batch
}

// call is one synchronous decision waiting for the store.
type call struct {
	req   store.TakeRequest
	batch *batch    // set when the call is handed a batch to send
	done  chan bool // receives true: send batch; false: req is decided
}

// batch is the calls of one round trip and their requests. A batch's
// arrays serve the next round trips once it is done: at most maxInFlight
// batches exist per route.
type batch struct {
	calls []*call
	reqs  []*store.TakeRequest
}

var callPool = sync.Pool{New: func() any { return &call{done: make(chan bool, 1)} }}

func newSynchronous(l *Limiter) *synchronous {
	s := &synchronous{l: l, timeout: l.cfg.StoreTimeout}
	s.one.s = s
	s.router, _ = l.cfg.Store.(store.Router)
	return s
}

// route returns the queue of the decisions on key.
func (s *synchronous) route(key string) *route {
	if s.router == nil {
		return &s.one
	}
	i := uint(s.router.Route(s.l.cfg.Prefix, key)) % maxRoutes
	if r := s.routes[i].Load(); r != nil {
		return r
	}
	s.routes[i].CompareAndSwap(nil, &route{s: s})
	return s.routes[i].Load()
}

// decide makes one decision in the store, or by the FailurePolicy when
// the store does not decide it.
func (s *synchronous) decide(ctx context.Context, t *tier, key string, n int64, peek bool) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{Rule: -1}, err
	}
	l := s.l
	// Until the node has read the store's clock, its own instant may lie
	// in another window than the store's: the first decisions wait for
	// that reading, and without one the store has not decided.
	clockErr := l.loop.FirstClock(ctx)
	now := l.clock.now()
	us := now / int64(time.Microsecond)
	c := callPool.Get().(*call)
	defer callPool.Put(c)
	c.req = store.TakeRequest{
		Prefix:      l.cfg.Prefix,
		Key:         key,
		Rules:       t.rules,
		Now:         us, // Deadline is set when the request is sent
		Cost:        n,
		Peek:        peek,
		CountDenied: l.cfg.CountDenied,
		Counts:      c.req.Counts,
	}
	if clockErr != nil {
		if err := ctx.Err(); err != nil {
			return Result{Rule: -1}, err
		}
		c.req.Status, c.req.Err = store.Failed, clockErr // reported by FirstClock
	} else {
		s.route(key).do(c)
	}
	req := &c.req
	if req.Status != store.Applied {
		if clockErr == nil {
			l.loop.ReportError(req.Err)
		}
		if l.cfg.FailurePolicy == FailClosed {
			return l.failClosed(t, !peek), nil
		}
		if !peek {
			l.degraded.Add(1)
		}
		var res Result
		var err error
		if peek {
			res = t.result(t.table.Peek(key, n, now))
		} else {
			res, err = l.decideLocal(t, key, n, now, false)
		}
		res.Degraded = true
		return res, err
	}
	// Describe the decision at the store's instant, in its microseconds,
	// so that a request retried at RetryAfter is admitted.
	at := us * int64(time.Microsecond)
	counts := req.Counts[:len(t.rules)]
	if !t.table.Observe(key, at, counts, req.Allowed, !peek) && !peek {
		// The table is full and the key untracked: the store decided,
		// the limiter counts the decision.
		l.overflow.Add(1)
		if req.Allowed {
			l.untrackedAllowed.Add(1)
		} else {
			l.untrackedDenied.Add(1)
		}
	}
	if !peek && !req.Allowed && l.bans != nil {
		l.noteDenied(key, at)
	}
	cost := n
	if peek && req.Allowed {
		cost = 0 // Remaining before the request
	}
	return t.result(local.Summarize(t.rules, counts, cost, req.Allowed, int64(time.Microsecond))), nil
}

// do has c.req decided by the store, alone or with others.
func (s *route) do(c *call) {
	s.mu.Lock()
	s.queue = append(s.queue, c)
	if s.inflight >= maxInFlight || s.inflight > 0 && len(s.queue) < s.flying {
		s.mu.Unlock()
		if !<-c.done {
			return
		}
		s.send(c, c.batch) // the batch that finished handed its slot over
		return
	}
	s.inflight++
	batch := s.next()
	s.mu.Unlock()
	s.send(c, batch)
}

// next removes the queue's head, up to maxBatch calls, and returns it as
// a batch. Call with s.mu held.
func (s *route) next() *batch {
	k := min(len(s.queue), maxBatch)
	var b *batch
	if n := len(s.free); n > 0 {
		b, s.free = s.free[n-1], s.free[:n-1]
	} else {
		b = &batch{}
	}
	b.calls = append(b.calls[:0], s.queue[:k]...)
	// Shift what stays first, then clear the tail it leaves: clearing the
	// last k first would wipe the calls past the batch in a queue longer
	// than one.
	n := copy(s.queue, s.queue[k:])
	clear(s.queue[n:])
	s.queue = s.queue[:n]
	s.flying += k
	return b
}

// send sends b (whose first call is c) as one round trip, then hands its
// slot over with the next batch to the queue's head, if any.
func (s *route) send(c *call, b *batch) {
	c.batch = nil
	batch := b.calls
	// The deadline counts from the sending, not from the decision: a
	// request that waited in the queue behind slow round trips (a dead
	// shard's, until its circuit opens) still gets its full time in the
	// store.
	sy := s.s
	deadline := sy.l.clock.now()/int64(time.Microsecond) + int64(sy.timeout/2/time.Microsecond)
	reqs := b.reqs[:0]
	for _, x := range batch {
		x.req.Deadline = deadline
		reqs = append(reqs, &x.req)
	}
	b.reqs = reqs
	ctx, cancel := context.WithTimeout(context.Background(), sy.timeout)
	sy.calls.Add(1)
	err := sy.l.cfg.Store.Take(ctx, reqs)
	if err == nil {
		err = ctx.Err()
	}
	cancel()
	for _, x := range batch {
		if x.req.Status == store.NotSent { // a store that only returned an error
			x.req.Status, x.req.Err = store.InDoubt, err
			if x.req.Err == nil {
				x.req.Err = errors.New("hybridlimit: the store set no status")
			}
		}
		if x != c {
			x.done <- false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.flying -= len(batch)
	// The calls woken above may be deciding again already, in other
	// batches: forget them.
	clear(b.calls)
	clear(b.reqs)
	s.free = append(s.free, b)
	if len(s.queue) == 0 || s.inflight > 1 && len(s.queue) < s.flying {
		s.inflight--
		return
	}
	next := s.next()
	next.calls[0].batch = next
	next.calls[0].done <- true
}
