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

// WaitN with a context already done returns its error at once and
// consumes nothing, in every mode, as golang.org/x/time/rate's WaitN does.
func TestWaitNWithAContextDoneConsumesNothing(t *testing.T) {
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync, hybridlimit.ModeSynchronous} {
		t.Run(mode.String(), func(t *testing.T) {
			mock := clock.NewMock()
			mock.Set(time.Now().Truncate(time.Hour))
			cfg := hybridlimit.Config{
				Rules: []hybridlimit.Rule{{Limit: 10, Window: time.Minute}},
				Mode:  mode, Clock: mock, Manual: true, ClockSync: -1,
			}
			if mode != hybridlimit.ModeLocal {
				cfg.Store = store.NewMemory(mock)
			}
			l, err := hybridlimit.New(cfg)
			require.NoError(t, err)
			defer func() { _ = l.Close(context.Background()) }()
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err = l.WaitN(ctx, "k", 3)
			require.ErrorIs(t, err, context.Canceled)
			res, err := l.Peek(context.Background(), "k")
			require.NoError(t, err)
			assert.Equal(t, int64(10), res.Remaining, "nothing consumed")
			assert.Zero(t, l.Stats().Allowed+l.Stats().Denied)
		})
	}
}
