package grpclimit_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/grpclimit"
	"github.com/hybridlimit/hybridlimit/store"
)

func peerIP(t testing.TB) grpclimit.KeyFunc {
	k, err := grpclimit.PeerIP(grpclimit.IPOptions{})
	require.NoError(t, err)
	return k
}

func metadataKey(t testing.TB, name string) grpclimit.KeyFunc {
	k, err := grpclimit.Metadata(name)
	require.NoError(t, err)
	return k
}

// TestMetadataOverTime steps a mock clock through the instants of
// httplimit's TestHeadersOverTime (3/s and 5/min, sliding) and checks every
// field of every call, as headers when admitted and as trailers when
// denied, with the same values as the HTTP headers; and the RetryInfo delay
// of every denial against the limiter's RetryAfter.
func TestMetadataOverTime(t *testing.T) {
	l, mc := newLimiter(t,
		hybridlimit.Rule{Limit: 3, Window: time.Second},
		hybridlimit.Rule{Limit: 5, Window: time.Minute})
	denied := make(chan hybridlimit.Result, 1)
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{
		OnDenied: func(_ context.Context, method, key string, res hybridlimit.Result) {
			assert.Equal(t, methodSay, method)
			assert.Equal(t, "127.0.0.1", key)
			denied <- res
		},
	})
	cc, e := serve(t, i)
	const policy = `"1s";q=3;w=1, "1m";q=5;w=60`
	steps := []struct {
		at         time.Duration // since epoch
		rateLimit  string
		legacy     [3]string // limit, remaining, reset
		retryAfter string    // non-empty: denied
		delay      time.Duration
		message    string
	}{
		{0, `"1s";r=2;t=2, "1m";r=4;t=120`, [3]string{"3", "2", "2"}, "", 0, ""},
		{0, `"1s";r=1;t=2, "1m";r=3;t=120`, [3]string{"3", "1", "2"}, "", 0, ""},
		{0, `"1s";r=0;t=2, "1m";r=2;t=120`, [3]string{"3", "0", "2"}, "", 0, ""},
		// Denied by the 1s rule: admitted again once this second's weight
		// falls to 2/3, in 1.333…s, rounded up to 1.334s.
		{0, `"1s";r=0;t=2, "1m";r=2;t=2`, [3]string{"3", "0", "2"}, "2", 1334 * time.Millisecond,
			`grpclimit: rate limit exceeded: 3 per 1s (policy "1s"); retry after 1.334s`},
		{1500 * time.Millisecond, `"1s";r=0;t=2, "1m";r=1;t=119`, [3]string{"3", "0", "2"}, "", 0, ""},
		// 2.5 in the sliding second: 1 admitted at 1.5s plus 3·(1-f)
		// falls to 2 at f = 2/3, 166.67ms from now.
		{1500 * time.Millisecond, `"1s";r=0;t=1, "1m";r=1;t=1`, [3]string{"3", "0", "1"}, "1", 167 * time.Millisecond,
			`grpclimit: rate limit exceeded: 3 per 1s (policy "1s"); retry after 167ms`},
		{10 * time.Second, `"1s";r=2;t=2, "1m";r=0;t=110`, [3]string{"5", "0", "110"}, "", 0, ""},
		// Denied by the minute rule: the next minute admits once this
		// one's weight falls to 4/5, 12s into it: 62s from now.
		{10 * time.Second, `"1s";r=2;t=2, "1m";r=0;t=62`, [3]string{"5", "0", "62"}, "62", 62 * time.Second,
			`grpclimit: rate limit exceeded: 5 per 1m (policy "1m"); retry after 1m2s`},
	}
	var handled int64
	for n, s := range steps {
		mc.Set(epoch.Add(s.at))
		r := say(t, cc)
		if s.retryAfter == "" {
			require.NoError(t, r.err, "step %d", n)
			handled++
			assert.Equal(t, "hi", r.response)
			assert.Equal(t, map[string]string{"ratelimit-policy": policy, "ratelimit": s.rateLimit,
				"ratelimit-limit": s.legacy[0], "ratelimit-remaining": s.legacy[1], "ratelimit-reset": s.legacy[2]},
				fields(r.header), "step %d: headers", n)
			assert.Empty(t, fields(r.trailer), "step %d: no rate-limit trailers when admitted", n)
			continue
		}
		st := status.Convert(r.err)
		assert.Equal(t, codes.ResourceExhausted, st.Code(), "step %d", n)
		assert.Equal(t, s.message, st.Message(), "step %d", n)
		assert.Equal(t, map[string]string{"ratelimit-policy": policy, "ratelimit": s.rateLimit,
			"ratelimit-limit": s.legacy[0], "ratelimit-remaining": s.legacy[1], "ratelimit-reset": s.legacy[2],
			"retry-after": s.retryAfter}, fields(r.trailer), "step %d: trailers", n)
		assert.Empty(t, fields(r.header), "step %d: no rate-limit headers when denied", n)
		require.NotNil(t, r.retry, "step %d: RetryInfo", n)
		assert.Equal(t, s.delay, r.retry.GetRetryDelay().AsDuration(), "step %d: RetryInfo delay", n)
		res := <-denied
		assert.Equal(t, (res.RetryAfter + time.Millisecond - 1).Truncate(time.Millisecond), s.delay,
			"step %d: the delay is the limiter's RetryAfter (%v) rounded up", n, res.RetryAfter)
		assert.Nil(t, r.quota, "step %d: no QuotaFailure unless asked", n)
	}
	assert.Equal(t, handled, e.calls.Load(), "denied calls never reach the handler")
}

