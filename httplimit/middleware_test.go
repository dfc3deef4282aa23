package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// epoch is an instant aligned to every window the tests use.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// newLocal returns a ModeLocal limiter on a mock clock set to epoch.
func newLocal(t *testing.T, rules ...hybridlimit.Rule) (*hybridlimit.Limiter, *clock.Mock) {
	t.Helper()
	mc := clock.NewMock()
	mc.Set(epoch)
	l, err := hybridlimit.New(hybridlimit.Config{Rules: rules, Clock: mc, Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, mc
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write([]byte("ok\n"))
})

func mustNew(t *testing.T, l *hybridlimit.Limiter, key httplimit.KeyFunc, opts httplimit.Options) *httplimit.Middleware {
	t.Helper()
	m, err := httplimit.New(l, key, opts)
	require.NoError(t, err)
	return m
}

func remoteIP(t testing.TB) httplimit.KeyFunc {
	k, err := httplimit.ClientIP(httplimit.IPOptions{})
	require.NoError(t, err)
	return k
}

func header(t testing.TB, name string) httplimit.KeyFunc {
	k, err := httplimit.Header(name)
	require.NoError(t, err)
	return k
}

func do(h http.Handler, remote string, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/x", nil)
	r.RemoteAddr = remote
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHeadersOverTime steps a mock clock through exact instants and checks
// every header of every response, for two sliding rules (3/s and 5/min).
func TestHeadersOverTime(t *testing.T) {
	l, mc := newLocal(t,
		hybridlimit.Rule{Limit: 3, Window: time.Second},
		hybridlimit.Rule{Limit: 5, Window: time.Minute})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok)
	const policy = `"1s";q=3;w=1, "1m";q=5;w=60`
	steps := []struct {
		at         time.Duration // since epoch
		status     int
		rateLimit  string
		legacy     [3]string // limit, remaining, reset
		retryAfter string
	}{
		{0, 200, `"1s";r=2;t=2, "1m";r=4;t=120`, [3]string{"3", "2", "2"}, ""},
		{0, 200, `"1s";r=1;t=2, "1m";r=3;t=120`, [3]string{"3", "1", "2"}, ""},
		{0, 200, `"1s";r=0;t=2, "1m";r=2;t=120`, [3]string{"3", "0", "2"}, ""},
		// Denied by the 1s rule: 3 in this second, the next window admits
		// once the weight of this one falls to 2/3, 1.333s from now. The
		// effective windows are capped at Retry-After.
		{0, 429, `"1s";r=0;t=2, "1m";r=2;t=2`, [3]string{"3", "0", "2"}, "2"},
		// 1.5s later: the 1s rule estimates 3·0.5 = 1.5, admits one more
		// (2.5, nothing whole left); the minute rule holds 4 of 5.
		{1500 * time.Millisecond, 200, `"1s";r=0;t=2, "1m";r=1;t=119`, [3]string{"3", "0", "2"}, ""},
		{1500 * time.Millisecond, 429, `"1s";r=0;t=1, "1m";r=1;t=1`, [3]string{"3", "0", "1"}, "1"},
		// 10s later the second windows are clear; the minute rule is the
		// tightest and its last unit is taken.
		{10 * time.Second, 200, `"1s";r=2;t=2, "1m";r=0;t=110`, [3]string{"5", "0", "110"}, ""},
		// Denied by the minute rule: 5 in this minute; the next minute admits
		// once this one's weight falls to 4/5, 12s into it: 62s from now.
		{10 * time.Second, 429, `"1s";r=2;t=2, "1m";r=0;t=62`, [3]string{"5", "0", "62"}, "62"},
	}
	for i, s := range steps {
		mc.Set(epoch.Add(s.at))
		w := do(h, "192.0.2.1:1234")
		got := w.Result().Header
		assert.Equal(t, s.status, w.Code, "step %d: status", i)
		assert.Equal(t, policy, got.Get("RateLimit-Policy"), "step %d: RateLimit-Policy", i)
		assert.Equal(t, s.rateLimit, got.Get("RateLimit"), "step %d: RateLimit", i)
		assert.Equal(t, s.legacy, [3]string{got.Get("RateLimit-Limit"), got.Get("RateLimit-Remaining"), got.Get("RateLimit-Reset")}, "step %d: legacy headers", i)
		assert.Equal(t, s.retryAfter, got.Get("Retry-After"), "step %d: Retry-After", i)
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
			assert.Len(t, got.Values(name), 1, "step %d: one %s field", i, name)
		}
	}
}

