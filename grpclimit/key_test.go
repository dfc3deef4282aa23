package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
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
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

// recorder wraps kf to report the key of every call on a channel.
func recorder(kf grpclimit.KeyFunc) (grpclimit.KeyFunc, <-chan string) {
	keys := make(chan string, 16)
	return func(ctx context.Context, method string) (string, error) {
		k, err := kf(ctx, method)
		if err != nil {
			keys <- "error: " + err.Error()
		} else {
			keys <- k
		}
		return k, err
	}, keys
}

func mustKey(t *testing.T) func(grpclimit.KeyFunc, error) grpclimit.KeyFunc {
	return func(k grpclimit.KeyFunc, err error) grpclimit.KeyFunc {
		t.Helper()
		require.NoError(t, err)
		return k
	}
}

// TestKeyFuncs runs every key function behind a real server and checks the
// key it computes from the connection and the call's metadata.
func TestKeyFuncs(t *testing.T) {
	must := mustKey(t)
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.0/8")}
	anonymous := func(context.Context, string) (string, error) { return "anonymous", nil }
	cases := []struct {
		name string
		key  grpclimit.KeyFunc
		md   []string // metadata pairs sent with Say
		want string   // the key, or "error: ..." for a failed call
	}{
		{"peer", must(grpclimit.PeerIP(grpclimit.IPOptions{})), []string{"x-forwarded-for", "203.0.113.9"}, "127.0.0.1"},
		{"peer, forwarded by an untrusted proxy: ignored",
			must(grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: trusted[1:]})), []string{"x-forwarded-for", "203.0.113.9"}, "127.0.0.1"},
		{"peer, forwarded by trusted proxies: the rightmost untrusted entry",
			must(grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: trusted})),
			[]string{"x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.1"}, "203.0.113.9"},
		{"peer, trusted, no forwarded metadata", must(grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: trusted})), nil, "127.0.0.1"},
		{"peer, trusted, x-real-ip", must(grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: trusted, Metadata: "X-Real-IP"})),
			[]string{"x-forwarded-for", "6.6.6.6", "x-real-ip", "198.51.100.4"}, "198.51.100.4"},
		{"metadata", metadataKey(t, "X-API-Key"), []string{"x-api-key", "k1"}, "k1"},
		{"metadata, first value", metadataKey(t, "x-api-key"), []string{"x-api-key", "k1", "x-api-key", "k2"}, "k1"},
		{"metadata missing", metadataKey(t, "x-api-key"), nil, `error: grpclimit: call has no rate-limit key: metadata "x-api-key" is missing`},
		{"metadata empty", metadataKey(t, "x-api-key"), []string{"x-api-key", ""}, `error: grpclimit: call has no rate-limit key: metadata "x-api-key" is missing`},
		{"or: first", grpclimit.Or(metadataKey(t, "x-api-key"), peerIP(t)), []string{"x-api-key", "k1"}, "0:k1"},
		{"or: fallback to the peer", grpclimit.Or(metadataKey(t, "x-api-key"), peerIP(t)), nil, "1:127.0.0.1"},
		{"or: fallback to a fixed key", grpclimit.Or(metadataKey(t, "x-api-key"), anonymous), nil, "1:anonymous"},
		{"full method", grpclimit.FullMethod(), nil, methodSay},
		{"combine", grpclimit.Combine(grpclimit.FullMethod(), peerIP(t)), nil, "17:" + methodSay + "9:127.0.0.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
			key, keys := recorder(c.key)
			cc, e := serve(t, newInterceptor(t, l, key, grpclimit.Options{}))
			r := say(t, cc, c.md...)
			assert.Equal(t, c.want, <-keys)
			if len(c.want) > 6 && c.want[:6] == "error:" {
				assert.Equal(t, codes.InvalidArgument, status.Code(r.err))
				assert.Equal(t, "grpclimit: rate-limit key: "+c.want[7:], status.Convert(r.err).Message())
				assert.Zero(t, e.calls.Load(), "the handler does not run")
				return
			}
			require.NoError(t, r.err)
			assert.Equal(t, "9", fields(r.header)["ratelimit-remaining"])
		})
	}
}

