package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// flipLimiter returns a limiter with a default tier (perMinute a minute,
// 50 an hour) and a tier "wide" (3 rules, the last 1 an hour), and a func
// that makes the next lookup of a key's tier find the default tier and
// every later one "wide": a key that moves right after its decision, as
// SetOverride or a changed Config.TierOf can make it.
func flipLimiter(t *testing.T, perMinute int64) (*hybridlimit.Limiter, func()) {
	var mu sync.Mutex
	tier := "wide"
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: perMinute, Window: time.Minute}, {Limit: 50, Window: time.Hour}},
		Tiers: map[string][]hybridlimit.Rule{"wide": {
			{Limit: 1000, Window: time.Second}, {Limit: 2000, Window: time.Minute}, {Limit: 1, Window: time.Hour}}},
		TierOf: func(string) string {
			mu.Lock()
			defer mu.Unlock()
			name := tier
			tier = "wide"
			return name
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(t.Context()) })
	return l, func() { mu.Lock(); tier = ""; mu.Unlock() }
}

// The headers of a decision describe the tier it was made in, every field
// from the same rules: the RateLimit field's remaining counts are the
// decision's, not those of the tier the key moved to meanwhile.
func TestHeadersFollowTheDecisionsTier(t *testing.T) {
	l, decideInDefault := flipLimiter(t, 2)
	m, err := httplimit.New(l, func(*http.Request) (string, error) { return "k", nil }, httplimit.Options{})
	require.NoError(t, err)
	h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	rec := httptest.NewRecorder()
	decideInDefault()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, `"1m";q=2;w=60, "1h";q=50;w=3600`, rec.Header().Get("RateLimit-Policy"))
	assert.Regexp(t, `^"1m";r=1;t=\d+, "1h";r=49;t=\d+$`, rec.Header().Get("RateLimit"))
	assert.Equal(t, "2", rec.Header().Get("RateLimit-Limit"))
	assert.Equal(t, "1", rec.Header().Get("RateLimit-Remaining"))
}

// A denial in a tier of 2 rules while the key moved to a tier of 3, whose
// third rule the key used up, names the decision's violated policy, and
// does not index the decision's 2 policy names with the other tier's 3
// rules.
func TestDenialFollowsTheDecisionsTier(t *testing.T) {
	// Request 1 is decided in "wide" (using up its hourly 1), requests 2
	// and 3 in the default tier (1 a minute: the third is denied), every
	// read in "wide".
	l, decideInDefault := flipLimiter(t, 1)
	m, err := httplimit.New(l, func(*http.Request) (string, error) { return "k", nil }, httplimit.Options{})
	require.NoError(t, err)
	h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var rec *httptest.ResponseRecorder
	for i := range 3 {
		if i > 0 {
			decideInDefault()
		}
		rec = httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	}
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Regexp(t, `^"1m";r=0;t=\d+, "1h";r=49;t=\d+$`, rec.Header().Get("RateLimit"))
	assert.True(t, strings.Contains(rec.Body.String(), `"violated-policies":["1m"]`), rec.Body.String())
}
