package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// newFlaky returns a manual limiter of mode and policy over a flaky
// memory store, on a mock clock.
func newFlaky(t *testing.T, mode Mode, fp FailurePolicy) (*Limiter, *flaky) {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(t0)
	f := &flaky{Store: store.NewMemory(mock)}
	l, err := New(Config{Rules: []Rule{{Limit: 5, Window: time.Minute}}, Mode: mode, Store: f, FailurePolicy: fp, Clock: mock, Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		f.down.Store(false)
		_ = l.Close(context.Background())
	})
	return l, f
}

// While the store fails in ModeSynchronous, Stats.Degraded counts each
// degraded decision once, and a Peek counts in none of Allowed, Denied
// and Degraded.
func TestSynchronousDegradedCountsDecisionsOnce(t *testing.T) {
	ctx := context.Background()
	for _, fp := range []FailurePolicy{FailOpen, FailClosed} {
		l, f := newFlaky(t, ModeSynchronous, fp)
		f.down.Store(true)
		res, err := l.Peek(ctx, "a")
		require.NoError(t, err)
		assert.True(t, res.Degraded, "%v: Peek", fp)
		st := l.Stats()
		assert.Equal(t, [3]uint64{0, 0, 0}, [3]uint64{st.Allowed, st.Denied, st.Degraded}, "%v: after a Peek: Allowed, Denied, Degraded", fp)
		res, err = l.Allow(ctx, "a")
		require.NoError(t, err)
		assert.True(t, res.Degraded, "%v: Allow", fp)
		st = l.Stats()
		assert.Equal(t, uint64(1), st.Allowed+st.Denied, "%v: Allowed+Denied after one Allow", fp)
		assert.Equal(t, uint64(1), st.Degraded, "%v: Degraded after one Allow", fp)
		assert.Equal(t, uint64(2), st.SyncErrors, "%v: SyncErrors: two failed store calls", fp)
	}
}

// In ModeAsync under FailClosed, while the store fails, Peek answers as
// Allow would: denied and degraded, without counting in Stats.
func TestAsyncFailClosedPeekAgreesWithAllow(t *testing.T) {
	ctx := context.Background()
	l, f := newFlaky(t, ModeAsync, FailClosed)
	_, err := l.Allow(ctx, "a")
	require.NoError(t, err)
	f.down.Store(true)
	require.Error(t, l.Sync(ctx))
	before := l.Stats()
	peek, err := l.Peek(ctx, "a")
	require.NoError(t, err)
	after := l.Stats()
	assert.Equal(t, [3]uint64{before.Allowed, before.Denied, before.Degraded}, [3]uint64{after.Allowed, after.Denied, after.Degraded}, "a Peek counts nothing")
	res, err := l.Allow(ctx, "a")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.True(t, res.Degraded)
	assert.Equal(t, res, peek, "Peek and Allow")
}
