package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// MaxRetryJitter bounds Options.RetryJitter.
const MaxRetryJitter = time.Hour

// Options configures an Interceptor. The zero value enforces the limits,
// sends every metadata field, counts each call as 1 and decides a stream
// once, when it opens.
type Options struct {
	// Cost returns the cost of a call (of a stream, when it opens), 1 to
	// the smallest of the rules' Limits (a bucket rule's Burst instead of
	// its Limit); nil counts every call as 1. A cost outside that range
	// fails the call through ErrorHandler.
	Cost func(ctx context.Context, method string) int64

	// Skip, if set, selects calls that bypass the limit entirely: no key,
	// no decision, no metadata. Use it for health checks and reflection:
	//
	//	Skip: func(_ context.Context, method string) bool {
	//		return strings.HasPrefix(method, "/grpc.health.v1.Health/") ||
	//			strings.HasPrefix(method, "/grpc.reflection.")
	//	},
	Skip func(ctx context.Context, method string) bool

	// MessageCost, if set, also decides every message the server receives
	// on a client-streaming or bidirectional stream, after the stream's
	// own decision when it opens, at the cost it returns (in Cost's range;
	// return 1 to count messages). A denied message makes RecvMsg return
	// the denial's status error; the stream's trailers carry the metadata
	// of its last denied message. Nil decides streams only when they open.
	MessageCost func(ctx context.Context, method string, msg any) int64

	// ErrorHandler, if set, returns the error that fails a call whose key
	// could not be computed (a *KeyError) or that the limiter refused (an
	// empty or oversized key, a cost out of range, a closed limiter). A nil
	// return lets the call through undecided. By default
	// DefaultErrorHandler. Store failures never reach it: the limiter's
	// FailurePolicy decides them.
	ErrorHandler func(ctx context.Context, method string, err error) error

	// Shadow decides and reports every call (metadata, OnDenied) but never
	// fails one: operators roll out new limits this way. Denied calls cost
	// nothing (unless the limiter counts denied requests), so the metadata
	// shows what enforcing would do; it goes out as headers, like an
	// admitted call's, without retry-after.
	Shadow bool

	// OnDenied, if set, is called for every denied call (and message, with
	// MessageCost), also in shadow mode, before the call fails. Use it to
	// log or count denials. It must be safe for concurrent use and must
	// not block.
	OnDenied func(ctx context.Context, method, key string, res hybridlimit.Result)

	// QuotaFailure adds a google.rpc.QuotaFailure detail to the status of
	// a denied call, with one violation per rule the call exceeds: its
	// policy name as Subject and QuotaId, its limit as QuotaValue and a
	// description such as "10 per 1m (sliding window)". The rate-limit key
	// is not included: it may be a credential.
	QuotaFailure bool

	// Tag, if set, returns who made a call (a user id behind a peer
	// address key, say), for Limiter.Contributors: the tags of calls at or
	// near the limit are counted (see Limiter.AllowTagged). It must be
	// safe for concurrent use.
	Tag func(ctx context.Context) string

	// BlockedCode is the status code of a blocked key's calls
	// (Limiter.Block, Config.Ban), with a RetryInfo detail of the time
	// left; default codes.ResourceExhausted (for codes.OK), else one of
	// codes.Canceled to codes.Unauthenticated. Use codes.PermissionDenied
	// to tell clients it is not a rate limit. The block's reason is not
	// sent.
	BlockedCode codes.Code

	// RetryJitter, if positive, adds a uniformly random delay between zero
	// and RetryJitter to the RetryInfo delay and to retry-after, so that
	// clients denied together do not all come back at the same instant: 0
	// to MaxRetryJitter.
	RetryJitter time.Duration

	// HideDraftMetadata omits ratelimit-policy and ratelimit;
	// HideLegacyMetadata omits ratelimit-limit, ratelimit-remaining and
	// ratelimit-reset. retry-after is always sent on a denial.
	HideDraftMetadata  bool
	HideLegacyMetadata bool

	// PolicyNames names the policies of the draft fields and of
	// QuotaFailure, one per rule in the limiter's order; nil names each
	// after its window (see httplimit.PolicyName). Names must be unique,
	// non-empty printable ASCII.
	PolicyNames []string
}

