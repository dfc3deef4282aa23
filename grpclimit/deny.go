package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
	"github.com/hybridlimit/hybridlimit/internal/wait"
)

// The metadata keys, lower-case as gRPC requires.
const (
	mdPolicy     = "ratelimit-policy"
	mdRateLimit  = "ratelimit"
	mdLimit      = "ratelimit-limit"
	mdRemaining  = "ratelimit-remaining"
	mdReset      = "ratelimit-reset"
	mdRetryAfter = "retry-after"
)

// denial holds the delays reported for a denied decision.
type denial struct {
	delay      time.Duration // RetryInfo: the wait rounded up to the millisecond, at least 1ms
	retryAfter int64         // retry-after: the wait in seconds, rounded up, at least 1
	maxT       int64         // the cap of every t: RetryAfter in seconds, without jitter
}

// denial returns the delays of a denied res.
func (i *Interceptor) denial(res *hybridlimit.Result) denial {
	w := wait.Jittered(res.RetryAfter, i.opts.RetryJitter)
	delay := w.Truncate(time.Millisecond)
	if delay < w && delay <= math.MaxInt64-time.Millisecond {
		delay += time.Millisecond
	}
	return denial{
		delay:      max(delay, time.Millisecond),
		retryAfter: max(seconds(w), 1),
		maxT:       max(seconds(res.RetryAfter), 1),
	}
}

// seconds rounds d up to whole seconds, never below zero, as httplimit
// does for Retry-After and RateLimit-Reset.
func seconds(d time.Duration) int64 { return wait.Seconds(d) }

// states appends the state of every rule of res's tier for key to dst:
// from the limiter with several rules (the decision's tier, wherever the
// key is now), from res with one, and from res too when the limiter can no
// longer say (it was closed since the decision): never none. A key that is
// blocked or that the FailurePolicy denied admits nothing until the retry,
// whatever its rules hold.
func (i *Interceptor) states(ctx context.Context, key string, res *hybridlimit.Result, dst []hybridlimit.RuleState) []hybridlimit.RuleState {
	own := hybridlimit.RuleState{Rule: res.Rule, Limit: res.Limit, Window: res.Window, Remaining: res.Remaining, ResetAfter: res.ResetAfter}
	if i.stopped(res) {
		own.Remaining, own.ResetAfter = 0, res.RetryAfter
	}
	if !i.tierOf(res).multi {
		own.Rule = 0
		return append(dst, own)
	}
	states, err := i.l.TierState(ctx, key, res.Tier, dst)
	if err != nil {
		states = append(dst, own)
	}
	if i.stopped(res) {
		// Nothing is admitted before the retry, whatever the rules hold.
		for j := len(dst); j < len(states); j++ {
			states[j].Remaining, states[j].ResetAfter = 0, res.RetryAfter
		}
	}
	return states
}

// failedClosed reports whether res is a denial by the limiter's
// FailurePolicy (FailClosed while the store fails, or a full key table),
// not by a rule. (Under FailOpen a Degraded denial is a rule's, on this
// node's counts.)
func (i *Interceptor) failedClosed(res *hybridlimit.Result) bool {
	return !res.Allowed && res.Degraded && i.l.FailurePolicy() == hybridlimit.FailClosed
}

// stopped reports whether res denies the key whatever its rules hold: it
// is blocked, or the FailurePolicy denied it.
func (i *Interceptor) stopped(res *hybridlimit.Result) bool {
	return !res.Allowed && res.Blocked || i.failedClosed(res)
}

// metadata returns the rate-limit metadata of a decision, with retry-after
// when sendRetry; nil when every field is hidden. The values share one
// string and one []string.
func (i *Interceptor) metadata(ctx context.Context, key string, res *hybridlimit.Result, d *denial, sendRetry bool) metadata.MD {
	draft, legacy := !i.opts.HideDraftMetadata, !i.opts.HideLegacyMetadata
	if !draft && !legacy && !sendRetry {
		return nil
	}
	t := i.tierOf(res)
	var buf [256]byte
	var ends [5]int
	var keys [5]string
	b := buf[:0]
	k := 0
	add := func(name string) {
		keys[k], ends[k] = name, len(b)
		k++
	}
	if draft {
		var st [hybridlimit.MaxRules]hybridlimit.RuleState
		if b = t.policy.AppendRateLimit(b, i.states(ctx, key, res, st[:0]), d.maxT); len(b) > 0 {
			add(mdRateLimit) // an empty value is no field
		}
	}
	if legacy {
		reset := seconds(res.ResetAfter)
		if i.stopped(res) {
			reset = d.maxT
		}
		if d.maxT > 0 {
			reset = min(reset, d.maxT)
		}
		q := res.Limit
		if res.Rule >= 0 && res.Rule < len(t.rules) {
			q, _ = httplimit.Quota(t.rules[res.Rule])
		}
		b = strconv.AppendInt(b, q, 10)
		add(mdLimit)
		b = strconv.AppendInt(b, max(res.Remaining, 0), 10)
		add(mdRemaining)
		b = strconv.AppendInt(b, reset, 10)
		add(mdReset)
	}
	if sendRetry {
		b = strconv.AppendInt(b, d.retryAfter, 10)
		add(mdRetryAfter)
	}
	s := string(b)
	vals := make([]string, k+1)
	md := make(metadata.MD, k+1)
	from := 0
	for j := range k {
		vals[j] = s[from:ends[j]]
		md[keys[j]] = vals[j : j+1 : j+1]
		from = ends[j]
	}
	if draft {
		vals[k] = t.policy.Field()
		md[mdPolicy] = vals[k : k+1 : k+1]
	}
	return md
}

