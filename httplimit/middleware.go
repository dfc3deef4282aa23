// Package httplimit is net/http middleware for a hybridlimit.Limiter. It
// keys each request (client IP, API key header, route, or a combination),
// decides it with the limiter, answers denied requests with 429 Too Many
// Requests, a Retry-After header and an RFC 9457 problem+json body, and
// sets the rate-limit headers on every response: the IETF draft fields
// RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers,
// structured-field syntax, one policy per rule) and the widely used
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (describing the
// tightest rule). A token or leaky bucket rule is advertised by its burst,
// over the time the burst takes to refill at the rate. A request admitted
// by a LeakyBucket rule reaches the handler at its turn in the queue
// (Result.Delay, waited on the limiter's clock).
//
// The middleware adds no I/O of its own: with a limiter in ModeLocal or
// ModeAsync a request costs a key lookup and a few atomic operations, and
// the limiter's FailurePolicy decides while its store fails; a store error
// never becomes a 500.
//
//	key, err := httplimit.ClientIP(httplimit.IPOptions{})
//	if err != nil { ... }
//	mw, err := httplimit.New(limiter, key, httplimit.Options{})
//	if err != nil { ... }
//	log.Fatal(http.ListenAndServe(":8080", mw.Wrap(mux)))
package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/wait"
)

// Options configures a Middleware. The zero value denies with 429, a
// problem+json body and every header, and counts each request as 1.
type Options struct {
	// Cost returns the cost of a request, 1 to the smallest of the rules'
	// Limits (a bucket rule's Burst instead of its Limit); nil counts every
	// request as 1. A cost outside that range is an error for
	// ErrorHandler.
	Cost func(r *http.Request) int64

	// DeniedStatus is the status of a denied request: 400 to 599, default
	// http.StatusTooManyRequests.
	DeniedStatus int

	// Tag, if set, returns who made a request (a user id behind an IP key,
	// say), for Limiter.Contributors: the tags of requests at or near the
	// limit are counted (see Limiter.AllowTagged). It must be safe for
	// concurrent use.
	Tag func(r *http.Request) string

	// BlockedStatus is the status of a blocked key's requests
	// (Limiter.Block, Config.Ban): 400 to 599, default DeniedStatus. Use
	// 403 Forbidden to tell clients it is not a rate limit. The body says
	// the client is blocked, without the block's reason.
	BlockedStatus int

	// DeniedHandler, if set, writes the response to a denied request
	// instead of the default problem+json body. The rate-limit headers and
	// Retry-After are already set when it runs, and ResultFrom(r) returns
	// the decision; it must write the status itself (see DeniedStatus).
	DeniedHandler http.Handler

	// ErrorHandler, if set, answers a request whose key could not be
	// computed or that the limiter refused (an empty or oversized key, a
	// cost out of range, a closed limiter). By default a key error gets
	// 400 Bad Request, a closed limiter or a done request context 503
	// Service Unavailable, each with a problem+json body. Store failures
	// never reach it: the limiter's FailurePolicy decides them.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

	// Shadow decides and reports every request (headers, OnDenied) but
	// never blocks one: operators roll out new limits this way. Denied
	// requests cost nothing (unless the limiter counts denied requests),
	// so the headers show what enforcing would do.
	Shadow bool

	// OnDenied, if set, is called for every denied request, also in shadow
	// mode, before the response is written. Use it to log or count
	// denials. It must be safe for concurrent use and must not block.
	OnDenied func(r *http.Request, key string, res hybridlimit.Result)

	// RetryJitter, if positive, adds a uniformly random delay between zero
	// and RetryJitter to Retry-After, so that clients denied together do
	// not all come back at the same second. At most MaxRetryJitter.
	RetryJitter time.Duration

	// HideDraftHeaders omits RateLimit-Policy and RateLimit;
	// HideLegacyHeaders omits RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset. Retry-After is always sent on a denial.
	HideDraftHeaders  bool
	HideLegacyHeaders bool

	// PolicyNames names the policies of the draft headers, one per rule in
	// the limiter's order; nil names each after its window (see
	// PolicyName). Names must be unique, non-empty printable ASCII.
	PolicyNames []string
}

// MaxRetryJitter is the largest Options.RetryJitter.
const MaxRetryJitter = time.Hour