// Interceptor rate-limits the calls of a gRPC server with a
// hybridlimit.Limiter. Create one with New; the zero value is not usable.
// Its methods Unary and Stream are the server interceptors. An Interceptor
// is safe for concurrent use, and serves any number of servers (which then
// share the limiter's quotas).
type Interceptor struct {
	l     *hybridlimit.Limiter
	key   KeyFunc
	opts  Options
	tiers map[string]*tier // per tier of the limiter ("" for its Rules)
	def   *tier
}

// tier is what the metadata of one tier's keys need.
type tier struct {
	policy *httplimit.Policy
	names  []string
	rules  []hybridlimit.Rule
	multi  bool // several rules: the ratelimit field and QuotaFailure need State
}

// tierOf returns the tier of res.
func (i *Interceptor) tierOf(res *hybridlimit.Result) *tier {
	if t := i.tiers[res.Tier]; t != nil {
		return t
	}
	return i.def
}

// New returns an Interceptor deciding calls with l, keyed by key. It
// validates opts once; an error names the offending field.
func New(l *hybridlimit.Limiter, key KeyFunc, opts Options) (*Interceptor, error) {
	if l == nil {
		return nil, errors.New("grpclimit: New: limiter is nil")
	}
	if key == nil {
		return nil, errors.New("grpclimit: New: key function is nil")
	}
	if opts.RetryJitter < 0 || opts.RetryJitter > MaxRetryJitter {
		return nil, fmt.Errorf("grpclimit: Options.RetryJitter is %v, want 0 to %v", opts.RetryJitter, MaxRetryJitter)
	}
	if opts.BlockedCode == codes.OK {
		opts.BlockedCode = codes.ResourceExhausted
	}
	if opts.BlockedCode > codes.Unauthenticated {
		return nil, fmt.Errorf("grpclimit: Options.BlockedCode is %d, want a gRPC status code: 1 (Canceled) to 16 (Unauthenticated), or 0 for the default", uint32(opts.BlockedCode))
	}
	i := &Interceptor{l: l, key: key, opts: opts, tiers: map[string]*tier{}}
	for _, name := range l.Tiers() {
		rules, _ := l.TierRules(name)
		var names []string
		if name == "" {
			names = opts.PolicyNames
			if names != nil && len(names) != len(rules) {
				return nil, fmt.Errorf("grpclimit: Options.PolicyNames has %d names, want one per rule: %d", len(names), len(rules))
			}
		}
		p, err := httplimit.NewPolicy(rules, names)
		if err != nil {
			// httplimit's message names its argument: name ours instead.
			const theirs = "httplimit: NewPolicy: names"
			if msg := err.Error(); strings.HasPrefix(msg, theirs) {
				return nil, errors.New("grpclimit: Options.PolicyNames" + msg[len(theirs):])
			}
			return nil, fmt.Errorf("grpclimit: Options.PolicyNames: %w", err)
		}
		i.tiers[name] = &tier{policy: p, names: p.Names(), rules: rules, multi: len(rules) > 1}
	}
	i.def = i.tiers[""]
	return i, nil
}

// Unary is a grpc.UnaryServerInterceptor: it decides the call before
// running handler. Install it with grpc.ChainUnaryInterceptor(i.Unary).
func (i *Interceptor) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if i.opts.Skip != nil && i.opts.Skip(ctx, info.FullMethod) {
		return handler(ctx, req)
	}
	if _, err := i.open(ctx, info.FullMethod, nil); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

// Stream is a grpc.StreamServerInterceptor: it decides the stream when it
// opens, before running handler, and with Options.MessageCost every message
// received on a client stream. Install it with
// grpc.ChainStreamInterceptor(i.Stream).
func (i *Interceptor) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx := ss.Context()
	if i.opts.Skip != nil && i.opts.Skip(ctx, info.FullMethod) {
		return handler(srv, ss)
	}
	key, err := i.open(ctx, info.FullMethod, ss)
	if err != nil {
		return err
	}
	if i.opts.MessageCost == nil || !info.IsClientStream || key == "" {
		return handler(srv, ss)
	}
	ls := &limitedStream{ServerStream: ss, i: i, method: info.FullMethod, key: key}
	err = handler(srv, ls)
	if ls.denied != nil {
		// The metadata of the last denied message, once, however many
		// denials the handler read past.
		ss.SetTrailer(ls.denied)
	}
	return err
}

