package hybridlimit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
)

// A WaitN waiting out a block, or its tier's limit, decides again when
// this node's policies change: Unblock, SetOverride into a tier that
// admits the request, RemoveOverride back to one that does. The mock clock
// stands still: without the change, the wait (an hour, or a block's
// forever) would not end.
func TestWaitNDecidesAgainWhenPoliciesChange(t *testing.T) {
	for _, c := range []struct {
		name   string
		before func(ctx context.Context, l *hybridlimit.Limiter) error // holds the key back
		change func(ctx context.Context, l *hybridlimit.Limiter) error // lets it through
		tier   string                                                  // of the admitting decision
	}{
		{"Unblock",
			func(ctx context.Context, l *hybridlimit.Limiter) error { return l.Block(ctx, "k", 0, "abuse") },
			func(ctx context.Context, l *hybridlimit.Limiter) error { _, err := l.Unblock(ctx, "k"); return err },
			""},
		{"SetOverride",
			func(ctx context.Context, l *hybridlimit.Limiter) error { _, err := l.Allow(ctx, "k"); return err },
			func(ctx context.Context, l *hybridlimit.Limiter) error { return l.SetOverride(ctx, "k", "big", 0) },
			"big"},
		{"RemoveOverride",
			func(ctx context.Context, l *hybridlimit.Limiter) error {
				if err := l.SetOverride(ctx, "k", "small", 0); err != nil {
					return err
				}
				_, err := l.Allow(ctx, "k")
				return err
			},
			func(ctx context.Context, l *hybridlimit.Limiter) error {
				_, err := l.RemoveOverride(ctx, "k")
				return err
			},
			""},
	} {
		t.Run(c.name, func(t *testing.T) {
			mc := clock.NewMock()
			mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			l, err := hybridlimit.New(hybridlimit.Config{
				Rules: []hybridlimit.Rule{{Limit: 1, Window: time.Hour}},
				Tiers: map[string][]hybridlimit.Rule{
					"big":   {{Limit: 10, Window: time.Hour}},
					"small": {{Limit: 1, Window: time.Hour}},
				},
				Clock:  mc,
				Manual: true,
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			ctx := context.Background()
			require.NoError(t, c.before(ctx, l))
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "held back before the change")
			if c.name == "RemoveOverride" {
				// The default tier has counted nothing of k: its own count
				// went to "small".
				_, err = l.Allow(ctx, "other")
				require.NoError(t, err)
			}

			type waited struct {
				res hybridlimit.Result
				err error
			}
			done := make(chan waited, 1)
			go func() {
				res, err := l.Wait(ctx, "k")
				done <- waited{res, err}
			}()
			time.Sleep(20 * time.Millisecond) // the waiter most likely asleep by now; if not, it finds the change
			require.NoError(t, c.change(ctx, l))
			select {
			case w := <-done:
				require.NoError(t, w.err)
				assert.True(t, w.res.Allowed)
				assert.Equal(t, c.tier, w.res.Tier)
			case <-time.After(10 * time.Second):
				t.Fatal("Wait did not decide again after the change")
			}
		})
	}
}

// WaitN names itself in its input errors.
func TestWaitNInputErrorsNameWaitN(t *testing.T) {
	l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{{Limit: 5, Window: time.Second}}, Manual: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	_, err = l.WaitN(context.Background(), "k", 0)
	assert.ErrorIs(t, err, hybridlimit.ErrCost)
	assert.ErrorContains(t, err, "WaitN(n=0)")
	_, err = l.WaitN(context.Background(), "k", 6)
	assert.ErrorContains(t, err, "WaitN(n=6)")
}

// Policy changes of other keys wake a wait, which then only looks: the
// waiting key's denials stay one, and Config.Ban (at 3) never blocks it.
func TestWaitNUnrelatedPolicyChangesCountNothing(t *testing.T) {
	mc := clock.NewMock()
	mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 1, Window: time.Hour}},
		Tiers:  map[string][]hybridlimit.Rule{"big": {{Limit: 10, Window: time.Hour}}},
		Ban:    hybridlimit.BanPolicy{Denials: 3, Within: time.Hour},
		Clock:  mc,
		Manual: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	res, err := l.Allow(ctx, "victim")
	require.NoError(t, err)
	require.True(t, res.Allowed)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := l.Wait(wctx, "victim") // denied once, then waits the hour
		done <- err
	}()
	for i := range 6 {
		time.Sleep(20 * time.Millisecond)
		require.NoError(t, l.SetOverride(ctx, fmt.Sprintf("other-%d", i), "big", 0))
	}
	time.Sleep(20 * time.Millisecond)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	res, err = l.Peek(ctx, "victim")
	require.NoError(t, err)
	assert.False(t, res.Blocked, "banned by denials the changes made")
	assert.Equal(t, uint64(1), l.Stats().Denied, "the wait's one denial")
}

// A wait woken by a change that moves its key into a tier where the cost
// can never be admitted returns WaitN's input error.
func TestWaitNWokenInputErrorNamesWaitN(t *testing.T) {
	mc := clock.NewMock()
	mc.Set(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:  []hybridlimit.Rule{{Limit: 5, Window: time.Hour}},
		Tiers:  map[string][]hybridlimit.Rule{"small": {{Limit: 2, Window: time.Hour}}},
		Clock:  mc,
		Manual: true,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	for range 5 {
		_, err := l.Allow(ctx, "k")
		require.NoError(t, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.WaitN(ctx, "k", 3)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, l.SetOverride(ctx, "k", "small", 0))
	select {
	case err := <-done:
		assert.ErrorIs(t, err, hybridlimit.ErrCost)
		assert.ErrorContains(t, err, "WaitN(n=3)")
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not wake")
	}
}