// TestKeysSeparateQuotas checks that two API keys, and two methods keyed
// by method and peer, draw on separate quotas.
func TestKeysSeparateQuotas(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute})
	cc, _ := serve(t, newInterceptor(t, l, metadataKey(t, "x-api-key"), grpclimit.Options{}))
	assert.NoError(t, say(t, cc, "x-api-key", "k1").err)
	assert.NoError(t, say(t, cc, "x-api-key", "k2").err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(t, cc, "x-api-key", "k1").err))

	l, _ = newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute})
	cc, _ = serve(t, newInterceptor(t, l, grpclimit.Combine(grpclimit.FullMethod(), peerIP(t)), grpclimit.Options{}))
	assert.NoError(t, say(t, cc).err)
	hc := healthpb.NewHealthClient(cc)
	_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
	assert.NoError(t, err, "another method, another quota")
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(t, cc).err))
}

// TestKeyFuncsDirect covers what a loopback connection cannot show: IPv6
// peers and /64 keys, mapped addresses, non-IP peers, and the combinators'
// handling of empty keys and errors.
func TestKeyFuncsDirect(t *testing.T) {
	must := mustKey(t)
	withPeer := func(a net.Addr) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: a})
	}
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	cases := []struct {
		name string
		key  grpclimit.KeyFunc
		ctx  context.Context
		want string // the key, or "error: " and the error's text
	}{
		{"v6", peerIP(t), withPeer(tcp("[2001:db8::1]:5")), "2001:db8::1"},
		{"v6 zone", peerIP(t), withPeer(&net.TCPAddr{IP: net.ParseIP("fe80::1"), Zone: "eth0"}), "fe80::1"},
		{"mapped", peerIP(t), withPeer(tcp("[::ffff:192.0.2.1]:5")), "192.0.2.1"},
		{"v6 /64", must(grpclimit.PeerIP(grpclimit.IPOptions{IPv6Bits: 64})), withPeer(tcp("[2001:db8:1:2:3:4:5:6]:5")), "2001:db8:1:2::/64"},
		{"v6 bits leave v4 alone", must(grpclimit.PeerIP(grpclimit.IPOptions{IPv6Bits: 64})), withPeer(tcp("192.0.2.1:5")), "192.0.2.1"},
		{"other addr type", peerIP(t), withPeer(&net.UDPAddr{IP: net.ParseIP("192.0.2.7"), Port: 9}), "192.0.2.7"},
		{"unix socket", peerIP(t), withPeer(&net.UnixAddr{Name: "/run/app.sock", Net: "unix"}),
			`error: grpclimit: call has no rate-limit key: peer address "/run/app.sock" is not an IP address`},
		{"no peer", peerIP(t), context.Background(), "error: grpclimit: call has no rate-limit key: the call has no peer"},
		{"trusted v6 proxy", must(grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}})),
			metadata.NewIncomingContext(withPeer(tcp("[2001:db8::1]:5")), metadata.Pairs("x-forwarded-for", "[2001:db9::7]:443")), "2001:db9::7"},
		{"trusted as mapped prefix", must(grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}})),
			metadata.NewIncomingContext(withPeer(tcp("10.1.2.3:5")), metadata.Pairs("x-forwarded-for", "203.0.113.9")), "203.0.113.9"},
		{"combine: empty part", grpclimit.Combine(grpclimit.FullMethod(), func(context.Context, string) (string, error) { return "", nil }),
			context.Background(), "error: grpclimit: call has no rate-limit key: part 1 of a combined key is empty"},
		{"combine: nothing", grpclimit.Combine(), context.Background(), "error: grpclimit: call has no rate-limit key: Combine of no key functions"},
		{"or: a hard error stops", grpclimit.Or(func(context.Context, string) (string, error) { return "", errors.New("forbidden") }, grpclimit.FullMethod()),
			context.Background(), "error: forbidden"},
		{"or: an empty key moves on", grpclimit.Or(func(context.Context, string) (string, error) { return "", nil }, grpclimit.FullMethod()),
			context.Background(), "1:/m"},
		{"or: none", grpclimit.Or(metadataKey(t, "a"), metadataKey(t, "b")), context.Background(),
			`error: grpclimit: call has no rate-limit key: metadata "b" is missing`},
		{"or: nothing", grpclimit.Or(), context.Background(), "error: grpclimit: call has no rate-limit key: Or of no key functions"},
	}
	for _, c := range cases {
		k, err := c.key(c.ctx, "/m")
		got := k
		if err != nil {
			got = "error: " + err.Error()
			if c.name != "or: a hard error stops" {
				assert.ErrorIs(t, err, grpclimit.ErrNoKey, c.name)
			}
		}
		assert.Equal(t, c.want, got, c.name)
	}
	k, err := grpclimit.FullMethod()(context.Background(), "")
	assert.ErrorIs(t, err, grpclimit.ErrNoKey)
	assert.Empty(t, k)
}