// limitedStream decides every message it receives (Options.MessageCost).
type limitedStream struct {
	grpc.ServerStream
	i      *Interceptor
	method string
	key    string
	denied metadata.MD // the trailers of the last denied message
}

// RecvMsg receives a message, then decides it: a denied message is
// consumed and reported as the denial's status error.
func (s *limitedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	ctx := s.ServerStream.Context()
	return s.i.decide(ctx, s.method, s.key, s.i.opts.MessageCost(ctx, s.method, m), (*denialSink)(s), false)
}

// denialSink is a limitedStream whose SetTrailer keeps the metadata of a
// denied message in place of the last one, for Stream to send when the
// handler returns (grpc-go's SetTrailer would append to it).
type denialSink limitedStream

// SetTrailer replaces the kept metadata with md.
func (s *denialSink) SetTrailer(md metadata.MD) { s.denied = md }

// open keys and decides a call as it opens, ss being nil for a unary call.
// It returns the key (empty when ErrorHandler let an unkeyed call through)
// and nil to run the handler, or the error to fail the call with.
func (i *Interceptor) open(ctx context.Context, method string, ss grpc.ServerStream) (string, error) {
	key, err := i.key(ctx, method)
	if err == nil && key == "" {
		err = hybridlimit.ErrEmptyKey // never one quota shared by every unkeyed call
	}
	if err != nil {
		return "", i.fail(ctx, method, &KeyError{Err: err})
	}
	n := int64(1)
	if i.opts.Cost != nil {
		n = i.opts.Cost(ctx, method)
	}
	return key, i.decide(ctx, method, key, n, ss, true)
}

// decide decides a request of cost n for key: a call as it opens (open),
// or a message of a stream. An opening call that goes on gets the metadata
// as headers; a denied call or message gets it as trailers. It returns nil
// to go on, or the error to fail the call with.
func (i *Interceptor) decide(ctx context.Context, method, key string, n int64, ss grpc.ServerStream, open bool) error {
	var res hybridlimit.Result
	var err error
	if i.opts.Tag != nil {
		res, err = i.l.AllowTagged(ctx, key, i.opts.Tag(ctx), n)
	} else {
		res, err = i.l.AllowN(ctx, key, n)
	}
	if err != nil {
		return i.fail(ctx, method, err)
	}
	enforce := !res.Allowed && !i.opts.Shadow
	var d denial
	if !res.Allowed {
		d = i.denial(&res)
	}
	switch {
	case enforce:
		md := i.metadata(ctx, key, &res, &d, true)
		if ss != nil {
			ss.SetTrailer(md)
		} else {
			_ = grpc.SetTrailer(ctx, md) // fails only outside a gRPC server
		}
	case open:
		md := i.metadata(ctx, key, &res, &d, false)
		if ss != nil {
			_ = ss.SetHeader(md)
		} else {
			_ = grpc.SetHeader(ctx, md)
		}
	}
	if res.Allowed {
		if res.Delay > 0 && !i.opts.Shadow {
			// A LeakyBucket rule's queue: the call goes on at its turn.
			t := i.l.Clock().Timer(res.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return i.fail(ctx, method, ctx.Err())
			}
		}
		return nil
	}
	if i.opts.OnDenied != nil {
		i.opts.OnDenied(ctx, method, key, res)
	}
	if !enforce {
		return nil
	}
	return i.status(ctx, key, n, &res, &d)
}

// fail returns the error of ErrorHandler for err.
func (i *Interceptor) fail(ctx context.Context, method string, err error) error {
	if i.opts.ErrorHandler != nil {
		return i.opts.ErrorHandler(ctx, method, err)
	}
	return DefaultErrorHandler(ctx, method, err)
}
