// Package store defines where hybridlimit nodes meet: a Store holds the
// cluster-wide counter of every key, rule and window, takes each node's
// increments, and decides requests atomically for the synchronous mode.
// Two implementations share one contract, tested by the same suite: Redis
// (NewRedis, on any go-redis client: standalone, Sentinel or Cluster) and
// Memory (NewMemory, for tests, simulations and a single process).
//
// Users pass a Store to hybridlimit.Config and otherwise never call it: the
// limiter's sync loop and its synchronous decisions do.
//
// # Delivery
//
// Increments travel in Batches, each applied atomically and at most once:
// every batch carries its node's identity and a sequence number, and the
// store remembers, per node and group, the last sequence it applied. A
// batch whose reply was lost (a timeout, a cut connection, a store that
// hung and resumed) is sent again unchanged; the store applies it if it
// never did, and otherwise only reads. With the sync loop sending every
// unanswered batch again until it gets an answer, every increment is
// applied exactly once, in every topology. What a store loses by itself
// (Redis' asynchronous replication when a master fails over) is not
// recovered: docs/failures.md in the repository says what each topology
// loses and how RedisOptions.WaitReplicas closes that gap.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// Store is the shared state of a cluster of limiters. Implementations must
// be safe for concurrent use.
type Store interface {
	// Group returns the group of a user key. All counters of a key are in
	// its group; batches of one group from one node are applied in the
	// order given, and a Take request reads and writes only its group.
	// Groups are small non-negative integers (Redis Cluster: the key's hash
	// slot).
	Group(key string) int

	// Push applies batches and reports, in each batch's Status, Totals and
	// Err, what became of it. The returned error is only for a failure of
	// the whole call (a canceled context before anything was sent); every
	// batch's Status is set either way.
	Push(ctx context.Context, batches []*Batch) error

	// Take decides every request in reqs (see TakeRequest), and reports in
	// each request's Status and Err what became of it.
	Take(ctx context.Context, reqs []*TakeRequest) error

	// Time returns the store's clock. Limiters in a cluster align their
	// windows to it.
	Time(ctx context.Context) (time.Time, error)
}

// Router is implemented by a Store whose keys live on several servers
// that answer independently, such as the Redis store with a Redis Cluster
// client. The synchronous mode queues and sends the decisions of each
// route apart, so that a server that hangs delays only the decisions on
// its own keys.
type Router interface {
	// Route returns the route of the requests on key under prefix: a small
	// non-negative integer naming the server that holds its counters as
	// far as the store knows. A key may change route when the servers do.
	// Route is called for every synchronous decision: it must be cheap,
	// send nothing and never block.
	Route(prefix, key string) int
}

// Counter names one counter of one user key: a window's count, or (when
// Rate is set) a token or leaky bucket's arrival time.
type Counter struct {
	Key    string // the user key, any bytes
	Window int64  // the counter's window (a Bucketed rule's: one bucket), milliseconds
	ID     int64  // the window's number: its start in Unix milliseconds / Window
	Span   int64  // the windows a count is counted in (Bucketed: its buckets); 0 means 1
	Rate   int64  // an arrival time's emission interval, µs; 0 for a window's count
	Burst  int64  // an arrival time's burst (with Rate it names the counter)
}

// Op is one operation of a Batch: Delta added to Counter (creating it at
// zero, with an expiry after the window stops counting; see ExpireAt), or
// for an arrival time (Counter.Rate set) the time moved Delta intervals
// past max(itself, now), the store's now. A Delta of zero only reads the
// counter. Deltas may be negative: a node takes back what it counted in
// error. An arrival time reads and is returned in Unix microseconds.
type Op struct {
	Counter
	Delta int64
}

// Status is what became of a Batch or a TakeRequest.
type Status uint8

const (
	// NotSent is a Status not set yet.
	NotSent Status = iota
	// Applied: the store applied it, now or before (a batch sent again);
	// the results are set.
	Applied
	// Failed: the store did not apply it and never will; Err says why.
	// The caller may send the same increments again in a new batch.
	Failed
	// InDoubt: it was sent but no answer came back, so the store may have
	// applied it or may still. A Batch in doubt must be sent again
	// unchanged (same Node, Group, Seq and Ops) before any later batch of
	// its group; a TakeRequest in doubt is never applied after its
	// Deadline.
	InDoubt
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case NotSent:
		return "not sent"
	case Applied:
		return "applied"
	case Failed:
		return "failed"
	case InDoubt:
		return "in doubt"
	}
	return "Status(?)"
}