// TestQuotaFailure checks the QuotaFailure detail: every rule the call
// exceeds, named, with its limit; custom policy names flow into the
// metadata too.
func TestQuotaFailure(t *testing.T) {
	l, _ := newLimiter(t,
		hybridlimit.Rule{Limit: 2, Window: time.Minute},
		hybridlimit.Rule{Limit: 2, Window: time.Hour, Type: hybridlimit.Fixed},
		hybridlimit.Rule{Limit: 100, Window: 24 * time.Hour})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{QuotaFailure: true, PolicyNames: []string{"per-minute", "per-hour", "per-day"}})
	cc, _ := serve(t, i)
	for range 2 {
		require.NoError(t, say(t, cc).err)
	}
	r := say(t, cc)
	require.Equal(t, codes.ResourceExhausted, status.Code(r.err))
	assert.Contains(t, status.Convert(r.err).Message(), `2 per 1h (policy "per-hour")`)
	require.NotNil(t, r.quota)
	var got []string
	for _, v := range r.quota.GetViolations() {
		got = append(got, v.GetSubject()+" | "+v.GetQuotaId()+" | "+v.GetDescription())
		assert.Equal(t, int64(2), v.GetQuotaValue())
	}
	assert.Equal(t, []string{
		"per-minute | per-minute | 2 per 1m (sliding window)",
		"per-hour | per-hour | 2 per 1h (fixed window)",
	}, got)
	assert.Equal(t, `"per-minute";q=2;w=60, "per-hour";q=2;w=3600, "per-day";q=100;w=86400`, fields(r.trailer)["ratelimit-policy"])
}

// TestShadow checks that shadow mode admits every call, still reports the
// metadata (as headers, without retry-after) and calls OnDenied.
func TestShadow(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 2, Window: time.Minute})
	var mu sync.Mutex
	var denials int
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{Shadow: true, OnDenied: func(context.Context, string, string, hybridlimit.Result) {
		mu.Lock()
		denials++
		mu.Unlock()
	}})
	cc, e := serve(t, i)
	var remaining []string
	for range 4 {
		r := say(t, cc)
		require.NoError(t, r.err)
		f := fields(r.header)
		remaining = append(remaining, f["ratelimit-remaining"])
		assert.Empty(t, f["retry-after"])
		assert.Empty(t, fields(r.trailer))
	}
	assert.Equal(t, []string{"1", "0", "0", "0"}, remaining)
	assert.Equal(t, int64(4), e.calls.Load())
	mu.Lock()
	assert.Equal(t, 2, denials)
	mu.Unlock()
}

