package hybridlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// In ModeSynchronous with the key table full, Stats still counts every
// decision the store made in Allowed or Denied, and Overflow counts only
// the decisions on keys the table could not track, as in the other modes.
func TestSynchronousStatsWithFullTable(t *testing.T) {
	mc := clock.NewMock()
	mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:   []hybridlimit.Rule{{Limit: 1, Window: time.Hour}},
		Mode:    hybridlimit.ModeSynchronous,
		Store:   store.NewMemory(mc),
		MaxKeys: 2,
		Clock:   mc,
		Manual:  true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	for step, c := range []struct {
		key                     string
		allowed                 bool
		wantAllowed, wantDenied uint64
		wantOverflow            uint64
	}{
		{"a", true, 1, 0, 0},
		{"b", true, 2, 0, 0},  // the table is full from here
		{"a", false, 2, 1, 0}, // a tracked key: no overflow
		{"c", true, 3, 1, 1},  // untracked, decided by the store
		{"c", false, 3, 2, 2},
	} {
		res, err := l.Allow(ctx, c.key)
		require.NoError(t, err)
		assert.Equal(t, c.allowed, res.Allowed, "step %d", step)
		st := l.Stats()
		assert.Equal(t, c.wantAllowed, st.Allowed, "step %d: Allowed", step)
		assert.Equal(t, c.wantDenied, st.Denied, "step %d: Denied", step)
		assert.Equal(t, c.wantOverflow, st.Overflow, "step %d: Overflow", step)
	}
}