// Batch is a group of counter operations that the store applies
// atomically and at most once.
type Batch struct {
	// Prefix namespaces the counters (hybridlimit.Config.Prefix).
	Prefix string
	// Node identifies the pushing limiter; with Group it names the marker
	// that makes the batch at-most-once. It must never be reused by
	// another pusher, nor by a restarted one counting Seq again: the store
	// would take its batches for ones it applied before and drop them,
	// until the old marker expires (the limiter draws a random Node per
	// Limiter).
	Node string
	// Group is the group of every op's key (see Store.Group).
	Group int
	// Seq is greater than the Seq of every earlier batch of this Node and
	// Group, and below 2^53 (the Redis scripts compare it as a Lua number;
	// the sync loop counts from 1, one per batch).
	Seq uint64
	// Ops are the operations, in order.
	Ops []Op

	// Results, set by Push.

	// Totals holds, per op, the counter's value after the batch (or its
	// current value, for a batch applied before). Push allocates it when
	// its length is not len(Ops).
	Totals []int64
	// Refused, when Push sets it (length len(Ops)), marks the ops of an
	// applied batch that the store refused because their counter holds a
	// value the library did not write (ErrForeign, in Err): a refused op
	// changed nothing and its Total means nothing; the batch's other ops
	// are applied. Push empties it when no op was refused.
	Refused []bool
	// Status is what became of the batch.
	Status Status
	// Err says why the batch failed or is in doubt.
	Err error
}

// TakeRequest is one decision made in the store (the synchronous mode),
// atomically: every rule is checked as local.Rule.Admits checks it on the
// counts the store holds at Now (the tests hold every store to that), and,
// unless Peek is set, an admitted request is counted on every rule (and so
// is a denied one under CountDenied):
//
//	Sliding, Fixed, Bucketed: Cost added to the current window's counter
//	Log: Cost instants Now pushed on the key's log, which keeps as many as
//	     the largest Log limit and expires after the longest Log window
//	TokenBucket, LeakyBucket: the arrival time moved Cost intervals past
//	     max(it, Now)
type TakeRequest struct {
	Prefix      string       // namespaces the counters
	Key         string       // the user key
	Rules       []local.Rule // the rules, in order (read-only, may be shared)
	Now         int64        // the decision's instant, Unix microseconds on the store's clock
	Deadline    int64        // the store applies nothing after this instant (Unix µs, store clock)
	Cost        int64        // added to every rule
	Peek        bool         // decide only: change nothing
	CountDenied bool         // count Cost even when denied (the penalty)

	// Results, set by Take.

	// Status is what became of the request.
	Status Status
	// Allowed reports whether every rule admitted the request.
	Allowed bool
	// Counts holds, per rule, the counts the decision saw, after the
	// request when it was counted, at Now with Elapsed in nanoseconds.
	// Take allocates it when its length is not len(Rules).
	Counts []local.Counts
	// Err says why the request failed or is in doubt.
	Err error
}

// ErrUnavailable is wrapped by the errors of requests and batches that a
// store did not send because it knows the server to be unreachable (a
// circuit breaker is open), and by wrappers (the simulation's outage).
var ErrUnavailable = errors.New("store unavailable")

// ErrDeadline is the error of a TakeRequest that reached the store after
// its Deadline: the store decided nothing and counted nothing (Status
// Failed), and the limiter's FailurePolicy decides the request. It wraps
// ErrUnavailable.
var ErrDeadline = fmt.Errorf("store: request reached the store after its deadline: %w", ErrUnavailable)

// ErrForeign is wrapped by the error of a TakeRequest that a store did not
// decide because one of its counters holds a value the library did not
// write there (in Redis: a string that is not an integer, an integer out of
// range, a log that is not a list of numbers), and by a Batch's Err when
// the store refused some of its ops for that reason (Batch.Refused). The
// request, or the op, changed nothing; the others of the same Take or
// Batch are applied.
var ErrForeign = errors.New("a counter holds a foreign value")

// ExpireAt returns when the counter of window id (size window ms, counted
// in span windows) can go, in Unix milliseconds: once no window counts it
// any more (Sliding: after the next window, when it stops being anyone's
// previous window), plus a minute of margin for clock differences.
func ExpireAt(window, id, span int64) int64 {
	return (id+1+max(span, 1))*window + 60_000
}

// CounterOf returns the store counter of rule r for key: its window
// counter number id (unused for TokenBucket and LeakyBucket rules).
func CounterOf(r *local.Rule, key string, id int64) Counter {
	switch r.Kind() {
	case local.GCRA, local.Leaky:
		return Counter{Key: key, Rate: r.Interval().Microseconds(), Burst: r.Burst()}
	}
	w, span := r.Counter()
	return Counter{Key: key, Window: w.Milliseconds(), ID: id, Span: span}
}

// markerTTL is how long a store keeps a node's marker after the last batch
// of its group: a batch sent again later than this after its first
// sending, with no answer in between, may be applied twice.
const markerTTL = 10 * time.Minute

// resize returns s with length n, reusing its storage when it can.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
