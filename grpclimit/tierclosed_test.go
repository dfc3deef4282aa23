package grpclimit_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

// A closed limiter with several rules fails every call with Unavailable
// (DefaultErrorHandler's mapping of hybridlimit.ErrClosed) before its
// handler, and sends no rate-limit metadata at all: no header or trailer
// key, hence no empty value.
func TestClosedLimiterSeveralRules(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{
		{Limit: 1, Window: time.Minute}, {Limit: 100, Window: time.Hour}}})
	require.NoError(t, err)
	i := newInterceptor(t, l, func(context.Context, string) (string, error) { return "k", nil }, grpclimit.Options{})
	require.NoError(t, l.Close(context.Background()))
	var header, trailer metadata.MD
	ran := false
	_, err = i.Unary(grpc.NewContextWithServerTransportStream(context.Background(), &mdStream{header: &header, trailer: &trailer}),
		nil, &grpc.UnaryServerInfo{FullMethod: methodSay}, func(context.Context, any) (any, error) { ran = true; return nil, nil })
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.ErrorContains(t, err, hybridlimit.ErrClosed.Error())
	assert.False(t, ran)
	assert.Empty(t, header)
	assert.Empty(t, trailer)
}

// mdStream is a grpc.ServerTransportStream that keeps what is set.
type mdStream struct {
	mu              sync.Mutex
	header, trailer *metadata.MD
}

func (s *mdStream) Method() string { return methodSay }
func (s *mdStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.header = metadata.Join(*s.header, md)
	return nil
}
func (s *mdStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }
func (s *mdStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.trailer = metadata.Join(*s.trailer, md)
	return nil
}

// The metadata of a decision describes the tier it was made in, although
// the key moved to another tier (of more rules, the last one used up) right
// after it: the ratelimit value carries the decision's counts, and the
// QuotaFailure names only the decision's rules.
func TestMetadataFollowsTheDecisionsTier(t *testing.T) {
	var mu sync.Mutex
	tier := "wide"
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 1, Window: time.Minute}, {Limit: 50, Window: time.Hour}},
		Tiers: map[string][]hybridlimit.Rule{"wide": {
			{Limit: 1000, Window: time.Second}, {Limit: 2000, Window: time.Minute}, {Limit: 1, Window: time.Hour}}},
		TierOf: func(string) string {
			mu.Lock()
			defer mu.Unlock()
			name := tier
			tier = "wide" // every lookup after the next one: "wide"
			return name
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	i := newInterceptor(t, l, func(context.Context, string) (string, error) { return "k", nil }, grpclimit.Options{QuotaFailure: true})
	var trailer metadata.MD
	var err3 error
	for n := range 3 { // 1: decided in "wide"; 2 and 3: in the default tier, 3 denied
		if n > 0 {
			mu.Lock()
			tier = ""
			mu.Unlock()
		}
		var header metadata.MD
		trailer = nil
		_, err3 = i.Unary(grpc.NewContextWithServerTransportStream(context.Background(), &mdStream{header: &header, trailer: &trailer}),
			nil, &grpc.UnaryServerInfo{FullMethod: methodSay}, func(context.Context, any) (any, error) { return nil, nil })
	}
	require.Equal(t, codes.ResourceExhausted, status.Code(err3), "%v", err3)
	require.Len(t, trailer.Get("ratelimit"), 1)
	assert.Regexp(t, `^"1m";r=0;t=\d+, "1h";r=49;t=\d+$`, trailer.Get("ratelimit")[0])
	var subjects []string
	for _, d := range status.Convert(err3).Details() {
		if qf, ok := d.(*errdetails.QuotaFailure); ok {
			for _, v := range qf.GetViolations() {
				subjects = append(subjects, v.GetSubject())
			}
		}
	}
	assert.Equal(t, []string{"1m"}, subjects, "the violated rules of the decision's tier")
}