func TestDeniedBody(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 1, Window: time.Minute}, hybridlimit.Rule{Limit: 100, Window: time.Hour})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok)
	require.Equal(t, 200, do(h, "192.0.2.1:1").Code)
	w := do(h, "192.0.2.1:1")
	require.Equal(t, 429, w.Code)
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), w.Body.String())
	assert.Equal(t, httplimit.ProblemType, p["type"])
	assert.Equal(t, float64(429), p["status"])
	assert.Equal(t, []any{"1m"}, p["violated-policies"])
	assert.Equal(t, "rate limit exceeded; retry after 120 s", p["detail"])
}

func TestDeniedHandlerAndStatus(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 1, Window: time.Minute})
	var got hybridlimit.Result
	m := mustNew(t, l, remoteIP(t), httplimit.Options{
		DeniedHandler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got, _ = httplimit.ResultFrom(r)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("slow down\n"))
		}),
		HideDraftHeaders: true,
	})
	h := m.Wrap(ok)
	do(h, "192.0.2.1:1")
	w := do(h, "192.0.2.1:1")
	assert.Equal(t, 503, w.Code)
	assert.Equal(t, "slow down\n", w.Body.String())
	// One request in a sliding minute: the next minute admits once this
	// one's weight has fallen to zero, 120s from now.
	assert.Equal(t, "120", w.Header().Get("Retry-After"))
	assert.Empty(t, w.Header().Get("RateLimit"))
	assert.Equal(t, "0", w.Header().Get("RateLimit-Remaining"))
	assert.False(t, got.Allowed)
	assert.Equal(t, int64(1), got.Limit)

	l2, _ := newLocal(t, hybridlimit.Rule{Limit: 1, Window: time.Minute})
	h2 := mustNew(t, l2, remoteIP(t), httplimit.Options{DeniedStatus: 503, HideLegacyHeaders: true}).Wrap(ok)
	do(h2, "192.0.2.1:1")
	w = do(h2, "192.0.2.1:1")
	assert.Equal(t, 503, w.Code)
	assert.Empty(t, w.Header().Get("RateLimit-Remaining"))
	assert.Equal(t, `"1m";r=0;t=120`, w.Header().Get("RateLimit"))
}

func TestRetryJitter(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 1, Window: time.Second, Type: hybridlimit.Fixed})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{RetryJitter: 5 * time.Second}).Wrap(ok)
	do(h, "192.0.2.1:1")
	seen := map[string]bool{}
	for range 200 {
		w := do(h, "192.0.2.1:1")
		require.Equal(t, 429, w.Code)
		seen[w.Header().Get("Retry-After")] = true
	}
	// 1s until the fixed window ends, plus 0 to 5s of jitter, rounded up.
	for v := range seen {
		assert.Contains(t, []string{"1", "2", "3", "4", "5", "6"}, v)
	}
	assert.Greater(t, len(seen), 2, "jitter spreads Retry-After: %v", seen)
}

