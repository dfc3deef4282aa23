package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// downStore is a store that always fails.
type downStore struct{}

var errDown = errors.New("store down")

func (downStore) Group(string) int                                 { return 0 }
func (downStore) Push(context.Context, []*store.Batch) error       { return errDown }
func (downStore) Take(context.Context, []*store.TakeRequest) error { return errDown }
func (downStore) Time(context.Context) (time.Time, error)          { return time.Time{}, errDown }

// A synchronous limiter whose store is down, FailClosed: the request is
// denied by the failure policy, not by a rule. The headers say nothing is
// admitted now (r=0 for every rule, as RateLimit-Remaining), with the
// loop's wait as Retry-After and every reset at it, and the body names no
// violated policy.
func TestFailClosedStoreDown(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:         []hybridlimit.Rule{{Limit: 10, Window: time.Minute}, {Limit: 100, Window: time.Hour}},
		Mode:          hybridlimit.ModeSynchronous,
		Store:         downStore{},
		FailurePolicy: hybridlimit.FailClosed,
		Manual:        true,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = l.Close(ctx)
	})
	var degraded bool
	h := mustNew(t, l, remoteIP(t), httplimit.Options{
		OnDenied: func(_ *http.Request, _ string, res hybridlimit.Result) { degraded = res.Degraded },
	}).Wrap(ok)
	w := do(h, "192.0.2.1:1")
	assert.Equal(t, 429, w.Code)
	assert.True(t, degraded)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Equal(t, "0", w.Header().Get("RateLimit-Remaining"))
	assert.Equal(t, `"1m";r=0;t=1, "1h";r=0;t=1`, w.Header().Get("RateLimit"))
	assert.Equal(t, "1", w.Header().Get("RateLimit-Reset"))
	var p map[string]any
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
	assert.Empty(t, p["violated-policies"], "no rule was exceeded")
	assert.Equal(t, "about:blank", p["type"])
	assert.Equal(t, "the rate limiter cannot decide and fails closed; retry after 1 s", p["detail"])
}

// A full key table under FailClosed denies a new key by the failure
// policy: RateLimit-Remaining says 0 like the draft field, not the rule's
// untouched limit.
func TestFailClosedTableFull(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:         []hybridlimit.Rule{{Limit: 10, Window: time.Second}, {Limit: 50, Window: time.Minute}},
		MaxKeys:       1,
		FailurePolicy: hybridlimit.FailClosed,
		Manual:        true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	h := mustNew(t, l, remoteIP(t), httplimit.Options{}).Wrap(ok)
	require.Equal(t, 200, do(h, "192.0.2.1:1").Code)
	w := do(h, "192.0.2.2:1") // a new key: the table is full
	assert.Equal(t, 429, w.Code)
	assert.Equal(t, "1", w.Header().Get("Retry-After"))
	assert.Equal(t, "0", w.Header().Get("RateLimit-Remaining"))
	assert.Equal(t, "1", w.Header().Get("RateLimit-Reset"))
	assert.Equal(t, `"1s";r=0;t=1, "1m";r=0;t=1`, w.Header().Get("RateLimit"))
}
