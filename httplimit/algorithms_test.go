package httplimit_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// A token bucket's quota is its burst, given over the time the burst takes
// to come back at the rate: q/w is the rate. Remaining counts whole tokens,
// and the reset is the time until the bucket is full.
func TestTokenBucketHeaders(t *testing.T) {
	// 10 per minute (one token each 6 s), at most 5 at once.
	l, mc := newLocal(t, hybridlimit.Rule{Limit: 10, Window: time.Minute, Type: hybridlimit.TokenBucket, Burst: 5})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok)
	steps := []struct {
		at         time.Duration
		status     int
		rateLimit  string
		legacy     [3]string
		retryAfter string
	}{
		{0, 200, `"1m";r=4;t=6`, [3]string{"5", "4", "6"}, ""},
		{0, 200, `"1m";r=3;t=12`, [3]string{"5", "3", "12"}, ""},
		{0, 200, `"1m";r=2;t=18`, [3]string{"5", "2", "18"}, ""},
		{0, 200, `"1m";r=1;t=24`, [3]string{"5", "1", "24"}, ""},
		{0, 200, `"1m";r=0;t=30`, [3]string{"5", "0", "30"}, ""},
		// Empty: the next token comes in 6 s.
		{0, 429, `"1m";r=0;t=6`, [3]string{"5", "0", "6"}, "6"},
		{4 * time.Second, 429, `"1m";r=0;t=2`, [3]string{"5", "0", "2"}, "2"},
		{6 * time.Second, 200, `"1m";r=0;t=30`, [3]string{"5", "0", "30"}, ""},
		// 18 s later three tokens have come back.
		{24 * time.Second, 200, `"1m";r=2;t=18`, [3]string{"5", "2", "18"}, ""},
	}
	for i, s := range steps {
		mc.Set(epoch.Add(s.at))
		w := do(h, "192.0.2.1:1")
		got := w.Result().Header
		assert.Equal(t, s.status, w.Code, "step %d: status", i)
		assert.Equal(t, `"1m";q=5;w=30`, got.Get("RateLimit-Policy"), "step %d", i)
		assert.Equal(t, s.rateLimit, got.Get("RateLimit"), "step %d: RateLimit", i)
		assert.Equal(t, s.legacy, [3]string{got.Get("RateLimit-Limit"), got.Get("RateLimit-Remaining"), got.Get("RateLimit-Reset")}, "step %d: legacy headers", i)
		assert.Equal(t, s.retryAfter, got.Get("Retry-After"), "step %d: Retry-After", i)
	}
}

// The policy of every algorithm, side by side.
func TestPolicyPerAlgorithm(t *testing.T) {
	l, _ := newLocal(t,
		hybridlimit.Rule{Limit: 10, Window: time.Second, Type: hybridlimit.Fixed},
		hybridlimit.Rule{Limit: 100, Window: time.Minute, Type: hybridlimit.Bucketed, Buckets: 6},
		hybridlimit.Rule{Limit: 1000, Window: time.Hour, Type: hybridlimit.Log},
		hybridlimit.Rule{Limit: 5, Window: time.Second, Type: hybridlimit.TokenBucket, Burst: 20},
		hybridlimit.Rule{Limit: 2, Window: time.Second, Type: hybridlimit.LeakyBucket})
	m, err := httplimit.New(l, remoteIP(t), httplimit.Options{PolicyNames: []string{"f", "b", "l", "t", "q"}})
	require.NoError(t, err)
	w := do(m.Wrap(ok), "192.0.2.1:1")
	assert.Equal(t, `"f";q=10;w=1, "b";q=100;w=60, "l";q=1000;w=3600, "t";q=20;w=4, "q";q=2;w=1`, w.Header().Get("RateLimit-Policy"))
}

// A LeakyBucket rule's admitted request reaches the handler at its turn in
// the queue, on the limiter's clock; in shadow mode it does not wait; a
// client that leaves while it waits gets the ErrorHandler.
func TestLeakyBucketDelay(t *testing.T) {
	// 10 per second: one each 100 ms, at most 3 waiting.
	rule := hybridlimit.Rule{Limit: 10, Window: time.Second, Type: hybridlimit.LeakyBucket, Burst: 3}
	l, mc := newLocal(t, rule)
	ran := make(chan time.Time, 4)
	h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran <- mc.Now()
	}))

	w := do(h, "192.0.2.1:1")
	require.Equal(t, 200, w.Code)
	require.Equal(t, epoch, <-ran, "the first request goes at once")

	// The second waits 100 ms of the limiter's clock.
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- do(h, "192.0.2.1:1") }()
	for step := 0; ; step++ {
		require.Less(t, step, 10000, "the handler never ran")
		select {
		case at := <-ran:
			assert.GreaterOrEqual(t, at.Sub(epoch), 100*time.Millisecond, "ran before its turn")
			assert.Equal(t, 200, (<-done).Code)
			goto shadow
		case <-time.After(time.Millisecond):
			mc.Add(5 * time.Millisecond)
		}
	}
