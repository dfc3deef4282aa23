package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// TestNewErrors checks that New rejects every invalid argument with an
// error naming the field and what it accepts.
func TestNewErrors(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute}, hybridlimit.Rule{Limit: 100, Window: time.Hour})
	key := peerIP(t)
	for _, c := range []struct {
		l    *hybridlimit.Limiter
		key  grpclimit.KeyFunc
		opts grpclimit.Options
		want string
	}{
		{nil, key, grpclimit.Options{}, "grpclimit: New: limiter is nil"},
		{l, nil, grpclimit.Options{}, "grpclimit: New: key function is nil"},
		{l, key, grpclimit.Options{RetryJitter: -1}, "grpclimit: Options.RetryJitter is -1ns, want 0 to 1h0m0s"},
		{l, key, grpclimit.Options{RetryJitter: 2 * time.Hour}, "grpclimit: Options.RetryJitter is 2h0m0s, want 0 to 1h0m0s"},
		{l, key, grpclimit.Options{BlockedCode: 17}, "grpclimit: Options.BlockedCode is 17, want a gRPC status code: 1 (Canceled) to 16 (Unauthenticated), or 0 for the default"},
		{l, key, grpclimit.Options{BlockedCode: math.MaxUint32}, "grpclimit: Options.BlockedCode is 4294967295, want a gRPC status code: 1 (Canceled) to 16 (Unauthenticated), or 0 for the default"},
		{l, key, grpclimit.Options{PolicyNames: []string{"a"}}, "grpclimit: Options.PolicyNames has 1 names, want one per rule: 2"},
		{l, key, grpclimit.Options{PolicyNames: []string{"a", ""}}, "grpclimit: Options.PolicyNames[1] is empty"},
		{l, key, grpclimit.Options{PolicyNames: []string{"a", "é"}}, `grpclimit: Options.PolicyNames[1] is "é": byte 0xc3 at 0 is not printable ASCII; want printable ASCII`},
		{l, key, grpclimit.Options{PolicyNames: []string{"a", "a"}}, `grpclimit: Options.PolicyNames: policy name "a" of rule 1 repeats rule 0's`},
	} {
		i, err := grpclimit.New(c.l, c.key, c.opts)
		assert.EqualError(t, err, c.want)
		assert.Nil(t, i)
	}
}

// TestLimiterErrors checks the default ErrorHandler over a real server:
// an empty key and a missing key are InvalidArgument, a closed limiter is
// Unavailable; and a custom ErrorHandler that maps key errors to
// Unauthenticated and lets other calls through undecided.
func TestLimiterErrors(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
	empty := func(context.Context, string) (string, error) { return "", nil }
	errs := make(chan error, 1)
	cc, e := serve(t, newInterceptor(t, l, empty, grpclimit.Options{ErrorHandler: func(ctx context.Context, method string, err error) error {
		errs <- err
		return grpclimit.DefaultErrorHandler(ctx, method, err)
	}}))
	r := say(t, cc)
	seen := <-errs
	assert.Equal(t, codes.InvalidArgument, status.Code(r.err))
	assert.Equal(t, "grpclimit: rate-limit key: hybridlimit: empty key", status.Convert(r.err).Message())
	var ke *grpclimit.KeyError
	assert.ErrorAs(t, seen, &ke)
	assert.ErrorIs(t, seen, hybridlimit.ErrEmptyKey)
	assert.Zero(t, e.calls.Load())

	long := func(context.Context, string) (string, error) { return string(make([]byte, 2000)), nil }
	cc, _ = serve(t, newInterceptor(t, l, long, grpclimit.Options{}))
	r = say(t, cc)
	assert.Equal(t, codes.InvalidArgument, status.Code(r.err))
	assert.Equal(t, "hybridlimit: key of 2000 bytes exceeds Config.MaxKeyLen 1024", status.Convert(r.err).Message())

	cc, e = serve(t, newInterceptor(t, l, metadataKey(t, "x-api-key"), grpclimit.Options{
		ErrorHandler: func(ctx context.Context, method string, err error) error {
			if errors.Is(err, grpclimit.ErrNoKey) {
				return status.Error(codes.Unauthenticated, "x-api-key is required")
			}
			return nil // closed limiter: let the call through, undecided
		},
	}))
	r = say(t, cc)
	assert.Equal(t, codes.Unauthenticated, status.Code(r.err))
	require.NoError(t, l.Close(context.Background()))
	r = say(t, cc, "x-api-key", "k")
	require.NoError(t, r.err, "ErrorHandler returned nil")
	assert.Empty(t, fields(r.header), "undecided: no metadata")
	assert.Equal(t, int64(1), e.calls.Load())

	cc, _ = serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{}))
	r = say(t, cc)
	assert.Equal(t, codes.Unavailable, status.Code(r.err))
	assert.Equal(t, "hybridlimit: limiter is closed", status.Convert(r.err).Message())
}

