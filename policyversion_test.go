package hybridlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
)

// A Redis server restarted without persistence (or flushed) loses the
// policies and their version counter. A node that cached the policies at
// some version must still see the changes made after the loss, even when
// as many changes were made as its cached version: the version after the
// loss never equals one handed out before it. Deleting the prefix's keys
// is what such a restart does to them.
func TestPoliciesReloadAfterStoreLoss(t *testing.T) {
	for _, changes := range []int{1, 3} {
		t.Run(fmt.Sprintf("changes=%d", changes), func(t *testing.T) {
			mock := &stepClock{Mock: clock.NewMock()}
			mock.Set(time.Now())
			c := redistest.Client(t)
			pfx := redistest.Prefix(t)
			var nodes []*Limiter
			for range 2 {
				cfg := tierCfg
				cfg.Mode, cfg.Store, cfg.Prefix, cfg.Clock, cfg.Manual, cfg.ClockSync = ModeAsync, storetest.Redis(t, c), pfx, mock, true, -1
				l, err := New(cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				nodes = append(nodes, l)
			}
			writer, reader := nodes[0], nodes[1]
			ctx := context.Background()
			for i := range changes {
				require.NoError(t, writer.Block(ctx, "old", time.Hour, "before "+string(rune('a'+i))))
			}
			require.NoError(t, reader.Sync(ctx))
			res, err := reader.Allow(ctx, "old")
			require.NoError(t, err)
			require.True(t, res.Blocked, "the block reached the reader")

			keys, err := c.Keys(ctx, pfx+"*").Result()
			require.NoError(t, err)
			require.NotEmpty(t, keys)
			require.NoError(t, c.Del(ctx, keys...).Err())

			for i := range changes {
				require.NoError(t, writer.Block(ctx, "new", time.Hour, "after "+string(rune('a'+i))))
			}
			require.NoError(t, reader.Sync(ctx))
			res, err = reader.Allow(ctx, "old")
			require.NoError(t, err)
			assert.False(t, res.Blocked, "a block lost with the store still denies")
			res, err = reader.Allow(ctx, "new")
			require.NoError(t, err)
			assert.True(t, res.Blocked, "a block set after the loss is not applied")
		})
	}
}
