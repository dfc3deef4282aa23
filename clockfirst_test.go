package hybridlimit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A synchronous node decides nothing at its own instant before it has read
// the store's clock: its first decision reads it first (Manual: nothing
// else does). Node a, on the store's time, spends a Fixed hour's limit;
// node b, whose clock is in the next hour or the one before, is denied
// from its first request, by the store (not Degraded), in the same
// window. Decided at b's own instant, its requests would go to the next
// hour's counter (admitted) or past their deadline (degraded).
func TestSynchronousFirstDecisionReadsTheClock(t *testing.T) {
	c := redistest.Client(t)
	storeNow := func() time.Time {
		now, err := c.Time(context.Background()).Result()
		require.NoError(t, err)
		return now
	}
	for _, ahead := range []bool{true, false} {
		t.Run(fmt.Sprintf("ahead=%v", ahead), func(t *testing.T) {
			now := storeNow()
			if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 5*time.Second {
				time.Sleep(left + 100*time.Millisecond) // the test's decisions in one hour
				now = storeNow()
			}
			start := now.Truncate(time.Hour)
			off := -(now.Sub(start) + 30*time.Minute) // b in the hour before
			if ahead {
				off = start.Add(time.Hour + 30*time.Minute).Sub(now) // b in the next hour
			}
			pfx := redistest.Prefix(t)
			node := func(clk clock.Clock) *hybridlimit.Limiter {
				return failClosedNode(t, hybridlimit.Config{
					Rules:  []hybridlimit.Rule{{Limit: 5, Window: time.Hour, Type: hybridlimit.Fixed}},
					Mode:   hybridlimit.ModeSynchronous,
					Store:  newRedisStore(t, c),
					Prefix: pfx,
					Clock:  clk,
				})
			}
			ma, mb := clock.NewMock(), clock.NewMock()
			ma.Set(now)
			mb.Set(now.Add(off))
			a, b := node(ma), node(mb)
			ctx := context.Background()
			for i := range 5 {
				res, err := a.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed, "a's request %d", i)
			}
			for i := range 3 {
				res, err := b.Allow(ctx, "k")
				require.NoError(t, err)
				assert.False(t, res.Allowed, "b's request %d: the hour's limit is spent", i)
				assert.False(t, res.Degraded, "b's request %d: decided by the store", i)
			}
			assert.InDelta(t, float64(-off), float64(b.Stats().ClockOffset), float64(time.Minute))
		})
	}
}

// A node started while its store does not answer reads the store's clock
// again at every sync cycle, not only after ClockSync, and pushes nothing
// meanwhile (the store counts as failing: a FailClosed node denies). Once
// the store answers, the offset is known within a few cycles.
func TestAsyncClockReadAgainAfterAStartupOutage(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	p.Down()
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:         []hybridlimit.Rule{{Limit: 100, Window: time.Hour}},
		Mode:          hybridlimit.ModeAsync,
		Store:         newRedisStore(t, c),
		Prefix:        redistest.Prefix(t),
		FailurePolicy: hybridlimit.FailClosed,
		Clock:         aheadClock{clock.New(), time.Hour},
		SyncRate:      20 * time.Millisecond,
		StoreTimeout:  100 * time.Millisecond,
		ClockSync:     time.Hour, // the default retries after 10s; this one after an hour
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	require.Eventually(t, func() bool { return l.Stats().StoreFailing }, 5*time.Second, 5*time.Millisecond,
		"the failed first reading marks the store failing")
	res, err := l.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Degraded && !res.Allowed, "FailClosed denies while the clock is unknown")
	assert.Zero(t, l.Stats().KeysPushed, "nothing pushed on a guessed clock")

	p.Up()
	require.Eventually(t, func() bool {
		d := l.Stats().ClockOffset + time.Hour
		return d > -time.Minute && d < time.Minute
	}, 5*time.Second, 5*time.Millisecond, "the offset is read again once the store answers")
	require.Eventually(t, func() bool { return !l.Stats().StoreFailing }, 5*time.Second, 5*time.Millisecond)
	res, err = l.Allow(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed && !res.Degraded)
}

// aheadClock is the real clock d ahead.
type aheadClock struct {
	clock.Clock
	d time.Duration
}

func (c aheadClock) Now() time.Time                  { return c.Clock.Now().Add(c.d) }
func (c aheadClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c aheadClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// While the first read of the store's clock hangs, concurrent synchronous
// decisions share one read rather than queueing a read each behind it,
// and a decision whose context ends returns at once with its error: the
// store has not decided (FailClosed: denied, Degraded).
func TestSynchronousFirstClockReadIsShared(t *testing.T) {
	st := &clockHungStore{Memory: store.NewMemory(nil)}
	l := failClosedNode(t, hybridlimit.Config{
		Rules:        []hybridlimit.Rule{{Limit: 5, Window: time.Hour}},
		Mode:         hybridlimit.ModeSynchronous,
		Store:        st,
		StoreTimeout: 200 * time.Millisecond,
	})
	const callers = 10
	results := make(chan hybridlimit.Result, callers)
	for range callers {
		go func() {
			res, err := l.Allow(context.Background(), "k")
			assert.NoError(t, err)
			results <- res
		}()
	}
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := l.Allow(short, "k")
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	for range callers {
		res := <-results
		assert.True(t, res.Degraded && !res.Allowed, "FailClosed, the clock unknown")
	}
	assert.Less(t, st.reads.Load(), int64(callers), "the callers shared reads")
}

// clockHungStore is a memory store whose clock never answers: each read
// waits until its context ends.
type clockHungStore struct {
	*store.Memory
	reads atomic.Int64
}

func (s *clockHungStore) Time(ctx context.Context) (time.Time, error) {
	s.reads.Add(1)
	<-ctx.Done()
	return time.Time{}, ctx.Err()
}

// A first clock read a decision started ends with Close: no store error
// is reported once Close has returned.
func TestFirstClockReadEndsWithClose(t *testing.T) {
	st := &clockHungStore{Memory: store.NewMemory(nil)}
	var onError atomic.Int64
	l := failClosedNode(t, hybridlimit.Config{
		Rules:        []hybridlimit.Rule{{Limit: 5, Window: time.Hour}},
		Mode:         hybridlimit.ModeSynchronous,
		Store:        st,
		StoreTimeout: 300 * time.Millisecond,
		OnError:      func(error) { onError.Add(1) },
	})
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err := l.Allow(short, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, l.Close(context.Background()))
	atClose := onError.Load()
	time.Sleep(500 * time.Millisecond) // past the read's StoreTimeout
	assert.Equal(t, atClose, onError.Load(), "OnError after Close returned")
}
