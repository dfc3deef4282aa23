package prom_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/prom"
	"github.com/hybridlimit/hybridlimit/store"
)

// downStore is a memory store whose calls fail while down is set.
type downStore struct {
	store.Store
	down atomic.Bool
}

var errDown = errors.New("down")

func (s *downStore) Push(ctx context.Context, bs []*store.Batch) error {
	if s.down.Load() {
		return errDown
	}
	return s.Store.Push(ctx, bs)
}

func (s *downStore) Take(ctx context.Context, rs []*store.TakeRequest) error {
	if s.down.Load() {
		return errDown
	}
	return s.Store.Take(ctx, rs)
}

func (s *downStore) Time(ctx context.Context) (time.Time, error) {
	if s.down.Load() {
		return time.Time{}, errDown
	}
	return s.Store.Time(ctx)
}

// Every counter and gauge the collector exports is its Stats field, in
// each mode, after decisions, a full table, failed store calls and syncs.
func TestMetricsAreStats(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync, hybridlimit.ModeSynchronous} {
		mc := clock.NewMock()
		mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
		ds := &downStore{Store: store.NewMemory(mc)}
		cfg := hybridlimit.Config{
			Rules: []hybridlimit.Rule{{Limit: 2, Window: time.Minute}}, Mode: mode,
			MaxKeys: 2, Clock: mc, Manual: true,
		}
		if mode != hybridlimit.ModeLocal {
			cfg.Store = ds
		}
		l, c, err := prom.NewLimiter(cfg, prom.Options{})
		require.NoError(t, err)
		for _, key := range []string{"a", "a", "a", "b", "c"} {
			_, err := l.Allow(ctx, key)
			require.NoError(t, err)
		}
		_ = l.Sync(ctx)
		ds.down.Store(true)
		_, _ = l.Allow(ctx, "a")
		_, _ = l.Allow(ctx, "b")
		_ = l.Sync(ctx)
		_ = l.SyncClock(ctx)
		ds.down.Store(false)

		s := l.Stats()
		if mode != hybridlimit.ModeLocal {
			assert.NotZero(t, s.SyncErrors, "%v: SyncErrors", mode)
			assert.NotZero(t, s.StoreCalls, "%v: StoreCalls", mode)
		}
		assert.Equal(t, uint64(1), s.Overflow, "%v: Overflow", mode)
		for name, want := range map[string]float64{
			"hybridlimit_degraded_decisions_total":   float64(s.Degraded),
			"hybridlimit_overflow_decisions_total":   float64(s.Overflow),
			"hybridlimit_blocked_decisions_total":    float64(s.Blocked),
			"hybridlimit_keys":                       float64(s.Keys),
			"hybridlimit_evicted_keys_total":         float64(s.Evicted),
			"hybridlimit_pending_increments":         float64(s.Pending),
			"hybridlimit_dropped_increments_total":   float64(s.Dropped),
			"hybridlimit_sync_cycles_total":          float64(s.SyncCycles),
			"hybridlimit_store_errors_total":         float64(s.SyncErrors),
			"hybridlimit_store_calls_total":          float64(s.StoreCalls),
			"hybridlimit_sync_ops_total":             float64(s.KeysPushed),
			"hybridlimit_last_sync_duration_seconds": s.LastSyncLatency.Seconds(),
			"hybridlimit_clock_offset_seconds":       s.ClockOffset.Seconds(),
			"hybridlimit_sync_cycle_keys":            float64(s.SyncCycleKeys),
			"hybridlimit_sync_batches_in_doubt":      float64(s.InDoubt),
		} {
			assert.Equal(t, want, value(t, c, name), "%v: %s", mode, name)
		}
		reg := prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		got := decisions(t, reg)
		assert.Equal(t, float64(s.Allowed), got["decision=allowed"], "%v: allowed", mode)
		assert.Equal(t, float64(s.Denied), got["decision=denied"], "%v: denied", mode)
		_ = l.Close(ctx)
	}
}
