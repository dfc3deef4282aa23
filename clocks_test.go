package hybridlimit_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// docs/failures.md, "Clocks": a synchronous request's deadline is computed
// on the node's clock plus its measured offset to the store's. With
// Config.ClockSync negative (no offset), a node whose clock is more than
// StoreTimeout/2 behind Redis' sends requests already past their
// deadline: the script applies none, and every decision is Degraded
// (decided by the FailurePolicy, store.ErrDeadline passed to OnError).
// Less than StoreTimeout/2 behind, or with ClockSync on, the decisions
// are made in the store. The node's clock is a mock, set behind the real
// clock that Redis' TIME follows, and standing still.
func TestSynchronousClockBehindStore(t *testing.T) {
	const timeout = time.Second // Config.StoreTimeout: the deadline is 500 ms after the sending
	const n = 10
	c := redistest.Client(t)
	for _, tc := range []struct {
		name      string
		behind    time.Duration
		clockSync time.Duration
		degraded  bool
	}{
		{"no clock sync, behind by StoreTimeout", timeout, -1, true},
		{"no clock sync, behind by 3/4 StoreTimeout", 3 * timeout / 4, -1, true},
		{"no clock sync, behind by StoreTimeout/4", timeout / 4, -1, false},
		{"clock sync, behind by StoreTimeout", timeout, 0, false},
		{"clock sync, behind by an hour", time.Hour, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock := clock.NewMock()
			mock.Set(time.Now().Add(-tc.behind))
			var deadlineErrs, otherErrs atomic.Int64
			pfx := redistest.Prefix(t)
			l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: newRedisStore(t, c),
				Prefix: pfx, StoreTimeout: timeout, Clock: mock, ClockSync: tc.clockSync, Manual: true,
				Rules: []hybridlimit.Rule{{Limit: 1000, Window: time.Hour}},
				OnError: func(err error) {
					if errors.Is(err, store.ErrDeadline) {
						deadlineErrs.Add(1)
					} else {
						otherErrs.Add(1)
					}
				}})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			ctx := context.Background()
			require.NoError(t, l.SyncClock(ctx)) // measures the offset when ClockSync is on; nothing otherwise
			degraded := 0
			for range n {
				res, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed, "FailOpen, far below the limit")
				if res.Degraded {
					degraded++
				}
			}
			ids := hourIDs(mock.Now(), time.Now())
			inStore := stored(t, c, pfx, "k", ids)
			if tc.degraded {
				assert.Equal(t, n, degraded, "every decision degraded")
				assert.Equal(t, int64(n), deadlineErrs.Load(), "OnError got store.ErrDeadline for each")
				assert.Zero(t, inStore, "the script applied no request past its deadline")
			} else {
				assert.Zero(t, degraded, "decisions made in the store")
				assert.Zero(t, deadlineErrs.Load())
				assert.Equal(t, int64(n), inStore)
			}
			assert.Zero(t, otherErrs.Load())
			assert.Equal(t, uint64(degraded), l.Stats().Degraded)
		})
	}
}