// TestCost checks a per-method cost (Say costs 2 of a limit of 5) and that
// a cost out of range fails the call with InvalidArgument.
func TestCost(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 5, Window: time.Minute})
	var cost atomic.Int64
	cost.Store(2)
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{Cost: func(_ context.Context, method string) int64 {
		if method == methodSay {
			return cost.Load()
		}
		return 1
	}})
	cc, e := serve(t, i)
	var remaining []string
	for range 2 {
		r := say(t, cc)
		require.NoError(t, r.err)
		remaining = append(remaining, fields(r.header)["ratelimit-remaining"])
	}
	assert.Equal(t, []string{"3", "1"}, remaining)
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(t, cc).err), "2 more do not fit in 1")
	// The health check costs 1: the last unit.
	_, err := healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)

	cost.Store(6)
	r := say(t, cc)
	assert.Equal(t, codes.InvalidArgument, status.Code(r.err))
	assert.Contains(t, status.Convert(r.err).Message(), "exceeds Config.Rules[0].Limit 5")
	assert.Equal(t, int64(2), e.calls.Load())
}

// TestSkip checks that skipped methods (the health service) are neither
// decided nor reported, while the others are.
func TestSkip(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{Skip: func(_ context.Context, method string) bool {
		return strings.HasPrefix(method, "/grpc.health.v1.Health/")
	}})
	cc, _ := serve(t, i)
	hc := healthpb.NewHealthClient(cc)
	for range 5 {
		_, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{})
		require.NoError(t, err, "health checks are skipped")
	}
	require.NoError(t, say(t, cc).err)
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(t, cc).err))
	// Watch is a server stream: skipped too.
	w, err := hc.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	resp, err := w.Recv()
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.GetStatus())
	h, err := w.Header()
	require.NoError(t, err)
	assert.Empty(t, fields(h))
}

// TestConcurrent sends 64 calls at once, from 64 goroutines over one
// connection, and checks that exactly the limit is admitted.
func TestConcurrent(t *testing.T) {
	const limit, callers = 20, 64
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: limit, Window: time.Minute})
	cc, e := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{}))
	var wg sync.WaitGroup
	codesSeen := make(chan codes.Code, callers)
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			codesSeen <- status.Code(say(t, cc).err)
		})
	}
	close(start)
	wg.Wait()
	close(codesSeen)
	count := map[codes.Code]int{}
	for c := range codesSeen {
		count[c]++
	}
	assert.Equal(t, map[codes.Code]int{codes.OK: limit, codes.ResourceExhausted: callers - limit}, count)
	assert.Equal(t, int64(limit), e.calls.Load())
}

// TestRetryJitter checks that jitter lands within [RetryAfter,
// RetryAfter+RetryJitter] and that retry-after agrees with it.
func TestRetryJitter(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute, Type: hybridlimit.Fixed})
	cc, _ := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{RetryJitter: 5 * time.Second}))
	require.NoError(t, say(t, cc).err)
	for range 20 {
		r := say(t, cc)
		require.NotNil(t, r.retry)
		d := r.retry.GetRetryDelay().AsDuration()
		assert.GreaterOrEqual(t, d, time.Minute)
		assert.LessOrEqual(t, d, time.Minute+5*time.Second)
		assert.Equal(t, (d+time.Second-1)/time.Second, parseSeconds(t, fields(r.trailer)["retry-after"]))
		assert.Equal(t, "60", fields(r.trailer)["ratelimit-reset"], "the reset is not jittered")
	}
}

func parseSeconds(t testing.TB, s string) time.Duration {
	d, err := time.ParseDuration(s + "s")
	require.NoError(t, err)
	return d / time.Second
}

