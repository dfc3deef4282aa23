package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// A counter keeps the increments of one window older than the previous
// one until a sync takes them. With windows at least a sync period long
// (New refuses shorter ones in ModeAsync), a loop that keeps its rate
// drops nothing, whatever instant of the window its cycles fall on:
// every admitted request reaches the store, in its window.
func TestAsyncWindowOfOneSyncPeriodDropsNothing(t *testing.T) {
	const rate = 100 * time.Millisecond
	for _, typ := range []Algorithm{Sliding, Fixed} {
		for _, phase := range []time.Duration{0, time.Millisecond, rate/2 - time.Millisecond, rate / 2, rate - time.Millisecond} {
			ctx := context.Background()
			// stepClock: clock.Mock's Add sleeps a millisecond each time.
			mock := &stepClock{Mock: clock.NewMock()}
			mock.Set(t0)
			mem := store.NewMemory(mock)
			l, err := New(Config{Rules: []Rule{{Limit: 1000, Window: rate, Type: typ}}, Mode: ModeAsync, Store: mem, SyncRate: rate, Clock: mock, Manual: true, ClockSync: -1})
			require.NoError(t, err)
			admitted := map[int64]int64{}
			for ms := range 1000 { // ten windows, a decision every millisecond
				if time.Duration(ms)*time.Millisecond%rate == phase {
					require.NoError(t, l.Sync(ctx))
				}
				res, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed)
				admitted[mock.Now().UnixMilli()/rate.Milliseconds()]++
				mock.Add(time.Millisecond)
			}
			require.NoError(t, l.Close(ctx))
			require.Zero(t, l.Stats().Dropped, "%v, cycles at %v", typ, phase)
			for id, n := range admitted {
				require.Equal(t, n, mem.Get(DefaultPrefix, store.Counter{Key: "k", Window: rate.Milliseconds(), ID: id}), "%v, cycles at %v: window %d", typ, phase, id)
			}
		}
	}
}
