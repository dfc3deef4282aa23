package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

// The test service, hl.test.Echo, is written by hand on the proto codec
// with well-known wrapper messages, so that no protoc step is needed:
//
//	rpc Say(StringValue) returns (StringValue);               // echoes
//	rpc Upload(stream StringValue) returns (Int64Value);      // counts messages
const (
	methodSay    = "/hl.test.Echo/Say"
	methodUpload = "/hl.test.Echo/Upload"
)

// echo counts the handler runs and the messages its streams received.
type echo struct {
	calls    atomic.Int64 // handler runs, unary and stream
	received atomic.Int64 // messages received by Upload handlers
}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "hl.test.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Say",
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				srv.(*echo).calls.Add(1)
				return wrapperspb.String(req.(*wrapperspb.StringValue).GetValue()), nil
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: methodSay}, h)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "Upload",
		ClientStreams: true,
		Handler: func(srv any, ss grpc.ServerStream) error {
			e := srv.(*echo)
			e.calls.Add(1)
			var n int64
			for {
				err := ss.RecvMsg(new(wrapperspb.StringValue))
				if errors.Is(err, io.EOF) {
					return ss.SendMsg(wrapperspb.Int64(n))
				}
				if err != nil {
					return err // a denied message ends the stream with its status
				}
				n++
				e.received.Add(1)
			}
		},
	}},
}

// epoch is an instant aligned to every window the tests use.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// newLimiter returns a ModeLocal limiter on a mock clock set to epoch.
func newLimiter(t testing.TB, rules ...hybridlimit.Rule) (*hybridlimit.Limiter, *clock.Mock) {
	t.Helper()
	mc := clock.NewMock()
	mc.Set(epoch)
	l, err := hybridlimit.New(hybridlimit.Config{Rules: rules, Clock: mc, Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, mc
}

// newInterceptor returns New's Interceptor, failing the test on error.
func newInterceptor(t testing.TB, l *hybridlimit.Limiter, key grpclimit.KeyFunc, opts grpclimit.Options) *grpclimit.Interceptor {
	t.Helper()
	i, err := grpclimit.New(l, key, opts)
	require.NoError(t, err)
	return i
}

// serve starts a gRPC server with the echo and health services behind i,
// on a loopback TCP port, and returns a client connected to it.
func serve(t testing.TB, i *grpclimit.Interceptor) (*grpc.ClientConn, *echo) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(i.Unary), grpc.ChainStreamInterceptor(i.Stream))
	e := &echo{}
	srv.RegisterService(&echoDesc, e)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		<-done
	})
	return cc, e
}

// reply is what a client saw of one unary call.
type reply struct {
	err      error
	header   metadata.MD
	trailer  metadata.MD
	retry    *errdetails.RetryInfo
	quota    *errdetails.QuotaFailure
	response string
}

// say calls Say with the metadata pairs kv.
func say(t testing.TB, cc *grpc.ClientConn, kv ...string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	var r reply
	out := new(wrapperspb.StringValue)
	r.err = cc.Invoke(ctx, methodSay, wrapperspb.String("hi"), out, grpc.Header(&r.header), grpc.Trailer(&r.trailer))
	r.response = out.GetValue()
	r.retry, r.quota = details(r.err)
	return r
}

// details returns the RetryInfo and QuotaFailure details of err's status.
func details(err error) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	var ri *errdetails.RetryInfo
	var qf *errdetails.QuotaFailure
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			ri = d
		case *errdetails.QuotaFailure:
			qf = d
		}
	}
	return ri, qf
}

// fields returns the rate-limit fields of md, one value each ("" when
// missing, "<n values>" when repeated).
func fields(md metadata.MD) map[string]string {
	out := map[string]string{}
	for _, k := range []string{"ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"} {
		switch v := md.Get(k); len(v) {
		case 0:
		case 1:
			out[k] = v[0]
		default:
			out[k] = "<repeated>"
		}
	}
	return out
}