// TestHideMetadata checks HideDraftMetadata and HideLegacyMetadata, and
// that retry-after is sent on a denial whatever is hidden.
func TestHideMetadata(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute, Type: hybridlimit.Fixed})
	cc, _ := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{HideDraftMetadata: true}))
	assert.Equal(t, map[string]string{"ratelimit-limit": "1", "ratelimit-remaining": "0", "ratelimit-reset": "60"}, fields(say(t, cc).header))

	l, _ = newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute, Type: hybridlimit.Fixed})
	cc, _ = serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{HideDraftMetadata: true, HideLegacyMetadata: true}))
	assert.Empty(t, fields(say(t, cc).header))
	assert.Equal(t, map[string]string{"retry-after": "60"}, fields(say(t, cc).trailer))
}

// A token bucket is advertised by its burst (as httplimit does), in the
// metadata and in QuotaFailure.
func TestTokenBucketQuota(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Minute, Type: hybridlimit.TokenBucket, Burst: 5})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{QuotaFailure: true})
	cc, _ := serve(t, i)
	for n := range 5 {
		r := say(t, cc)
		require.NoError(t, r.err, "call %d", n)
		assert.Equal(t, "5", fields(r.header)["ratelimit-limit"])
	}
	r := say(t, cc)
	require.Equal(t, codes.ResourceExhausted, status.Code(r.err))
	assert.Equal(t, `"1m";q=5;w=30`, fields(r.trailer)["ratelimit-policy"])
	assert.Equal(t, "6", fields(r.trailer)["retry-after"], "one token each 6 s")
	require.NotNil(t, r.quota)
	require.Len(t, r.quota.GetViolations(), 1)
	assert.Equal(t, int64(5), r.quota.GetViolations()[0].GetQuotaValue())
	assert.Equal(t, "10 per 1m (token-bucket, burst 5)", r.quota.GetViolations()[0].GetDescription())
}

// A call admitted by a LeakyBucket rule reaches the handler at its turn in
// the queue, on the limiter's clock.
func TestLeakyBucketDelay(t *testing.T) {
	l, mc := newLimiter(t, hybridlimit.Rule{Limit: 10, Window: time.Second, Type: hybridlimit.LeakyBucket, Burst: 3})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{})
	cc, e := serve(t, i)
	require.NoError(t, say(t, cc).err)
	done := make(chan error, 1)
	go func() { done <- say(t, cc).err }()
	for step := 0; ; step++ {
		require.Less(t, step, 10000, "the call never went on")
		select {
		case err := <-done:
			require.NoError(t, err)
			assert.GreaterOrEqual(t, mc.Now().Sub(epoch), 100*time.Millisecond, "went on before its turn")
			assert.Equal(t, int64(2), e.calls.Load())
			return
		case <-time.After(time.Millisecond):
			if e.calls.Load() == 1 {
				mc.Add(5 * time.Millisecond)
			}
		}
	}
}

// A paid tier's keys get the paid tier's policy; a blocked key's calls fail
// with Options.BlockedCode and a RetryInfo of the time left.
func TestTiersAndBlocks(t *testing.T) {
	mc := clock.NewMock()
	mc.Set(epoch)
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 2, Window: time.Minute}},
		Tiers:  map[string][]hybridlimit.Rule{"paid": {{Limit: 100, Window: time.Minute}}},
		TierOf: func(string) string { return "paid" },
		Clock:  mc, Manual: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{BlockedCode: codes.PermissionDenied})
	cc, e := serve(t, i)
	r := say(t, cc)
	require.NoError(t, r.err)
	assert.Equal(t, `"1m";q=100;w=60`, fields(r.header)["ratelimit-policy"])
	assert.Equal(t, "100", fields(r.header)["ratelimit-limit"])

	require.NoError(t, l.Block(context.Background(), "127.0.0.1", 30*time.Second, "abuse"))
	r = say(t, cc)
	st := status.Convert(r.err)
	assert.Equal(t, codes.PermissionDenied, st.Code())
	assert.Equal(t, "grpclimit: this client is blocked; retry after 30s", st.Message())
	require.NotNil(t, r.retry)
	assert.Equal(t, 30*time.Second, r.retry.GetRetryDelay().AsDuration())
	assert.Equal(t, "30", fields(r.trailer)["retry-after"])
	assert.Equal(t, int64(1), e.calls.Load())
}