shadow:
	// Shadow mode reports but never delays.
	l2, mc2 := newLocal(t, rule)
	ran2 := make(chan time.Time, 4)
	hs := mustNew(t, l2, remoteIP(t), httplimit.Options{Shadow: true}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran2 <- mc2.Now()
	}))
	for range 3 {
		require.Equal(t, 200, do(hs, "192.0.2.1:1").Code)
		require.Equal(t, epoch, <-ran2)
	}

	// A client gone while it waits: 503 from the default ErrorHandler, and
	// the handler never runs.
	l3, _ := newLocal(t, rule)
	h3 := mustNew(t, l3, remoteIP(t), httplimit.Options{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran for a client that left")
	}))
	require.Equal(t, 503, func() int {
		r := httptest.NewRequest("GET", "/x", nil)
		r.RemoteAddr = "192.0.2.1:1"
		ctx, cancel := context.WithCancel(r.Context())
		// The first request takes the turn now; the second must wait.
		_, err := l3.Allow(ctx, "192.0.2.1")
		require.NoError(t, err)
		cancel()
		w := httptest.NewRecorder()
		h3.ServeHTTP(w, r.WithContext(ctx))
		return w.Code
	}())
}

// Each tier's keys get their tier's policy in the headers; a blocked key
// gets BlockedStatus, Retry-After and a body that says so.
func TestTiersAndBlocks(t *testing.T) {
	mc := clock.NewMock()
	mc.Set(epoch)
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 2, Window: time.Minute}},
		Tiers: map[string][]hybridlimit.Rule{"paid": {{Limit: 100, Window: time.Minute}, {Limit: 1000, Window: time.Hour}}},
		TierOf: func(key string) string {
			if strings.HasPrefix(key, "paid-") {
				return "paid"
			}
			return ""
		},
		Clock: mc, Manual: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	h := mustNew(t, l, header(t, "X-Key"), httplimit.Options{BlockedStatus: 403}).Wrap(ok)

	w := do(h, "192.0.2.1:1", "X-Key", "free-1")
	assert.Equal(t, `"1m";q=2;w=60`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, "2", w.Header().Get("RateLimit-Limit"))
	w = do(h, "192.0.2.1:1", "X-Key", "paid-1")
	assert.Equal(t, `"1m";q=100;w=60, "1h";q=1000;w=3600`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"1m";r=99;t=120, "1h";r=999;t=7200`, w.Header().Get("RateLimit"))
	assert.Equal(t, "100", w.Header().Get("RateLimit-Limit"))

	require.NoError(t, l.Block(context.Background(), "paid-1", 90*time.Second, "abuse"))
	w = do(h, "192.0.2.1:1", "X-Key", "paid-1")
	assert.Equal(t, 403, w.Code)
	assert.Equal(t, "90", w.Header().Get("Retry-After"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	assert.Equal(t, "Blocked", p["title"])
	assert.Equal(t, 403.0, p["status"])
	assert.Empty(t, p["violated-policies"])
	assert.NotContains(t, w.Body.String(), "abuse", "the reason stays on the server")

	// Denied by its limit, a key gets the usual 429.
	do(h, "192.0.2.1:1", "X-Key", "free-1")
	w = do(h, "192.0.2.1:1", "X-Key", "free-1")
	assert.Equal(t, 429, w.Code)
	_, err = httplimit.New(l, header(t, "X-Key"), httplimit.Options{BlockedStatus: 200})
	assert.ErrorContains(t, err, "Options.BlockedStatus is 200, want 400 to 599")
}

// Options.Tag feeds the limiter's contributors.
func TestTag(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 2, Window: time.Minute})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{Tag: func(r *http.Request) string { return r.Header.Get("X-User") }}).Wrap(ok)
	for _, u := range []string{"ann", "ann", "bo", "bo", "bo", "ann"} {
		do(h, "192.0.2.1:1", "X-User", u)
	}
	got, err := l.Contributors(context.Background(), "192.0.2.1")
	require.NoError(t, err)
	// From the second request on (at most a quarter of 2 left).
	assert.Equal(t, []hybridlimit.Contributor{{Tag: "bo", Cost: 3}, {Tag: "ann", Cost: 2}}, got)
}

// Rules of one window are told apart by their algorithm in the default
// policy names.
func TestPolicyNamesOfOneWindow(t *testing.T) {
	l, _ := newLocal(t,
		hybridlimit.Rule{Limit: 10, Window: time.Second},
		hybridlimit.Rule{Limit: 5, Window: time.Second, Type: hybridlimit.TokenBucket},
		hybridlimit.Rule{Limit: 8, Window: time.Second, Type: hybridlimit.TokenBucket, Burst: 2})
	m := mustNew(t, l, remoteIP(t), httplimit.Options{})
	assert.Equal(t, []string{"1s", "1s-token-bucket", "1s-token-bucket-2"}, m.PolicyNames())
}