func TestShadow(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 2, Window: time.Minute})
	var denied atomic.Int64
	h := mustNew(t, l, remoteIP(t), httplimit.Options{
		Shadow:   true,
		OnDenied: func(r *http.Request, key string, res hybridlimit.Result) { denied.Add(1) },
	}).Wrap(ok)
	for i := range 5 {
		w := do(h, "192.0.2.1:1")
		assert.Equal(t, 200, w.Code, "request %d", i)
		assert.Equal(t, "ok\n", w.Body.String())
		assert.Empty(t, w.Header().Get("Retry-After"), "request %d", i)
		if i >= 2 {
			// 2 in a sliding minute: the next admits 30s into the next minute.
			assert.Equal(t, `"1m";r=0;t=90`, w.Header().Get("RateLimit"), "request %d", i)
		}
	}
	assert.Equal(t, int64(3), denied.Load())
	st := l.Stats()
	assert.Equal(t, uint64(2), st.Allowed)
	assert.Equal(t, uint64(3), st.Denied)
}

func TestKeyErrors(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 10, Window: time.Minute})
	h := mustNew(t, l, header(t, "X-API-Key"), httplimit.Options{}).Wrap(ok)

	w := do(h, "192.0.2.1:1")
	assert.Equal(t, 400, w.Code)
	assert.Equal(t, "application/problem+json", w.Header().Get("Content-Type"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	assert.Contains(t, p["detail"], "X-Api-Key is missing")

	w = do(h, "192.0.2.1:1", "X-API-Key", strings.Repeat("k", 2000))
	assert.Equal(t, 400, w.Code, "oversized key")
	assert.Contains(t, w.Body.String(), "MaxKeyLen")

	assert.Equal(t, 200, do(h, "192.0.2.1:1", "X-API-Key", "k1").Code)

	var gotErr error
	h = mustNew(t, l, header(t, "X-API-Key"), httplimit.Options{
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			gotErr = err
			w.WriteHeader(http.StatusUnauthorized)
		},
	}).Wrap(ok)
	assert.Equal(t, 401, do(h, "192.0.2.1:1").Code)
	var ke *httplimit.KeyError
	assert.ErrorAs(t, gotErr, &ke)
	assert.ErrorIs(t, gotErr, httplimit.ErrNoKey)

	// A cost above the smallest limit can never be admitted: an error, not
	// a denial.
	h = mustNew(t, l, remoteIP(t), httplimit.Options{Cost: func(*http.Request) int64 { return 11 }}).Wrap(ok)
	assert.Equal(t, 400, do(h, "192.0.2.1:1").Code)

	require.NoError(t, l.Close(context.Background()))
	h = mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok)
	assert.Equal(t, 503, do(h, "192.0.2.1:1").Code, "closed limiter")
}

func TestCost(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 10, Window: time.Minute, Type: hybridlimit.Fixed})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{Cost: func(r *http.Request) int64 { return 4 }}).Wrap(ok)
	for i, want := range []int{200, 200, 429} {
		w := do(h, "192.0.2.1:1")
		assert.Equal(t, want, w.Code, "request %d", i)
	}
	assert.Equal(t, "2", do(h, "192.0.2.1:1").Header().Get("RateLimit-Remaining"))
}