// Options.Tag feeds the limiter's contributors.
func TestTag(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 1, Window: time.Minute})
	i := newInterceptor(t, l, peerIP(t), grpclimit.Options{Tag: func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-user"); len(v) > 0 {
			return v[0]
		}
		return ""
	}})
	cc, _ := serve(t, i)
	for _, u := range []string{"ann", "bo", "bo"} {
		say(t, cc, "x-user", u)
	}
	got, err := l.Contributors(context.Background(), "127.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, []hybridlimit.Contributor{{Tag: "bo", Cost: 2}, {Tag: "ann", Cost: 1}}, got)
}

// A blocked key admits nothing, whatever its rules hold: with several
// rules too, every rule's r is 0 in the ratelimit field, as
// ratelimit-remaining says, and every t is capped at retry-after.
func TestBlockedMetadataSeveralRules(t *testing.T) {
	l, _ := newLimiter(t, hybridlimit.Rule{Limit: 100, Window: time.Minute}, hybridlimit.Rule{Limit: 1000, Window: time.Hour})
	cc, _ := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{}))
	r := say(t, cc)
	require.NoError(t, r.err)
	assert.Equal(t, `"1m";r=99;t=120, "1h";r=999;t=7200`, fields(r.header)["ratelimit"])
	require.NoError(t, l.Block(context.Background(), "127.0.0.1", 90*time.Second, "r"))
	r = say(t, cc)
	assert.Equal(t, codes.ResourceExhausted, status.Code(r.err))
	assert.Equal(t, "90", fields(r.trailer)["retry-after"])
	assert.Equal(t, "0", fields(r.trailer)["ratelimit-remaining"])
	assert.Equal(t, `"1m";r=0;t=90, "1h";r=0;t=90`, fields(r.trailer)["ratelimit"])
}

// A block whose end another program put far ahead in the store: the
// RetryAfter the limiter saturates gives the longest retry-after and
// RetryInfo, with jitter too, never a wrapped one.
func TestBlockedFarEnd(t *testing.T) {
	ctx := context.Background()
	mc := clock.NewMock()
	mc.Set(epoch)
	st := store.NewMemory(mc)
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 5, Window: time.Minute}},
		Mode:  hybridlimit.ModeAsync, Store: st, Clock: mc, Manual: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	require.NoError(t, st.PutPolicy(ctx, "hl", store.Policy{Kind: store.Block, Key: "127.0.0.1", Until: 1 << 52}, epoch.UnixMilli()))
	require.NoError(t, l.Sync(ctx))
	for _, jitter := range []time.Duration{0, grpclimit.MaxRetryJitter} {
		cc, _ := serve(t, newInterceptor(t, l, peerIP(t), grpclimit.Options{RetryJitter: jitter}))
		r := say(t, cc)
		assert.Equal(t, codes.ResourceExhausted, status.Code(r.err))
		f := fields(r.trailer)
		assert.Equal(t, "9223372037", f["retry-after"], "jitter %v", jitter)
		assert.Equal(t, "9223372037", f["ratelimit-reset"], "jitter %v", jitter)
		assert.Equal(t, `"1m";r=0;t=9223372037`, f["ratelimit"], "jitter %v", jitter)
		require.NotNil(t, r.retry)
		assert.Greater(t, r.retry.GetRetryDelay().AsDuration(), 100_000*time.Hour, "jitter %v", jitter)
	}
}
