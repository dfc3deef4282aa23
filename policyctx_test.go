package hybridlimit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// endsAfterWrite is a context that ends right after its first Err: a
// memory store's write sees it live, and the reload that follows sees it
// ended, as when a caller's deadline passes between the two.
type endsAfterWrite struct {
	context.Context
	once sync.Once
	done chan struct{}
	errs atomic.Int32
}

func newEndsAfterWrite() *endsAfterWrite {
	return &endsAfterWrite{Context: context.Background(), done: make(chan struct{})}
}

func (c *endsAfterWrite) Err() error {
	if c.errs.Add(1) == 1 {
		return nil
	}
	c.once.Do(func() { close(c.done) })
	return context.Canceled
}

func (c *endsAfterWrite) Done() <-chan struct{} { return c.done }

// A policy change whose store write succeeded returns nil even when the
// caller's context ends before the node reloads the policies: the change
// is stored. In ModeLocal the node applies it at once all the same (its
// store is its memory); in the store modes it applies it at its next
// check (here Sync); the caller's context ending is no store error, so
// OnError is not called.
func TestPolicyChangeStoredBeforeTheContextEnds(t *testing.T) {
	ctx := context.Background()
	change := map[string]func(l *Limiter, ctx context.Context) error{
		"Block": func(l *Limiter, ctx context.Context) error { return l.Block(ctx, "k", time.Hour, "r") },
		"SetOverride": func(l *Limiter, ctx context.Context) error {
			return l.SetOverride(ctx, "k", "abusive", time.Hour)
		},
		"Unblock": func(l *Limiter, ctx context.Context) error {
			if err := l.Block(context.Background(), "k", time.Hour, "r"); err != nil {
				return err
			}
			ok, err := l.Unblock(ctx, "k")
			if err == nil && !ok {
				err = errors.New("Unblock: no block")
			}
			return err
		},
	}
	// applied reports whether the change shows in a decision of "k".
	applied := func(t *testing.T, l *Limiter, name string) bool {
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		switch name {
		case "Block":
			return res.Blocked
		case "SetOverride":
			return res.Tier == "abusive"
		}
		return !res.Blocked
	}
	for _, mode := range []Mode{ModeLocal, ModeAsync} {
		for name, do := range change {
			t.Run(mode.String()+"/"+name, func(t *testing.T) {
				var reported atomic.Value
				cfg := tierCfg
				cfg.Mode, cfg.Manual = mode, true
				cfg.OnError = func(err error) { reported.Store(err) }
				if mode != ModeLocal {
					cfg.Store = store.NewMemory(nil)
				}
				l, err := New(cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				require.NoError(t, do(l, newEndsAfterWrite()))
				if mode == ModeLocal {
					assert.True(t, applied(t, l, name), "applied at once")
					return
				}
				assert.Nil(t, reported.Load(), "the caller's context is no store error")
				require.NoError(t, l.Sync(ctx))
				assert.True(t, applied(t, l, name), "applied at the next check")
			})
		}
	}
}

// failingReads is a memory store whose policy reads fail while fail is set.
type failingReads struct {
	*store.Memory
	fail *atomic.Bool
}

func (s failingReads) Policies(ctx context.Context, prefix string) (uint64, []store.Policy, error) {
	if s.fail.Load() {
		return 0, nil, errors.New("reads fail")
	}
	return s.Memory.Policies(ctx, prefix)
}

// A change stored while the store fails the reload that follows returns
// nil too; the reload's error goes to OnError, and the node applies the
// change at its next check once the store answers.
func TestPolicyChangeStoredThenReloadFails(t *testing.T) {
	ctx := context.Background()
	var reported atomic.Value
	fail := new(atomic.Bool)
	cfg := tierCfg
	cfg.Mode, cfg.Manual, cfg.Store = ModeAsync, true, failingReads{store.NewMemory(nil), fail}
	cfg.OnError = func(err error) { reported.Store(err) }
	l, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	fail.Store(true)
	require.NoError(t, l.Block(ctx, "k", time.Hour, "r"))
	err, _ = reported.Load().(error)
	assert.ErrorContains(t, err, "reads fail")
	res, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Blocked, "not reloaded yet")
	fail.Store(false)
	require.NoError(t, l.Sync(ctx))
	res, err = l.Peek(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Blocked, "applied at the next check")
}