// Middleware rate-limits HTTP requests with a hybridlimit.Limiter. Create
// one with New; the zero value is not usable. A Middleware is safe for
// concurrent use, and one Middleware can wrap any number of handlers
// (which then share the limiter's quotas).
type Middleware struct {
	l       *hybridlimit.Limiter
	key     KeyFunc
	opts    Options
	status  int
	blocked int              // the status of a blocked key's requests
	tiers   map[string]*tier // per tier of the limiter ("" for its Rules)
	def     *tier
}

// tier is what the headers of one tier's keys need.
type tier struct {
	policy *Policy
	multi  bool    // several rules: the RateLimit field needs TierState
	quota  []int64 // per rule: RateLimit-Limit (see Quota)
}

// tierOf returns the headers of res's tier.
func (m *Middleware) tierOf(res *hybridlimit.Result) *tier {
	if res.Tier == "" {
		return m.def
	}
	if t := m.tiers[res.Tier]; t != nil {
		return t
	}
	return m.def
}

// New returns a middleware deciding requests with l, keyed by key.
func New(l *hybridlimit.Limiter, key KeyFunc, opts Options) (*Middleware, error) {
	if l == nil {
		return nil, errors.New("httplimit: New: limiter is nil")
	}
	if key == nil {
		return nil, errors.New("httplimit: New: key function is nil")
	}
	m := &Middleware{l: l, key: key, opts: opts, status: opts.DeniedStatus}
	if m.status == 0 {
		m.status = http.StatusTooManyRequests
	}
	if m.status < 400 || m.status > 599 {
		return nil, fmt.Errorf("httplimit: Options.DeniedStatus is %d, want 400 to 599", opts.DeniedStatus)
	}
	if opts.RetryJitter < 0 || opts.RetryJitter > MaxRetryJitter {
		return nil, fmt.Errorf("httplimit: Options.RetryJitter is %v, want 0 to %v", opts.RetryJitter, MaxRetryJitter)
	}
	m.blocked = opts.BlockedStatus
	if m.blocked == 0 {
		m.blocked = m.status
	}
	if m.blocked < 400 || m.blocked > 599 {
		return nil, fmt.Errorf("httplimit: Options.BlockedStatus is %d, want 400 to 599", opts.BlockedStatus)
	}
	m.tiers = map[string]*tier{}
	for _, name := range l.Tiers() {
		rules, _ := l.TierRules(name)
		var names []string
		if name == "" {
			names = opts.PolicyNames
		}
		p, err := newPolicy(rules, names, "Options.PolicyNames")
		if err != nil {
			return nil, err
		}
		t := &tier{policy: p, multi: len(rules) > 1}
		for _, r := range rules {
			q, _ := Quota(r)
			t.quota = append(t.quota, q)
		}
		m.tiers[name] = t
	}
	m.def = m.tiers[""]
	m.opts.PolicyNames = m.def.policy.names
	return m, nil
}

// Wrap returns next behind the rate limit. Its method value m.Wrap is a
// func(http.Handler) http.Handler, the usual middleware shape.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// PolicyNames returns the policy name of every rule, in the limiter's
// order, as the draft headers report them.
func (m *Middleware) PolicyNames() []string { return m.def.policy.Names() }

// KeyError is the error passed to Options.ErrorHandler when the key
// function fails.
type KeyError struct{ Err error }

// Error returns the key function's error text.
func (e *KeyError) Error() string { return "httplimit: rate-limit key: " + e.Err.Error() }

// Unwrap returns the key function's error.
func (e *KeyError) Unwrap() error { return e.Err }

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := m.key(r)
	if err != nil {
		m.fail(w, r, &KeyError{Err: err})
		return
	}
	n := int64(1)
	if m.opts.Cost != nil {
		n = m.opts.Cost(r)
	}
	var res hybridlimit.Result
	if m.opts.Tag != nil {
		res, err = m.l.AllowTagged(r.Context(), key, m.opts.Tag(r), n)
	} else {
		res, err = m.l.AllowN(r.Context(), key, n)
	}
	if err != nil {
		m.fail(w, r, err)
		return
	}
	var retry int64
	if !res.Allowed {
		retry = max(seconds(res.RetryAfter), 1)
	}
	m.setHeaders(w.Header(), r.Context(), key, &res, retry, !res.Allowed && !m.opts.Shadow)
	if !res.Allowed {
		if m.opts.OnDenied != nil {
			m.opts.OnDenied(r, key, res)
		}
		if !m.opts.Shadow {
			m.deny(w, r, key, &res, n, retry)
			return
		}
	} else if res.Delay > 0 && !m.opts.Shadow {
		// A LeakyBucket rule's queue: the request proceeds at its turn.
		// A client that goes away meanwhile gets the ErrorHandler (its
		// admission stays counted, as the queue's place was taken).
		t := m.l.Clock().Timer(res.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			m.fail(w, r, r.Context().Err())
			return
		}
	}
	next.ServeHTTP(w, r)
}

