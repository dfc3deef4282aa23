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

// Config.OnSync runs once per push of a sync cycle, and a cycle pushes
// each tier's keys apart: two tiers touched, one cycle, two calls, each
// counted in Stats.StoreCalls.
func TestOnSyncRunsPerPush(t *testing.T) {
	ctx := context.Background()
	mock := clock.NewMock()
	mock.Set(t0)
	var ops []int
	l, err := New(Config{
		Rules:  []Rule{{Limit: 5, Window: time.Second}},
		Tiers:  map[string][]Rule{"x": {{Limit: 3, Window: time.Second}}},
		TierOf: func(k string) string { return map[string]string{"x": "x"}[k] },
		Mode:   ModeAsync, Store: store.NewMemory(mock), Clock: mock, Manual: true,
		ClockSync: -1, // no clock read in the first Sync: only pushes
		OnSync:    func(_ time.Duration, n int, _ error) { ops = append(ops, n) },
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	for _, k := range []string{"a", "x"} {
		_, err := l.Allow(ctx, k)
		require.NoError(t, err)
	}
	require.NoError(t, l.Sync(ctx))
	st := l.Stats()
	assert.Equal(t, uint64(1), st.SyncCycles)
	assert.Equal(t, uint64(2), st.StoreCalls)
	assert.Equal(t, []int{2, 2}, ops, "one call per tier, each with its key's two ops")
}
