package hybridlimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// newRaceLimiter returns a limiter of tierCfg with bans after 2 denials,
// in mode (ModeAsync on a memory store, its sync loop running), on a mock
// clock.
func newRaceLimiter(t *testing.T, mode Mode) *Limiter {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(at(10, 0, 0))
	cfg := tierCfg
	cfg.Mode, cfg.Clock = mode, mock
	cfg.Ban = BanPolicy{Denials: 2, For: time.Second}
	if mode != ModeLocal {
		cfg.Store = store.NewMemory(mock)
		cfg.SyncRate = 10 * time.Millisecond
	}
	l, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// Blocks, overrides and their removal racing decisions on the same key:
// each writer sees its own change at once on this node (a key it blocked
// is denied, a key it moved is in the new tier), whatever the others do
// meanwhile; run with -race.
func TestPoliciesRaceDecisions(t *testing.T) {
	for _, mode := range []Mode{ModeLocal, ModeAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			l := newRaceLimiter(t, mode)
			ctx := context.Background()
			const key = "paid-k"
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var decisions atomic.Int64
			deadline := time.Now().Add(5 * time.Second)
			more := func(i int) bool { // at least 200 changes, and 2000 decisions among them
				return i < 200 || decisions.Load() < 2000 && time.Now().Before(deadline)
			}
			fail := func(format string, args ...any) {
				t.Errorf(format, args...)
			}
			wg.Add(2)
			go func() { // blocks and unblocks key; nobody else does
				defer wg.Done()
				for i := 0; more(i); i++ {
					if err := l.Block(ctx, key, 0, "race"); err != nil {
						fail("Block: %v", err)
						return
					}
					res, err := l.Allow(ctx, key)
					if err != nil || !res.Blocked || res.Allowed {
						fail("Allow after Block: %+v, %v", res, err)
						return
					}
					if _, err := l.Unblock(ctx, key); err != nil {
						fail("Unblock: %v", err)
						return
					}
				}
			}()
			go func() { // moves key between tiers; nobody else does
				defer wg.Done()
				for i := 0; more(i); i++ {
					tier := []string{"abusive", "", "paid"}[i%3]
					if err := l.SetOverride(ctx, key, tier, time.Hour); err != nil {
						fail("SetOverride: %v", err)
						return
					}
					res, err := l.Peek(ctx, key)
					if err != nil || res.Tier != tier {
						fail("Peek after SetOverride(%q): %+v, %v", tier, res, err)
						return
					}
					if i%7 == 0 {
						if _, err := l.RemoveOverride(ctx, key); err != nil {
							fail("RemoveOverride: %v", err)
							return
						}
					}
				}
			}()
			var deciders sync.WaitGroup
			for g := 0; g < 4; g++ {
				deciders.Add(1)
				go func() {
					defer deciders.Done()
					var states []RuleState
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						res, err := l.AllowTagged(ctx, key, "tag", 1)
						if err != nil {
							fail("AllowTagged: %v", err)
							return
						}
						if res.Remaining < 0 || res.Remaining > res.Limit {
							fail("Remaining %d outside [0, %d]", res.Remaining, res.Limit)
						}
						if states, err = l.State(ctx, key, states[:0]); err != nil {
							fail("State: %v", err)
							return
						}
						if i%16 == 0 {
							if _, err := l.Contributors(ctx, key); err != nil {
								fail("Contributors: %v", err)
								return
							}
							_ = l.Stats()
						}
						decisions.Add(1)
					}
				}()
			}
			wg.Wait()
			close(stop)
			deciders.Wait()
			t.Logf("%d decisions", decisions.Load())
		})
	}
}

// Close racing every policy method and decisions: each returns ErrClosed
// or succeeds, never panics, and nothing is left running.
func TestPoliciesRaceClose(t *testing.T) {
	for _, mode := range []Mode{ModeLocal, ModeAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			l := newRaceLimiter(t, mode)
			ctx := context.Background()
			calls := []func(key string) error{
				func(k string) error { return l.Block(ctx, k, time.Second, "r") },
				func(k string) error { _, err := l.Unblock(ctx, k); return err },
				func(k string) error { return l.SetOverride(ctx, k, "paid", time.Minute) },
				func(k string) error { _, err := l.RemoveOverride(ctx, k); return err },
				func(k string) error { _, err := l.Overrides(ctx); return err },
				func(k string) error { _, err := l.Blocks(ctx); return err },
				func(k string) error { _, err := l.Contributors(ctx, k); return err },
				func(k string) error { _, err := l.AllowTagged(ctx, k, "t", 1); return err },
				func(k string) error { _, err := l.Peek(ctx, k); return err },
				func(k string) error { _, err := l.State(ctx, k, nil); return err },
			}
			var wg sync.WaitGroup
			for g := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					keys := []string{"a", "paid-b", "c"}
					for i := 0; ; i++ {
						err := calls[g](keys[i%len(keys)])
						if errors.Is(err, ErrClosed) {
							return
						}
						if err != nil {
							t.Errorf("call %d: %v", g, err)
							return
						}
					}
				}()
			}
			time.Sleep(20 * time.Millisecond)
			require.NoError(t, l.Close(ctx))
			wg.Wait()
			for g, call := range calls {
				if err := call("a"); !errors.Is(err, ErrClosed) {
					t.Errorf("call %d after Close: %v, want ErrClosed", g, err)
				}
			}
		})
	}
}
