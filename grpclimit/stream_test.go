package grpclimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
)

// upload is what a client saw of one Upload stream.
type upload struct {
	err     error
	count   int64 // the server's count of messages, when the stream succeeded
	header  metadata.MD
	trailer metadata.MD
	retry   *errdetails.RetryInfo
}

// send opens an Upload stream, sends n messages (stopping early if the
// stream has ended) and closes it.
func send(t testing.TB, cc *grpc.ClientConn, n int) upload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{StreamName: "Upload", ClientStreams: true}, methodUpload)
	require.NoError(t, err)
	for range n {
		if cs.SendMsg(wrapperspb.String("m")) != nil {
			break // the server ended the stream: RecvMsg returns its status
		}
	}
	require.NoError(t, cs.CloseSend())
	var u upload
	out := new(wrapperspb.Int64Value)
	u.err = cs.RecvMsg(out)
	u.count = out.GetValue()
	u.header, _ = cs.Header()
	u.trailer = cs.Trailer()
	u.retry, _ = details(u.err)
	return u
}

// TestStreamDecidedOnce checks that a stream is decided when it opens, at
// the cost of one call however many messages it carries, with the
// metadata in its headers; and that a denied stream never reaches its
// handler and gets its metadata in trailers.
func TestStreamDecidedOnce(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 2, Window: time.Minute, Type: hybridlimit.Fixed})
	cc, e := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{}))
	for i, want := range []string{"1", "0"} {
		u := send(t, cc, 10)
		require.NoError(t, u.err, "stream %d", i)
		assert.Equal(t, int64(10), u.count)
		assert.Equal(t, want, fields(u.header)["ratelimit-remaining"], "stream %d", i)
		assert.Equal(t, `"1m";q=2;w=60`, fields(u.header)["ratelimit-policy"])
		assert.Empty(t, fields(u.trailer))
	}
	u := send(t, cc, 10)
	assert.Equal(t, codes.ResourceExhausted, status.Code(u.err))
	assert.Equal(t, `grpclimit: rate limit exceeded: 2 per 1m (policy "1m"); retry after 1m0s`, status.Convert(u.err).Message())
	require.NotNil(t, u.retry)
	assert.Equal(t, time.Minute, u.retry.GetRetryDelay().AsDuration())
	assert.Equal(t, map[string]string{"ratelimit-policy": `"1m";q=2;w=60`, "ratelimit": `"1m";r=0;t=60`,
		"ratelimit-limit": "2", "ratelimit-remaining": "0", "ratelimit-reset": "60", "retry-after": "60"}, fields(u.trailer))
	assert.Equal(t, int64(2), e.calls.Load(), "the denied stream's handler never ran")
	assert.Equal(t, int64(20), e.received.Load())
}

// TestMessageCost checks per-message decisions on a client stream: the
// stream's opening costs 1 and each message 1 of a limit of 5, so the
// fifth message is denied, the handler returns RecvMsg's status, and the
// client gets ResourceExhausted with RetryInfo and the metadata as
// trailers. In shadow mode every message goes through and OnDenied counts
// the would-be denials.
func TestMessageCost(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		l, _ := newLimiter(t, hybridlimit.Rule{Limit: 5, Window: time.Minute, Type: hybridlimit.Fixed})
		var costs, denials atomic.Int64
		i := newInterceptor(t, l, peerIP(t), grpclimit.Options{
			Shadow: shadow,
			MessageCost: func(_ context.Context, method string, msg any) int64 {
				assert.Equal(t, methodUpload, method)
				assert.Equal(t, "m", msg.(*wrapperspb.StringValue).GetValue(), "the message is decoded before its cost is asked")
				costs.Add(1)
				return 1
			},
			OnDenied: func(context.Context, string, string, hybridlimit.Result) { denials.Add(1) },
		})
		cc, e := serve(t, i)
		u := send(t, cc, 10)
		assert.Equal(t, "4", fields(u.header)["ratelimit-remaining"], "shadow %v: headers from the opening decision", shadow)
		if shadow {
			require.NoError(t, u.err)
			assert.Equal(t, int64(10), u.count)
			assert.Equal(t, int64(6), denials.Load(), "messages 5 to 10")
			assert.Empty(t, fields(u.trailer))
			continue
		}
		assert.Equal(t, codes.ResourceExhausted, status.Code(u.err))
		require.NotNil(t, u.retry)
		assert.Equal(t, time.Minute, u.retry.GetRetryDelay().AsDuration())
		assert.Equal(t, map[string]string{"ratelimit-policy": `"1m";q=5;w=60`, "ratelimit": `"1m";r=0;t=60`,
			"ratelimit-limit": "5", "ratelimit-remaining": "0", "ratelimit-reset": "60", "retry-after": "60"}, fields(u.trailer))
		assert.Equal(t, int64(4), e.received.Load(), "the handler got 4 messages, the fifth was denied")
		assert.Equal(t, int64(5), costs.Load())
		assert.Equal(t, int64(1), denials.Load())

		// Unary calls are untouched by MessageCost, and the key is spent.
		assert.Equal(t, codes.ResourceExhausted, status.Code(say(t, cc).err))
		assert.Equal(t, int64(5), costs.Load())
	}
}
