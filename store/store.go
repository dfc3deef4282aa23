// Package store defines where hybridlimit nodes meet: a Store holds the
// cluster-wide counter of every key, rule and window. Two implementations
// share one contract: Redis (NewRedis, on a go-redis UniversalClient, for
// standalone, Sentinel and Cluster deployments) and Memory (NewMemory, for
// tests, simulations and a single process).
//
// Counter keys have the form
//
//	<prefix>:{<base64url(user key)>}:<window ms>:<window id>
//
// The user key is base64url-encoded, so it never contains '{' or '}': every
// counter of one user key shares the Redis Cluster hash slot of its braces,
// and no two user keys, whatever bytes they hold, share a counter.
package store

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"time"
)

// Store is the shared state of a cluster of limiters. Implementations must
// be safe for concurrent use.
type Store interface {
	// Apply runs ops, in one round trip where the implementation can. For
	// each op it adds Delta to the counter Key (creating it at zero), sets
	// the counter's expiry to ExpireAt when that is non-zero, and stores
	// the counter's value after the addition in Total. A Delta of zero only
	// reads the counter (a missing counter reads as zero and is not
	// created). On error, the caller must assume nothing was applied,
	// although some ops may have been.
	Apply(ctx context.Context, ops []Op) error

	// Take decides every request in reqs atomically per request: see
	// TakeRequest. Errors that concern one request are reported in its Err;
	// the returned error means no request was decided.
	Take(ctx context.Context, reqs []*TakeRequest) error

	// Time returns the store's clock. Limiters in a cluster align their
	// windows to it.
	Time(ctx context.Context) (time.Time, error)
}

// Op is one counter operation of Store.Apply. The counter is named by Key
// or, when Key is empty, by Base, WindowMs and ID as CounterKey(Base,
// WindowMs, ID) would name it: the sync loop passes the parts, so that a
// store that writes the name straight onto the wire builds no string.
type Op struct {
	Key      string // the counter's key; empty: named by the next three fields
	Base     string // the user key's prefix, from KeyBase
	WindowMs int64  // the window size, milliseconds
	ID       int64  // the window id
	Delta    int64  // added to the counter; 0 reads it only
	ExpireAt int64  // Unix milliseconds; 0 leaves the expiry alone
	Total    int64  // out: the counter's value after the operation
}

// Name returns the counter's key.
func (op *Op) Name() string {
	if op.Key != "" {
		return op.Key
	}
	return CounterKey(op.Base, op.WindowMs, op.ID)
}

// appendName appends the counter's key to b.
func (op *Op) appendName(b []byte) []byte {
	if op.Key != "" {
		return append(b, op.Key...)
	}
	b = append(b, op.Base...)
	b = strconv.AppendInt(b, op.WindowMs, 10)
	b = append(b, ':')
	return strconv.AppendInt(b, op.ID, 10)
}

// TakeRule is one rule of a TakeRequest.
type TakeRule struct {
	Limit    int64 // cost admitted per window
	WindowMs int64 // window size, milliseconds
	Fixed    bool  // fixed window: the previous window does not count
}

// TakeRequest is one decision made in the store (the synchronous mode). The
// request is admitted when, for every rule i, with W its window and
// e = NowUs mod W (in microseconds),
//
//	prev_i·(W−e)/W + cur_i + Cost ≤ Limit_i     (sliding)
//	cur_i + Cost ≤ Limit_i                      (fixed)
//
// where cur_i and prev_i are the counters Keys[2i] (the window holding NowUs) and
// Keys[2i+1] (the window before). If it is admitted and Peek is false, or if
// CountDenied is set and Peek is false, Cost is added to every cur_i
// counter, and a counter created by that sets its expiry to ExpireAt[i].
type TakeRequest struct {
	Keys        []string   // per rule: the current window's counter, then the previous one's
	Rules       []TakeRule // the rules, in order
	ExpireAt    []int64    // per rule: expiry of a current counter this request creates, Unix ms
	NowUs       int64      // the decision's instant, Unix microseconds
	Cost        int64      // added to every rule's current counter when admitted
	Peek        bool       // decide only: change nothing
	CountDenied bool       // add Cost even when denied (the penalty)

	// Results.
	Allowed bool    // whether every rule admitted the request
	Counts  []int64 // per rule: cur after the operation, then prev (2 per rule); allocated by the caller
	Err     error   // what went wrong with this request alone
}

// Epsilon absorbs floating-point error in the sliding-window comparison.
const Epsilon = 1e-9

// Admits reports whether a request of cost admits under a rule with the
// given counters, by the formula of TakeRequest. It is the one definition the
// stores share with the limiter.
func Admits(limit, windowMs, nowUs int64, fixed bool, cur, prev, cost int64) bool {
	est := float64(cur)
	if !fixed && prev > 0 {
		w := windowMs * 1000
		e := nowUs % w
		est += float64(prev) * float64(w-e) / float64(w)
	}
	return est+float64(cost) <= float64(limit)+Epsilon
}

// ErrUnavailable is a sentinel for Store implementations and wrappers (the
// simulation's outage, for one) to wrap when the store cannot be reached.
// The stores of this package return the underlying network error instead.
var ErrUnavailable = errors.New("store unavailable")

// KeyBase returns the part of a counter key shared by every counter of
// userKey: "<prefix>:{<base64url(userKey)>}:".
func KeyBase(prefix, userKey string) string {
	b := make([]byte, 0, len(prefix)+4+base64.RawURLEncoding.EncodedLen(len(userKey)))
	b = append(b, prefix...)
	b = append(b, ":{"...)
	b = base64.RawURLEncoding.AppendEncode(b, []byte(userKey))
	b = append(b, "}:"...)
	return string(b)
}

// CounterKey returns the key of one window's counter: base (from KeyBase),
// the window size in milliseconds and the window id.
func CounterKey(base string, windowMs, id int64) string {
	buf := make([]byte, 0, len(base)+24)
	buf = append(buf, base...)
	buf = strconv.AppendInt(buf, windowMs, 10)
	buf = append(buf, ':')
	buf = strconv.AppendInt(buf, id, 10)
	return string(buf)
}

// ExpireAt returns when the counter of window id (size windowMs) can go:
// after the end of the next window, when it stops being anyone's previous
// window, plus a minute of margin for clock differences.
func ExpireAt(windowMs, id int64) int64 {
	return (id+2)*windowMs + 60_000
}
