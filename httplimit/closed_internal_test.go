package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
)

// A limiter closed between a decision and its headers (Close racing a
// request) still gets the decision's headers: the RateLimit field
// describes the decision's rule rather than being empty, and no header
// value is empty; the problem body names the decision's violated rule.
func TestHeadersAfterCloseAreNeverEmpty(t *testing.T) {
	ctx := context.Background()
	l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{
		{Limit: 1, Window: time.Minute}, {Limit: 100, Window: time.Hour}}})
	require.NoError(t, err)
	m, err := New(l, func(*http.Request) (string, error) { return "k", nil }, Options{})
	require.NoError(t, err)
	_, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Allowed)
	require.NoError(t, l.Close(ctx))

	h := http.Header{}
	m.setHeaders(h, ctx, "k", &res, 60, true)
	require.NotEmpty(t, h)
	for k, vs := range h {
		for _, v := range vs {
			assert.NotEmpty(t, v, "header %q", k)
		}
	}
	assert.Regexp(t, `^"1m";r=0;t=\d+$`, h.Get(headerRateLimit))

	rec := httptest.NewRecorder()
	m.deny(rec, httptest.NewRequest("GET", "/", nil), "k", &res, 1, 60)
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Contains(t, rec.Body.String(), `"violated-policies":["1m"]`)
}