// TestDefaultErrorHandler checks the codes of DefaultErrorHandler.
func TestDefaultErrorHandler(t *testing.T) {
	for _, c := range []struct {
		err  error
		want codes.Code
	}{
		{hybridlimit.ErrClosed, codes.Unavailable},
		{context.Canceled, codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{&grpclimit.KeyError{Err: grpclimit.ErrNoKey}, codes.InvalidArgument},
		{hybridlimit.ErrCost, codes.InvalidArgument},
		// Config.TierOf named no tier: the server's configuration, not
		// the call, is at fault.
		{fmt.Errorf("wrapped: %w", hybridlimit.ErrUnknownTier), codes.Internal},
	} {
		assert.Equal(t, c.want, status.Code(grpclimit.DefaultErrorHandler(context.Background(), "/m", c.err)), "%v", c.err)
	}
}

// downStore is a store that always fails.
type downStore struct{}

var errDown = errors.New("store down")

func (downStore) Group(string) int                                 { return 0 }
func (downStore) Push(context.Context, []*store.Batch) error       { return errDown }
func (downStore) Take(context.Context, []*store.TakeRequest) error { return errDown }
func (downStore) Time(context.Context) (time.Time, error)          { return time.Time{}, errDown }

// TestStoreFailure checks that a failing store never becomes an error:
// in ModeSynchronous, FailOpen admits (Result.Degraded) and FailClosed
// denies with ResourceExhausted, a message saying why, and RetryInfo.
func TestStoreFailure(t *testing.T) {
	for _, policy := range []hybridlimit.FailurePolicy{hybridlimit.FailOpen, hybridlimit.FailClosed} {
		l, err := hybridlimit.New(hybridlimit.Config{
			Rules:         []hybridlimit.Rule{{Limit: 10, Window: time.Minute}},
			Mode:          hybridlimit.ModeSynchronous,
			Store:         downStore{},
			FailurePolicy: policy,
			Manual:        true,
		})
		require.NoError(t, err)
		degraded := make(chan bool, 1)
		key := peerIP(t)
		cc, _ := serve(t, newInterceptor(t, l, key, grpclimit.Options{
			OnDenied: func(_ context.Context, _, _ string, res hybridlimit.Result) { degraded <- res.Degraded },
		}))
		r := say(t, cc)
		if policy == hybridlimit.FailOpen {
			require.NoError(t, r.err)
			assert.Equal(t, "9", fields(r.header)["ratelimit-remaining"])
		} else {
			assert.Equal(t, codes.ResourceExhausted, status.Code(r.err))
			assert.Contains(t, status.Convert(r.err).Message(), "grpclimit: rate limiter degraded (store failing or key table full) and failing closed; retry after")
			assert.NotNil(t, r.retry)
			assert.True(t, <-degraded)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_ = l.Close(ctx) // the store stays down: Close gives up at once
		cancel()
	}
}

// Under FailOpen, a synchronous limiter whose store is down decides on
// this node's counts: a denial there is a rule's (Degraded, but not the
// failure policy's), and the status says which rule, as any denial.
func TestFailOpenLocalDenial(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 1, Window: time.Minute}},
		Mode:   hybridlimit.ModeSynchronous,
		Store:  downStore{},
		Manual: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = l.Close(ctx)
	})
	degraded := make(chan bool, 2)
	cc, _ := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{
		QuotaFailure: true,
		OnDenied:     func(_ context.Context, _, _ string, res hybridlimit.Result) { degraded <- res.Degraded },
	}))
	require.NoError(t, say(t, cc).err)
	r := say(t, cc)
	assert.Equal(t, codes.ResourceExhausted, status.Code(r.err))
	assert.True(t, <-degraded, "decided on this node's counts")
	assert.Contains(t, status.Convert(r.err).Message(), `grpclimit: rate limit exceeded: 1 per 1m (policy "1m")`)
	require.NotNil(t, r.quota)
	assert.Len(t, r.quota.GetViolations(), 1)
}

// FailClosed with the store down and several rules: the call is denied
// by the failure policy, not by a rule, so the metadata says nothing is
// admitted until retry-after (r=0 for every rule, every t and
// ratelimit-reset at the retry), and no QuotaFailure names a rule.
func TestFailClosedMetadata(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:         []hybridlimit.Rule{{Limit: 10, Window: time.Minute}, {Limit: 100, Window: time.Hour}},
		Mode:          hybridlimit.ModeSynchronous,
		Store:         downStore{},
		FailurePolicy: hybridlimit.FailClosed,
		Manual:        true,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = l.Close(ctx)
	})
	cc, _ := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{QuotaFailure: true}))
	r := say(t, cc)
	assert.Equal(t, codes.ResourceExhausted, status.Code(r.err))
	assert.Contains(t, status.Convert(r.err).Message(), "failing closed")
	assert.Nil(t, r.quota)
	f := fields(r.trailer)
	assert.Equal(t, "1", f["retry-after"])
	assert.Equal(t, "0", f["ratelimit-remaining"])
	assert.Equal(t, "1", f["ratelimit-reset"])
	assert.Equal(t, `"1m";r=0;t=1, "1h";r=0;t=1`, f["ratelimit"])
}
