package httplimit_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// A blocked key's headers over its block: Retry-After is the time left
// rounded up to the second (at least 1, MaxWindow's seconds for a block
// without end), no reset points past it, and the remaining quota is 0.
// A rule of MaxWindow advertises its window in full.
func TestBlockedHeaders(t *testing.T) {
	l, mc := newLocal(t, hybridlimit.Rule{Limit: 5, Window: hybridlimit.MaxWindow})
	h := mustNew(t, l, header(t, "X-Key"), httplimit.Options{}).Wrap(ok)
	ctx := context.Background()
	maxSecs := strconv.FormatInt(int64(hybridlimit.MaxWindow/time.Second), 10)

	w := do(h, "192.0.2.1:1", "X-Key", "k")
	assert.Equal(t, 200, w.Code)
	assert.Equal(t, `"366d";q=5;w=`+maxSecs, w.Header().Get("RateLimit-Policy"))
	reset, err := strconv.ParseInt(w.Header().Get("RateLimit-Reset"), 10, 64)
	require.NoError(t, err)
	assert.LessOrEqual(t, reset, 2*int64(hybridlimit.MaxWindow/time.Second), "a sliding window fades over two windows")
	assert.Equal(t, `"366d";r=4;t=`+strconv.FormatInt(reset, 10), w.Header().Get("RateLimit"))

	start := epoch.Add(250 * time.Microsecond)
	mc.Set(start)
	require.NoError(t, l.Block(ctx, "k", 1500*time.Millisecond, "r"))
	require.NoError(t, l.Block(ctx, "forever", 0, "r"))
	for _, c := range []struct {
		key   string
		at    time.Duration // since start
		retry string        // "": admitted
	}{
		{"k", 0, "2"},
		{"k", 500 * time.Millisecond, "2"}, // 1.00075s left: the end rounded up to the millisecond
		{"k", 600 * time.Millisecond, "1"},
		{"k", 1500*time.Millisecond - 1, "1"},
		{"k", 1500 * time.Millisecond, "1"}, // the store's end: the next millisecond
		{"k", 1501 * time.Millisecond, ""},
		{"forever", 0, maxSecs},
		{"forever", hybridlimit.MaxWindow, maxSecs},
	} {
		mc.Set(start.Add(c.at))
		w := do(h, "192.0.2.1:1", "X-Key", c.key)
		if c.retry == "" {
			assert.Equal(t, 200, w.Code, "%s at %v", c.key, c.at)
			continue
		}
		assert.Equal(t, 429, w.Code, "%s at %v", c.key, c.at)
		assert.Equal(t, c.retry, w.Header().Get("Retry-After"), "%s at %v", c.key, c.at)
		assert.Equal(t, "0", w.Header().Get("RateLimit-Remaining"), "%s at %v", c.key, c.at)
		assert.Equal(t, c.retry, w.Header().Get("RateLimit-Reset"), "%s at %v", c.key, c.at)
		assert.Equal(t, `"366d";r=0;t=`+c.retry, w.Header().Get("RateLimit"), "%s at %v", c.key, c.at)
	}
}

// A blocked key admits nothing, whatever its rules hold: with several
// rules too, every rule's r is 0 in the RateLimit field, as
// RateLimit-Remaining says, and every t is capped at Retry-After.
func TestBlockedHeadersSeveralRules(t *testing.T) {
	l, _ := newLocal(t, hybridlimit.Rule{Limit: 100, Window: time.Minute}, hybridlimit.Rule{Limit: 1000, Window: time.Hour})
	h := mustNew(t, l, header(t, "X-Key"), httplimit.Options{}).Wrap(ok)
	w := do(h, "192.0.2.1:1", "X-Key", "k")
	assert.Equal(t, `"1m";r=99;t=120, "1h";r=999;t=7200`, w.Header().Get("RateLimit"))
	require.NoError(t, l.Block(context.Background(), "k", 90*time.Second, "r"))
	w = do(h, "192.0.2.1:1", "X-Key", "k")
	assert.Equal(t, 429, w.Code)
	assert.Equal(t, "90", w.Header().Get("Retry-After"))
	assert.Equal(t, "0", w.Header().Get("RateLimit-Remaining"))
	assert.Equal(t, `"1m";r=0;t=90, "1h";r=0;t=90`, w.Header().Get("RateLimit"))
}

// A block whose end another program put far ahead in the store: the
// RetryAfter the limiter saturates gives the longest Retry-After, with
// jitter too, never a wrapped one.
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
	require.NoError(t, st.PutPolicy(ctx, "hl", store.Policy{Kind: store.Block, Key: "k", Until: 1 << 52}, epoch.UnixMilli()))
	require.NoError(t, l.Sync(ctx))
	for _, jitter := range []time.Duration{0, httplimit.MaxRetryJitter} {
		h := mustNew(t, l, header(t, "X-Key"), httplimit.Options{RetryJitter: jitter}).Wrap(ok)
		w := do(h, "192.0.2.1:1", "X-Key", "k")
		assert.Equal(t, 429, w.Code)
		assert.Equal(t, "9223372037", w.Header().Get("Retry-After"), "jitter %v", jitter)
		assert.Equal(t, "9223372037", w.Header().Get("RateLimit-Reset"), "jitter %v", jitter)
		assert.Equal(t, `"1m";r=0;t=9223372037`, w.Header().Get("RateLimit"), "jitter %v", jitter)
	}
}
