package hybridlimit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// A Sync whose caller gives up (its context canceled or past its deadline,
// before the call or while the store works on it) reports the context's
// error, and tells nothing of the store, nor does a SyncClock on that
// context: the store is not marked failing,
// no store error is counted or passed to OnError, a fail-closed limiter
// goes on deciding every key, and the increments go out at the next Sync,
// counted once.
func TestSyncCallerGivesUp(t *testing.T) {
	for _, c := range []struct {
		name  string
		under bool // the context ends while the push is under way
		ctx   func() (context.Context, context.CancelFunc)
	}{
		{"canceled before", false, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx, cancel
		}},
		{"past its deadline before", false, func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		}},
		{"canceled during the push", true, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 50*time.Millisecond)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mc := clock.NewMock()
			mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			mem := &hungStore{Memory: store.NewMemory(mc)}
			var onError atomic.Int64
			a := failClosedNode(t, hybridlimit.Config{
				Rules:        []hybridlimit.Rule{{Limit: 3, Window: time.Hour}},
				Mode:         hybridlimit.ModeAsync,
				Store:        mem,
				Prefix:       "t",
				Clock:        mc,
				StoreTimeout: 10 * time.Second,
				OnError:      func(error) { onError.Add(1) },
			})
			ctx := context.Background()
			allow := func(key string) hybridlimit.Result {
				t.Helper()
				res, err := a.Allow(ctx, key)
				require.NoError(t, err)
				return res
			}
			require.True(t, allow("k").Allowed)
			require.NoError(t, a.Sync(ctx))
			require.True(t, allow("k").Allowed) // pending

			mem.hung.Store(c.under)
			gone, cancel := c.ctx()
			defer cancel()
			err := a.Sync(gone)
			require.Error(t, err)
			assert.ErrorIs(t, err, gone.Err())
			mem.hung.Store(false)
			assert.ErrorIs(t, a.SyncClock(gone), gone.Err())

			st := a.Stats()
			assert.False(t, st.StoreFailing, "StoreFailing")
			assert.Zero(t, st.SyncErrors, "SyncErrors")
			assert.Zero(t, onError.Load(), "OnError calls")
			for _, key := range []string{"k", "new"} {
				res := allow(key)
				assert.True(t, res.Allowed, "%s allowed", key)
				assert.False(t, res.Degraded, "%s degraded", key)
			}

			// The store holds every admitted request once, whatever became
			// of the push the caller gave up on (in doubt, it goes out first,
			// and the group's new increments at the Sync after).
			require.NoError(t, a.Sync(ctx))
			require.NoError(t, a.Sync(ctx))
			assert.Zero(t, a.Stats().InDoubt, "in doubt after the last Sync")
			id := mc.Now().UnixMilli() / time.Hour.Milliseconds()
			for key, want := range map[string]int64{"k": 3, "new": 1} {
				got := mem.Get("t", store.Counter{Key: key, Window: time.Hour.Milliseconds(), ID: id})
				assert.Equal(t, want, got, "the store's count of %s", key)
			}
		})
	}
}

// A caller whose context ends only after the store has had half of
// StoreTimeout to answer gave up on a store that is failing: a hung store
// is marked failing, whatever the caller's deadline.
func TestSyncCallerGivesUpOnAHungStore(t *testing.T) {
	mem := &hungStore{Memory: store.NewMemory(nil)}
	l := failClosedNode(t, hybridlimit.Config{
		Rules:        []hybridlimit.Rule{{Limit: 3, Window: time.Hour}},
		Mode:         hybridlimit.ModeAsync,
		Store:        mem,
		StoreTimeout: 100 * time.Millisecond,
	})
	ctx := context.Background()
	require.NoError(t, l.Sync(ctx)) // reads the store's clock
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	mem.hung.Store(true)
	late, cancel := context.WithTimeout(ctx, 80*time.Millisecond) // past StoreTimeout/2
	defer cancel()
	require.Error(t, l.Sync(late))
	mem.hung.Store(false)
	assert.True(t, l.Stats().StoreFailing)
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Degraded && !res.Allowed, "FailClosed denies")
}

// After a push the store held past half of StoreTimeout, when the
// caller's context has ended, the cycle does not probe the store on that
// context (the probe would fail without reaching it, mark every group
// failing and report the caller's deadline): only the hung push's group
// fails, and one error is reported.
func TestSyncNoProbeOnTheCallersEndedContext(t *testing.T) {
	mem := store.NewMemory(nil)
	other := "x"
	for i := 0; mem.Group(other) == mem.Group("k"); i++ {
		other = fmt.Sprintf("x%d", i)
	}
	st := &groupHungStore{Memory: mem, group: mem.Group("k")}
	var onError atomic.Int64
	l := failClosedNode(t, hybridlimit.Config{
		Rules:        []hybridlimit.Rule{{Limit: 3, Window: time.Hour}},
		Mode:         hybridlimit.ModeAsync,
		Store:        st,
		StoreTimeout: 100 * time.Millisecond,
		OnError:      func(error) { onError.Add(1) },
	})
	ctx := context.Background()
	require.NoError(t, l.Sync(ctx)) // reads the store's clock
	_, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	late, cancel := context.WithTimeout(ctx, 80*time.Millisecond) // past StoreTimeout/2, within StoreTimeout
	defer cancel()
	require.Error(t, l.Sync(late))
	res, err := l.Allow(ctx, other)
	require.NoError(t, err)
	assert.True(t, res.Allowed, "a key of a group the store serves")
	assert.Equal(t, int64(1), onError.Load(), "the hung push's error only")
}

// groupHungStore is a memory store that never answers a push carrying a
// batch of group: it waits until its context ends, in doubt.
type groupHungStore struct {
	*store.Memory
	group int
}

func (s *groupHungStore) Push(ctx context.Context, bs []*store.Batch) error {
	for _, b := range bs {
		if b.Group == s.group {
			<-ctx.Done()
			for _, b := range bs {
				b.Status, b.Err = store.InDoubt, ctx.Err()
			}
			return nil
		}
	}
	return s.Memory.Push(ctx, bs)
}

// failClosedNode returns a limiter on cfg, made Manual and FailClosed,
// closed (within a second) when the test ends.
func failClosedNode(t *testing.T, cfg hybridlimit.Config) *hybridlimit.Limiter {
	t.Helper()
	cfg.FailurePolicy, cfg.Manual = hybridlimit.FailClosed, true
	l, err := hybridlimit.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l
}