func TestNewErrors(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 10, Window: time.Minute}, hybridlimit.Rule{Limit: 100, Window: time.Hour})
	key := remoteIP(t)
	cases := []struct {
		name string
		l    *hybridlimit.Limiter
		key  httplimit.KeyFunc
		opts httplimit.Options
		want string
	}{
		{"nil limiter", nil, key, httplimit.Options{}, "limiter is nil"},
		{"nil key", l, nil, httplimit.Options{}, "key function is nil"},
		{"status", l, key, httplimit.Options{DeniedStatus: 200}, "Options.DeniedStatus is 200, want 400 to 599"},
		{"jitter", l, key, httplimit.Options{RetryJitter: -1}, "Options.RetryJitter is -1ns, want 0 to 1h0m0s"},
		{"huge jitter", l, key, httplimit.Options{RetryJitter: 1 << 62}, "Options.RetryJitter is 1281023h"},
		{"names count", l, key, httplimit.Options{PolicyNames: []string{"a"}}, "Options.PolicyNames has 1 names, want one per rule: 2"},
		{"empty name", l, key, httplimit.Options{PolicyNames: []string{"a", ""}}, "Options.PolicyNames[1] is empty"},
		{"bad name", l, key, httplimit.Options{PolicyNames: []string{"a", "é"}}, "Options.PolicyNames[1]"},
		{"dup name", l, key, httplimit.Options{PolicyNames: []string{"a", "a"}}, `policy name "a" of rule 1 repeats rule 0's`},
	}
	for _, c := range cases {
		_, err := httplimit.New(c.l, c.key, c.opts)
		if assert.Error(t, err, c.name) {
			assert.Contains(t, err.Error(), c.want, c.name)
		}
	}
	m, err := httplimit.New(l, key, httplimit.Options{PolicyNames: []string{`per "min"`, `hour\ly`}})
	require.NoError(t, err)
	w := do(m.Wrap(ok), "192.0.2.1:1")
	assert.Equal(t, `"per \"min\"";q=10;w=60, "hour\\ly";q=100;w=3600`, w.Header().Get("RateLimit-Policy"))
}

func TestPolicyName(t *testing.T) {
	for _, c := range []struct {
		w    time.Duration
		want string
	}{
		{time.Second, "1s"}, {90 * time.Second, "90s"}, {time.Minute, "1m"}, {15 * time.Minute, "15m"},
		{time.Hour, "1h"}, {36 * time.Hour, "36h"}, {24 * time.Hour, "1d"}, {7 * 24 * time.Hour, "7d"},
		{250 * time.Millisecond, "250ms"}, {1500 * time.Millisecond, "1500ms"},
	} {
		assert.Equal(t, c.want, httplimit.PolicyName(c.w), "%v", c.w)
	}
}

// TestSubSecondWindow: the draft's "w" is whole seconds, so a 250ms window
// is advertised as 1s (understating the rate) and "t" rounds up.
func TestSubSecondWindow(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 5, Window: 250 * time.Millisecond})
	w := do(mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok), "192.0.2.1:1")
	assert.Equal(t, `"250ms";q=5;w=1`, w.Header().Get("RateLimit-Policy"))
	assert.Equal(t, `"250ms";r=4;t=1`, w.Header().Get("RateLimit"))
}

// TestHandlerHeadersWin: the handler runs after the headers are set, so it
// can override or extend them.
func TestHandlerHeadersWin(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 5, Window: time.Minute})
	h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("RateLimit", `"other";r=1`)
		w.Header().Set("RateLimit-Limit", "7")
	}))
	w := do(h, "192.0.2.1:1")
	assert.Equal(t, []string{`"1m";r=4;t=120`, `"other";r=1`}, w.Header().Values("RateLimit"))
	assert.Equal(t, "7", w.Header().Get("RateLimit-Limit"))
	// The next response's values are intact.
	w = do(h, "192.0.2.1:1")
	assert.Equal(t, []string{`"1m";r=3;t=120`, `"other";r=1`}, w.Header().Values("RateLimit"))
}

func TestDefaultErrorHandler(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{hybridlimit.ErrClosed, 503},
		{context.Canceled, 503},
		{&httplimit.KeyError{Err: httplimit.ErrNoKey}, 400},
		{errors.New("bad \"key\"\n\xff"), 400},
		// Config.TierOf named no tier: the server's configuration, not
		// the request, is at fault.
		{fmt.Errorf("wrapped: %w", hybridlimit.ErrUnknownTier), 500},
	} {
		w := httptest.NewRecorder()
		httplimit.DefaultErrorHandler(w, httptest.NewRequest("GET", "/", nil), c.err)
		assert.Equal(t, c.want, w.Code, "%v", c.err)
		var p map[string]any
		assert.NoError(t, json.Unmarshal(w.Body.Bytes(), &p), "%q", w.Body.String())
	}
}
