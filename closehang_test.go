package hybridlimit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// hungPolicies is a memory store whose policy reads wait until their
// context ends, like a hung Redis.
type hungPolicies struct {
	*store.Memory
	calls chan struct{}
}

func (s hungPolicies) PolicyVersion(ctx context.Context, prefix string) (uint64, error) {
	select {
	case s.calls <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return 0, ctx.Err()
}

// Close ends within its context even while the background reload of the
// policies waits on a store that does not answer: Close stops the reload
// rather than waiting up to StoreTimeout (here a minute) for it.
func TestCloseStopsAPolicyReloadUnderWay(t *testing.T) {
	st := hungPolicies{Memory: store.NewMemory(nil), calls: make(chan struct{}, 1)}
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeAsync, Store: st, SyncRate: 5 * time.Millisecond,
		StoreTimeout: time.Minute, Rules: []hybridlimit.Rule{{Limit: 10, Window: time.Hour}}})
	require.NoError(t, err)
	select {
	case <-st.calls: // a reload is under way
	case <-time.After(10 * time.Second):
		t.Fatal("no policy reload")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.NoError(t, l.Close(ctx))
	assert.Less(t, time.Since(start), 5*time.Second, "Close waited for the policy reload")
}

// hungStore is a memory store that, once hung, answers no Push or Take:
// each waits until its context ends and is then in doubt.
type hungStore struct {
	*store.Memory
	hung atomic.Bool
}

func (s *hungStore) Push(ctx context.Context, bs []*store.Batch) error {
	if !s.hung.Load() {
		return s.Memory.Push(ctx, bs)
	}
	<-ctx.Done()
	for _, b := range bs {
		b.Status, b.Err = store.InDoubt, ctx.Err()
	}
	return nil
}

func (s *hungStore) Take(ctx context.Context, rs []*store.TakeRequest) error {
	if !s.hung.Load() {
		return s.Memory.Take(ctx, rs)
	}
	<-ctx.Done()
	for _, r := range rs {
		r.Status, r.Err = store.InDoubt, ctx.Err()
	}
	return nil
}

// A synchronous FailClosed limiter counts nothing on its own: when the
// store stops answering, Close has nothing to push and returns nil. (The
// final flush also reads the counters of the keys decided, with pushes of
// zero; such a read left in doubt made Close report "0 increments (per rule) of 0
// keys may not have reached the store".)
func TestCloseWithOnlyReadsInDoubtIsNil(t *testing.T) {
	st := &hungStore{Memory: store.NewMemory(nil)}
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, FailurePolicy: hybridlimit.FailClosed,
		Store: st, StoreTimeout: 100 * time.Millisecond, Rules: []hybridlimit.Rule{{Limit: 10, Window: time.Hour}}})
	require.NoError(t, err)
	ctx := context.Background()
	for range 3 {
		res, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed && !res.Degraded)
	}
	st.hung.Store(true)
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, !res.Allowed && res.Degraded, "FailClosed denies while the store hangs")
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	assert.NoError(t, l.Close(cctx), "the store lacks nothing")
}
