package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

// oddAddr is a net.Addr whose text is whatever the test says.
type oddAddr string

func (a oddAddr) Network() string { return "odd" }
func (a oddAddr) String() string  { return string(a) }

// unary calls i.Unary directly (no server) with ctx and reports the status
// code and whether the handler ran.
func unary(t *testing.T, i *grpclimit.Interceptor, ctx context.Context) (codes.Code, bool) {
	t.Helper()
	ran := false
	_, err := i.Unary(ctx, nil, &grpc.UnaryServerInfo{FullMethod: methodSay}, func(context.Context, any) (any, error) {
		ran = true
		return nil, nil
	})
	return status.Code(err), ran
}

// TestEdgePeers feeds PeerIP odd peers and forwarded metadata: a missing
// peer, a nil or non-IP address, garbage and huge x-forwarded-for values
// behind a trusted proxy, bracketed IPv6 entries with and without a port.
// Nothing panics; an unkeyable call fails with
// InvalidArgument before its handler, and garbage in the forwarded
// metadata keys the call on the last trusted address.
func TestEdgePeers(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 1000, Window: time.Minute})
	kf, err := grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	require.NoError(t, err)
	keys := make(chan string, 1)
	i := newInterceptor(t, l, func(ctx context.Context, m string) (string, error) {
		k, err := kf(ctx, m)
		if err == nil {
			keys <- k
		}
		return k, err
	}, grpclimit.Options{})

	withPeer := func(a net.Addr, kv ...string) context.Context {
		ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: a})
		return metadata.NewIncomingContext(ctx, metadata.Pairs(kv...))
	}
	proxy := &net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 443}
	huge := strings.Repeat("1.2.3.4, ", 200_000) + "10.9.9.9"
	for _, c := range []struct {
		name string
		ctx  context.Context
		want string // the key; "" when the call has none
	}{
		{"no peer", context.Background(), ""},
		{"nil address", withPeer(nil), ""},
		{"unix socket", withPeer(&net.UnixAddr{Name: "/tmp/s", Net: "unix"}), ""},
		{"garbage address", withPeer(oddAddr("\xff\x00 not an ip")), ""},
		{"empty address", withPeer(oddAddr("")), ""},
		{"address without port", withPeer(oddAddr("192.0.2.7")), "192.0.2.7"},
		{"zoned IPv6", withPeer(oddAddr("[fe80::1%eth0]:80")), "fe80::1"},
		{"mapped IPv4", withPeer(&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.8"), Port: 1}), "192.0.2.8"},
		{"untrusted peer's forwarded ignored", withPeer(&net.TCPAddr{IP: net.ParseIP("192.0.2.9")}, "x-forwarded-for", "203.0.113.1"), "192.0.2.9"},
		{"forwarded garbage", withPeer(proxy, "x-forwarded-for", "\x00\xff, ][, 999.1.1.1"), "10.1.2.3"},
		{"forwarded commas only", withPeer(proxy, "x-forwarded-for", ",,, ,"), "10.1.2.3"},
		{"forwarded with port", withPeer(proxy, "x-forwarded-for", "[2001:db8::1]:443"), "2001:db8::1"},
		{"forwarded in brackets", withPeer(proxy, "x-forwarded-for", "6.6.6.6, [2001:db8::2], 10.0.0.1"), "2001:db8::2"},
		{"forwarded mapped in brackets", withPeer(proxy, "x-forwarded-for", "[::ffff:192.0.2.3]"), "192.0.2.3"},
		{"forwarded bad brackets", withPeer(proxy, "x-forwarded-for", "203.0.113.1, [::1]:, 10.0.0.1"), "10.0.0.1"},
		{"forwarded IPv4 in brackets", withPeer(proxy, "x-forwarded-for", "[192.0.2.4]"), "10.1.2.3"},
		{"forwarded huge brackets", withPeer(proxy, "x-forwarded-for", "["+strings.Repeat("0:", 100_000)+":1]"), "10.1.2.3"},
		{"forwarded repeated", withPeer(proxy, "x-forwarded-for", "203.0.113.5", "x-forwarded-for", "10.0.0.1"), "203.0.113.5"},
		{"forwarded huge", withPeer(proxy, "x-forwarded-for", huge), "1.2.3.4"},
	} {
		code, ran := unary(t, i, c.ctx)
		if c.want == "" {
			assert.Equal(t, codes.InvalidArgument, code, c.name)
			assert.False(t, ran, c.name)
			continue
		}
		assert.Equal(t, codes.OK, code, c.name)
		assert.True(t, ran, c.name)
		assert.Equal(t, c.want, <-keys, c.name)
	}
}

// TestEdgeKeysAndCosts checks key functions and costs the limiter refuses:
// an error, an empty key, a huge key, a cost of 0, -1, or above the limit.
// Each fails the call (InvalidArgument by default) without running the
// handler, for unary calls and streams alike.
func TestEdgeKeysAndCosts(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
	fixed := func(k string, err error) grpclimit.KeyFunc {
		return func(context.Context, string) (string, error) { return k, err }
	}
	cost := func(n int64) func(context.Context, string) int64 {
		return func(context.Context, string) int64 { return n }
	}
	for _, c := range []struct {
		name string
		key  grpclimit.KeyFunc
		cost func(context.Context, string) int64
		want codes.Code
	}{
		{"key error", fixed("", errors.New("boom")), nil, codes.InvalidArgument},
		{"key error and a key", fixed("k", errors.New("boom")), nil, codes.InvalidArgument},
		{"empty key", fixed("", nil), nil, codes.InvalidArgument},
		{"huge key", fixed(strings.Repeat("k", 1<<20), nil), nil, codes.InvalidArgument},
		{"binary key", fixed("\x00\xff{}\n", nil), nil, codes.OK},
		{"cost 0", fixed("k", nil), cost(0), codes.InvalidArgument},
		{"cost -1", fixed("k", nil), cost(-1), codes.InvalidArgument},
		{"cost above the limit", fixed("k", nil), cost(11), codes.InvalidArgument},
		{"cost MaxInt64", fixed("k", nil), cost(math.MaxInt64), codes.InvalidArgument},
		{"cost MinInt64", fixed("k", nil), cost(math.MinInt64), codes.InvalidArgument},
	} {
		i := newInterceptor(t, l, c.key, grpclimit.Options{Cost: c.cost})
		code, ran := unary(t, i, context.Background())
		assert.Equal(t, c.want, code, "unary: %s", c.name)
		assert.Equal(t, c.want == codes.OK, ran, "unary: %s", c.name)

		ran = false
		ss := &fakeStream{ctx: context.Background()}
		err := i.Stream(nil, ss, &grpc.StreamServerInfo{FullMethod: methodUpload, IsClientStream: true}, func(any, grpc.ServerStream) error {
			ran = true
			return nil
		})
		assert.Equal(t, c.want, status.Code(err), "stream: %s", c.name)
		assert.Equal(t, c.want == codes.OK, ran, "stream: %s", c.name)
	}
}

// fakeStream is a grpc.ServerStream that receives msgs messages, then
// io.EOF, and merges what it is given as grpc-go does.
type fakeStream struct {
	grpc.ServerStream
	ctx     context.Context
	msgs    int
	header  metadata.MD
	trailer metadata.MD
}

func (s *fakeStream) Context() context.Context { return s.ctx }
func (s *fakeStream) SetHeader(md metadata.MD) error {
	s.header = metadata.Join(s.header, md)
	return nil
}
func (s *fakeStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }
func (s *fakeStream) SetTrailer(md metadata.MD)       { s.trailer = metadata.Join(s.trailer, md) }
func (s *fakeStream) SendMsg(any) error               { return nil }
func (s *fakeStream) RecvMsg(any) error {
	if s.msgs == 0 {
		return io.EOF
	}
	s.msgs--
	return nil
}

// TestEdgeRetryBounds checks retry-after and RetryInfo at their bounds: a
// sub-second wait (a token bucket) is 1 second and its milliseconds
// rounded up; a block of no end is MaxWindow; a window rule's wait is
// whole. In every case the client retrying after RetryInfo's delay, or
// after retry-after, is admitted (after an unblock for the block), never
// before.
func TestEdgeRetryBounds(t *testing.T) {
	for _, c := range []struct {
		name      string
		rule      hybridlimit.Rule
		delay     time.Duration // RetryInfo
		retry     string        // retry-after
		remaining string
	}{
		{"token bucket 3/s", hybridlimit.Rule{Limit: 3, Window: time.Second, Type: hybridlimit.TokenBucket}, 334 * time.Millisecond, "1", "0"},
		{"token bucket 7/h", hybridlimit.Rule{Limit: 7, Window: time.Hour, Type: hybridlimit.TokenBucket}, 514286 * time.Millisecond, "515", "0"},
		{"fixed 1/MaxWindow", hybridlimit.Rule{Limit: 1, Window: hybridlimit.MaxWindow, Type: hybridlimit.Fixed}, 0, "", "0"},
	} {
		l, mc := newLimiter(t, c.rule)
		i := newInterceptor(t, l, peerIP(t), grpclimit.Options{})
		cc, _ := serve(t, i)
		var r reply
		for r = say(t, cc); r.err == nil; r = say(t, cc) {
		}
		require.Equal(t, codes.ResourceExhausted, status.Code(r.err), c.name)
		require.NotNil(t, r.retry, c.name)
		d := r.retry.GetRetryDelay().AsDuration()
		f := fields(r.trailer)
		if c.delay != 0 {
			assert.Equal(t, c.delay, d, c.name)
			assert.Equal(t, c.retry, f["retry-after"], c.name)
		}
		assert.Equal(t, c.remaining, f["ratelimit-remaining"], c.name)
		secs := parseSeconds(t, f["retry-after"]) * time.Second
		assert.GreaterOrEqual(t, secs, d, "%s: retry-after rounds RetryInfo's delay up", c.name)
		assert.LessOrEqual(t, secs, hybridlimit.MaxWindow, c.name)
		// One millisecond before the delay the call is still denied
		// (Peek: a denial would not change the state), at the delay it
		// is admitted.
		mc.Add(d - time.Millisecond)
		res, err := l.Peek(context.Background(), "127.0.0.1")
		require.NoError(t, err)
		assert.False(t, res.Allowed, "%s: admitted %v before RetryInfo's delay", c.name, time.Millisecond)
		mc.Add(time.Millisecond)
		assert.NoError(t, say(t, cc).err, "%s: denied at RetryInfo's delay %v", c.name, d)
	}

	// A block of no end: MaxWindow. A 1ns-long remainder: 1ms and 1s.
	l, mc := newLimiter(t, hybridlimit.Rule{Limit: 5, Window: time.Minute})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{RetryJitter: grpclimit.MaxRetryJitter})
	cc, _ := serve(t, i)
	ctx := context.Background()
	require.NoError(t, l.Block(ctx, "127.0.0.1", 0, ""))
	r := say(t, cc)
	require.NotNil(t, r.retry)
	d := r.retry.GetRetryDelay().AsDuration()
	assert.GreaterOrEqual(t, d, hybridlimit.MaxWindow)
	assert.LessOrEqual(t, d, hybridlimit.MaxWindow+grpclimit.MaxRetryJitter)
	f := fields(r.trailer)
	assert.GreaterOrEqual(t, parseSeconds(t, f["retry-after"])*time.Second, d)
	assert.Equal(t, "31622400", f["ratelimit-reset"], "reset capped at the block's time left, without jitter")

	require.NoError(t, l.Block(ctx, "127.0.0.1", time.Second, ""))
	mc.Add(time.Second - time.Nanosecond)
	r = say(t, cc)
	require.NotNil(t, r.retry)
	assert.GreaterOrEqual(t, r.retry.GetRetryDelay().AsDuration(), time.Millisecond)
	assert.GreaterOrEqual(t, parseSeconds(t, fields(r.trailer)["retry-after"])*time.Second, time.Second)
	mc.Add(time.Nanosecond)
	assert.NoError(t, say(t, cc).err)
}

