package hybridlimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hybridlimit/hybridlimit/store"
)

// No public method reaches a key table with an empty key: the table's
// removed slots hold an entry whose key is empty (local.Table's tomb).
func TestEmptyKeyNeverReachesTheTable(t *testing.T) {
	for _, mode := range []Mode{ModeLocal, ModeAsync, ModeSynchronous} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := Config{Mode: mode, Rules: []Rule{{Limit: 5, Window: time.Second}, {Limit: 2, Window: time.Second, Type: TokenBucket}}}
			if mode != ModeLocal {
				cfg.Store = store.NewMemory(nil)
			}
			l, _ := newMockLimiter(t, cfg)
			ctx := t.Context()
			calls := map[string]func() error{
				"Allow":  func() error { _, err := l.Allow(ctx, ""); return err },
				"AllowN": func() error { _, err := l.AllowN(ctx, "", 2); return err },
				"Peek":   func() error { _, err := l.Peek(ctx, ""); return err },
				"PeekN":  func() error { _, err := l.PeekN(ctx, "", 2); return err },
				"Wait":   func() error { _, err := l.Wait(ctx, ""); return err },
				"WaitN":  func() error { _, err := l.WaitN(ctx, "", 2); return err },
				"State":  func() error { _, err := l.State(ctx, "", nil); return err },
			}
			for name, call := range calls {
				assert.ErrorIs(t, call(), ErrEmptyKey, name)
			}
			assert.Zero(t, l.def.table.Len(), "an empty key was tracked")
		})
	}
}