// status returns the status error of a denied request of cost n for key.
func (i *Interceptor) status(ctx context.Context, key string, n int64, res *hybridlimit.Result, d *denial) error {
	var msg string
	code := codes.ResourceExhausted
	switch {
	case res.Blocked:
		code = i.opts.BlockedCode
		msg = fmt.Sprintf("grpclimit: this client is blocked; retry after %v", d.delay)
	case i.failedClosed(res):
		msg = fmt.Sprintf("grpclimit: rate limiter degraded (store failing or key table full) and failing closed; retry after %v", d.delay)
	default:
		msg = fmt.Sprintf("grpclimit: rate limit exceeded: %d per %s (policy %q); retry after %v",
			res.Limit, httplimit.PolicyName(res.Window), i.tierOf(res).name(res.Rule), d.delay)
	}
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{&errdetails.RetryInfo{RetryDelay: durationpb.New(d.delay)}}
	if i.opts.QuotaFailure && !i.failedClosed(res) && !res.Blocked {
		details = append(details, i.quotaFailure(ctx, key, n, res))
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// name returns the policy name of rule r.
func (t *tier) name(r int) string {
	if r < 0 || r >= len(t.names) {
		return "?"
	}
	return t.names[r]
}

// quotaFailure describes every rule that cannot admit a request of cost n
// for key now, as httplimit's violated-policies.
func (i *Interceptor) quotaFailure(ctx context.Context, key string, n int64, res *hybridlimit.Result) *errdetails.QuotaFailure {
	t := i.tierOf(res)
	rules := t.rules
	var st [hybridlimit.MaxRules]hybridlimit.RuleState
	qf := &errdetails.QuotaFailure{}
	for _, s := range i.states(ctx, key, res, st[:0]) {
		if s.Rule < 0 || s.Rule >= len(rules) || (s.Remaining >= n && s.Rule != res.Rule) {
			continue
		}
		r := rules[s.Rule]
		q, _ := httplimit.Quota(r)
		qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{
			Subject:     t.names[s.Rule],
			QuotaId:     t.names[s.Rule],
			QuotaValue:  q,
			Description: describe(r),
		})
	}
	return qf
}

// DefaultErrorHandler is the ErrorHandler used when Options.ErrorHandler is
// nil. It fails the call with codes.Unavailable for a closed limiter,
// codes.Canceled or codes.DeadlineExceeded for a done call context,
// codes.Internal when Config.TierOf named a tier the limiter does not have
// (hybridlimit.ErrUnknownTier: the server's configuration is at fault),
// and codes.InvalidArgument otherwise (a key error, an empty or oversized
// key, a cost out of range), with err's text as the message.
func DefaultErrorHandler(ctx context.Context, method string, err error) error {
	code := codes.InvalidArgument
	switch {
	case errors.Is(err, hybridlimit.ErrClosed):
		code = codes.Unavailable
	case errors.Is(err, hybridlimit.ErrUnknownTier):
		code = codes.Internal
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return status.Error(code, err.Error())
}

// describe words a rule for a QuotaFailure: "2 per 1m (sliding window)",
// "10 per 1s (token-bucket, burst 20)".
func describe(r hybridlimit.Rule) string {
	switch r.Type {
	case hybridlimit.TokenBucket, hybridlimit.LeakyBucket:
		q, _ := httplimit.Quota(r)
		return fmt.Sprintf("%d per %s (%s, burst %d)", r.Limit, httplimit.PolicyName(r.Window), r.Type, q)
	case hybridlimit.Bucketed:
		return fmt.Sprintf("%d per %s (window of %d buckets)", r.Limit, httplimit.PolicyName(r.Window), r.Buckets)
	}
	return fmt.Sprintf("%d per %s (%s window)", r.Limit, httplimit.PolicyName(r.Window), r.Type)
}