// drainDesc is a service whose one client stream, Drain, ignores
// denied messages and reads on to the end of the stream.
var drainDesc = grpc.ServiceDesc{
	ServiceName: "hl.test.Drain",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Drain",
		ClientStreams: true,
		Handler: func(_ any, ss grpc.ServerStream) error {
			var denied int64
			for {
				err := ss.RecvMsg(new(wrapperspb.StringValue))
				if errors.Is(err, io.EOF) {
					return ss.SendMsg(wrapperspb.Int64(denied))
				}
				if err != nil && status.Code(err) != codes.ResourceExhausted {
					return err
				}
				if err != nil {
					denied++
				}
			}
		},
	}},
}

// TestEdgeTrailersOfSeveralDenials checks a client stream whose handler
// reads on past denied messages (MessageCost): its trailers hold the
// metadata of the last denial once, not one value per denial.
func TestEdgeTrailersOfSeveralDenials(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 3, Window: time.Minute, Type: hybridlimit.Fixed})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{
		MessageCost: func(context.Context, string, any) int64 { return 1 },
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainStreamInterceptor(i.Stream))
	srv.RegisterService(&drainDesc, struct{}{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "Drain", ClientStreams: true}, "/hl.test.Drain/Drain")
	require.NoError(t, err)
	for range 6 {
		require.NoError(t, cs.SendMsg(wrapperspb.String("m")))
	}
	require.NoError(t, cs.CloseSend())
	out := new(wrapperspb.Int64Value)
	require.NoError(t, cs.RecvMsg(out))
	assert.Equal(t, int64(4), out.GetValue(), "messages 3 to 6 denied")
	tr := cs.Trailer()
	for _, k := range []string{"ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"} {
		assert.Len(t, tr.Get(k), 1, "trailer %s: %q", k, tr.Get(k))
	}
}

// TestEdgeClosedLimiter checks a limiter closed before a stream opens and
// while it runs (MessageCost): the opening fails, and a later message,
// with codes.Unavailable; nothing panics and no rate-limit trailers are
// set, since nothing was decided.
func TestEdgeClosedLimiter(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
	i := newInterceptor(t, l, grpclimit.FullMethod(), grpclimit.Options{
		MessageCost: func(context.Context, string, any) int64 { return 1 },
	})
	info := &grpc.StreamServerInfo{FullMethod: methodUpload, IsClientStream: true}
	ss := &fakeStream{ctx: context.Background(), msgs: 3}
	err := i.Stream(nil, ss, info, func(_ any, s grpc.ServerStream) error {
		require.NoError(t, s.RecvMsg(nil))
		require.NoError(t, l.Close(context.Background()))
		return s.RecvMsg(nil)
	})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, "9", fields(ss.header)["ratelimit-remaining"], "the opening's headers")
	assert.Empty(t, fields(ss.trailer))

	ss = &fakeStream{ctx: context.Background(), msgs: 1}
	err = i.Stream(nil, ss, info, func(any, grpc.ServerStream) error { return nil })
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Empty(t, fields(ss.header))
	assert.Empty(t, fields(ss.trailer))
}