// TestPeerIPErrors checks that invalid IPOptions are errors naming the
// field and what it accepts.
func TestPeerIPErrors(t *testing.T) {
	for _, c := range []struct {
		opts grpclimit.IPOptions
		want string
	}{
		{grpclimit.IPOptions{IPv6Bits: 128}, "grpclimit: IPOptions.IPv6Bits is 128, want 0 (full address) to 127"},
		{grpclimit.IPOptions{IPv6Bits: -1}, "grpclimit: IPOptions.IPv6Bits is -1, want 0 (full address) to 127"},
		{grpclimit.IPOptions{TrustedProxies: []netip.Prefix{{}}}, "grpclimit: IPOptions.TrustedProxies[0] is not a valid prefix"},
		{grpclimit.IPOptions{Metadata: "x forwarded"}, `grpclimit: IPOptions.Metadata is "x forwarded": ' ' (byte 1) is not allowed in a metadata key; want a metadata key of letters, digits, '-', '_' and '.' (upper case is read as lower case) not beginning with grpc-`},
		{grpclimit.IPOptions{Metadata: "x-fwd-bin"}, `grpclimit: IPOptions.Metadata is "x-fwd-bin", want a text key (not ending in -bin)`},
		{grpclimit.IPOptions{Metadata: "Forwarded"}, `grpclimit: IPOptions.Metadata is "Forwarded", want a key of bare addresses such as x-forwarded-for or x-real-ip (the RFC 7239 forwarded syntax is not parsed)`},
	} {
		_, err := grpclimit.PeerIP(c.opts)
		assert.EqualError(t, err, c.want)
	}
	// TrustedProxies is copied: changing the caller's slice later changes nothing.
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	k, err := grpclimit.PeerIP(grpclimit.IPOptions{TrustedProxies: trusted})
	require.NoError(t, err)
	trusted[0] = netip.MustParsePrefix("192.0.2.0/24")
	ctx := metadata.NewIncomingContext(peer.NewContext(context.Background(), &peer.Peer{Addr: net.TCPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:1"))}),
		metadata.Pairs("x-forwarded-for", "203.0.113.9"))
	got, err := k(ctx, "/m")
	require.NoError(t, err)
	assert.Equal(t, "203.0.113.9", got)
}

// TestMetadataName: Metadata accepts any case of a metadata key, binary
// keys and :authority (TestMetadataReservedNames has the names it refuses).
func TestMetadataName(t *testing.T) {
	for _, c := range []struct{ name, sent string }{
		{"x-api-key", "x-api-key"},
		{"X-API-Key", "x-api-key"},
		{"tenant_id.v2", "tenant_id.v2"},
		{"token-bin", "token-bin"},
		{":authority", ":authority"},
	} {
		k, err := grpclimit.Metadata(c.name)
		require.NoError(t, err, "name %q", c.name)
		got, err := k(metadata.NewIncomingContext(context.Background(), metadata.MD{c.sent: {"v"}}), "/m")
		assert.NoError(t, err, "name %q", c.name)
		assert.Equal(t, "v", got, "name %q", c.name)
	}
	// A real server passes :authority on as metadata: one quota per
	// virtual host.
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
	key, keys := recorder(metadataKey(t, ":authority"))
	cc, _ := serve(t, newInterceptor(t, l, key, grpclimit.Options{}))
	require.NoError(t, say(t, cc).err)
	assert.Regexp(t, `^127\.0\.0\.1:\d+$`, <-keys, "the server's address, as the client dialled it")
}

// TestMetadataReservedNames: Metadata and IPOptions.Metadata refuse the
// names a server handler never sees a client's value for. Behind a real
// server, gRPC drops grpc-timeout, grpc-encoding, te and host from a call's
// metadata, sets content-type itself, and resets a
// call carrying connection before any handler runs; user-agent reaches the
// handler, the client's own agent first, and stays accepted.
func TestMetadataReservedNames(t *testing.T) {
	const want = "want a metadata key of letters, digits, '-', '_' and '.' (upper case is read as lower case) not beginning with grpc-, or :authority"
	for _, c := range []struct{ name, why string }{
		{"grpc-timeout", `names beginning with grpc- are reserved by gRPC, which drops some from a call's metadata and sets the others itself`},
		{"GRPC-Accept-Encoding", `names beginning with grpc- are reserved by gRPC, which drops some from a call's metadata and sets the others itself`},
		{"grpc-trace-bin", `names beginning with grpc- are reserved by gRPC, which drops some from a call's metadata and sets the others itself`},
		{"grpc-", `names beginning with grpc- are reserved by gRPC, which drops some from a call's metadata and sets the others itself`},
		{"te", `gRPC drops te from a call's metadata`},
		{"Host", `gRPC servers pass host on as :authority (key on :authority)`},
		{"connection", `gRPC servers reset a call that carries connection`},
		{"content-type", `gRPC sets content-type itself (application/grpc), alike for every call`},
		{":path", `gRPC passes on no pseudo-header but :authority`},
		{":", `gRPC passes on no pseudo-header but :authority`},
		{"", `it is empty`},
		{" ", `' ' (byte 0) is not allowed in a metadata key`},
		{"x api key", `' ' (byte 1) is not allowed in a metadata key`},
		{"x-key:", `':' (byte 5) is not allowed in a metadata key`},
		{"\x00", `'\x00' (byte 0) is not allowed in a metadata key`},
		{"x-key\r\n", `'\r' (byte 5) is not allowed in a metadata key`},
		{"ключ", `'к' (byte 0) is not allowed in a metadata key`},
		{"x/y", `'/' (byte 1) is not allowed in a metadata key`},
	} {
		k, err := grpclimit.Metadata(c.name)
		assert.EqualError(t, err, fmt.Sprintf("grpclimit: Metadata(name=%q): %s; %s", c.name, c.why, want))
		assert.Nil(t, k, "name %q", c.name)
		if c.name == ":authority" || c.name == "" || c.name[0] == ':' {
			continue
		}
		_, err = grpclimit.PeerIP(grpclimit.IPOptions{Metadata: c.name})
		assert.EqualError(t, err, fmt.Sprintf("grpclimit: IPOptions.Metadata is %q: %s; want a metadata key of letters, digits, '-', '_' and '.' (upper case is read as lower case) not beginning with grpc-", c.name, c.why), "name %q", c.name)
	}

	// What a handler gets of a call that sends every such name, with a
	// deadline (grpc-timeout on the wire) and a user agent.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	seen := make(chan metadata.MD, 1)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen <- md
		return h(ctx, req)
	}))
	srv.RegisterService(&echoDesc, &echo{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent("app/1.0"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sent := metadata.AppendToOutgoingContext(ctx, "grpc-timeout", "1S", "grpc-encoding", "gzip", "te", "x", "host", "h",
		"content-type", "text/plain", "user-agent", "u", "x-api-key", "k1")
	require.NoError(t, cc.Invoke(sent, methodSay, wrapperspb.String("hi"), new(wrapperspb.StringValue)))
	md := <-seen
	for _, name := range []string{"grpc-timeout", "grpc-encoding", "te", "host"} {
		assert.Empty(t, md.Get(name), name)
	}
	assert.Equal(t, []string{"application/grpc"}, md.Get("content-type"))
	assert.Equal(t, []string{"k1"}, md.Get("x-api-key"))
	require.Len(t, md.Get("user-agent"), 1)
	assert.True(t, strings.HasPrefix(md.Get("user-agent")[0], "app/1.0 grpc-go/"), md.Get("user-agent")[0])
	err = cc.Invoke(metadata.AppendToOutgoingContext(ctx, "connection", "close"), methodSay, wrapperspb.String("hi"), new(wrapperspb.StringValue))
	assert.Equal(t, codes.Internal, status.Code(err), "reset: %v", err)
	assert.Empty(t, seen, "the handler did not run")

	// Through the interceptor, Metadata("user-agent") keys on the client's
	// agent.
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
	key, keys := recorder(metadataKey(t, "User-Agent"))
	plain, _ := serve(t, newInterceptor(t, l, key, grpclimit.Options{}))
	ua, err := grpc.NewClient(plain.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUserAgent("app/1.0"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ua.Close() })
	require.NoError(t, say(t, ua).err)
	assert.Regexp(t, `^app/1\.0 grpc-go/\S+$`, <-keys)
}