// failedClosed reports whether res is a denial by the limiter's
// FailurePolicy (FailClosed while the store fails, or a full key table),
// not by a rule. (Under FailOpen a Degraded denial is a rule's, on this
// node's counts.)
func (m *Middleware) failedClosed(res *hybridlimit.Result) bool {
	return !res.Allowed && res.Degraded && m.l.FailurePolicy() == hybridlimit.FailClosed
}

// stopped reports whether res denies the key whatever its rules hold: it
// is blocked, or the FailurePolicy denied it.
func (m *Middleware) stopped(res *hybridlimit.Result) bool {
	return !res.Allowed && res.Blocked || m.failedClosed(res)
}

// setHeaders sets the rate-limit headers, and Retry-After when sendRetry.
// All the values share one string and one []string, whatever the number of
// rules: two allocations.
func (m *Middleware) setHeaders(h http.Header, ctx context.Context, key string, res *hybridlimit.Result, retry int64, sendRetry bool) {
	draft, legacy := !m.opts.HideDraftHeaders, !m.opts.HideLegacyHeaders
	if !draft && !legacy && !sendRetry {
		return
	}
	var retryAfter int64
	if sendRetry {
		retryAfter = retry
		if m.opts.RetryJitter > 0 {
			retryAfter = max(seconds(wait.Jittered(res.RetryAfter, m.opts.RetryJitter)), 1)
		}
	}
	// t, the draft's effective window, is the time until the rule resets;
	// on a denial it is capped at the retry delay (see
	// Policy.AppendRateLimit).
	reset := seconds(res.ResetAfter)
	stopped := m.stopped(res)
	if stopped {
		reset = retry
	}
	if retry > 0 {
		reset = min(reset, retry)
	}
	t := m.tierOf(res)
	var buf [256]byte
	var ends [5]int
	b := buf[:0]
	k := 0
	if draft {
		var st [hybridlimit.MaxRules]hybridlimit.RuleState
		states := st[:0]
		if t.multi {
			var err error
			// The decision's rules, wherever the key is now; the
			// decision's own rule if the limiter was closed since.
			states, err = m.l.TierState(ctx, key, res.Tier, states)
			if err != nil {
				states = append(states[:0], hybridlimit.RuleState{Rule: res.Rule, Remaining: res.Remaining, ResetAfter: res.ResetAfter})
			}
		} else {
			states = append(states, hybridlimit.RuleState{Rule: 0, Remaining: res.Remaining, ResetAfter: res.ResetAfter})
		}
		if stopped {
			// Nothing is admitted before the retry, whatever the rules
			// hold.
			for i := range states {
				states[i].Remaining, states[i].ResetAfter = 0, res.RetryAfter
			}
		}
		b = t.policy.AppendRateLimit(b, states, retry)
		ends[k] = len(b)
		k++
	}
	if legacy {
		b = strconv.AppendInt(b, t.quota[res.Rule], 10)
		ends[k] = len(b)
		b = strconv.AppendInt(b, res.Remaining, 10)
		ends[k+1] = len(b)
		b = strconv.AppendInt(b, reset, 10)
		ends[k+2] = len(b)
		k += 3
	}
	if sendRetry {
		b = strconv.AppendInt(b, retryAfter, 10)
		ends[k] = len(b)
		k++
	}
	s := string(b)
	nv := k
	if draft {
		nv++
	}
	vals := make([]string, nv)
	from, v, e := 0, 0, 0
	next := func(name string) {
		vals[v] = s[from:ends[e]]
		h[name] = vals[v : v+1 : v+1]
		from = ends[e]
		v++
		e++
	}
	if draft {
		vals[v] = t.policy.field
		h[headerPolicy] = vals[v : v+1 : v+1]
		v++
		next(headerRateLimit)
	}
	if legacy {
		next(headerLimit)
		next(headerRemaining)
		next(headerReset)
	}
	if sendRetry {
		next(headerRetryAfter)
	}
}
