package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A block set for d at any instant, on or between milliseconds, holds
// until exactly d has passed (rounded up to the store's millisecond) and
// no longer: checked one nanosecond before its end, at it and after it.
// An override's ttl ends the same way.
func TestPolicyEndsAtItsInstant(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		set  time.Time     // when the policy is set
		d    time.Duration // its length
		end  time.Time     // the first instant it no longer holds
	}{
		{"on a millisecond", at(10, 0, 0), 90 * time.Second, at(10, 1, 30)},
		{"between milliseconds", at(10, 0, 0).Add(500 * time.Microsecond), time.Millisecond, at(10, 0, 0).Add(2 * time.Millisecond)},
		{"one nanosecond past a millisecond", at(10, 0, 0).Add(1), time.Second, at(10, 0, 1).Add(time.Millisecond)},
		{"sub-millisecond length", at(10, 0, 0).Add(100 * time.Microsecond), time.Nanosecond, at(10, 0, 0).Add(time.Millisecond)},
		{"sub-millisecond length on a millisecond", at(10, 0, 0), 300 * time.Microsecond, at(10, 0, 0).Add(time.Millisecond)},
		{"at the Unix epoch", time.Unix(0, 0), 500 * time.Microsecond, time.Unix(0, int64(time.Millisecond))},
		{"MaxWindow", at(10, 0, 0).Add(1), MaxWindow, at(10, 0, 0).Add(MaxWindow + time.Millisecond)},
	} {
		t.Run(c.name, func(t *testing.T) {
			l, mock := newTiered(t, BanPolicy{})
			mock.Set(c.set)
			require.NoError(t, l.Block(ctx, "k", c.d, "test"))
			require.NoError(t, l.SetOverride(ctx, "o", "abusive", c.d))
			for _, s := range []struct {
				at      time.Time
				holds   bool
				retryAt time.Duration // RetryAfter while blocked
			}{
				{c.set, true, c.end.Sub(c.set)},
				{c.end.Add(-1), true, time.Millisecond},
				{c.end, false, 0},
				{c.end.Add(1), false, 0},
			} {
				if s.at.Before(c.set) {
					continue
				}
				mock.Set(s.at)
				res, err := l.Peek(ctx, "k")
				require.NoError(t, err)
				assert.Equal(t, s.holds, res.Blocked, "block at set%+v", s.at.Sub(c.set))
				if s.holds {
					assert.Equal(t, max(s.retryAt, time.Millisecond), res.RetryAfter, "RetryAfter at set%+v", s.at.Sub(c.set))
					assert.GreaterOrEqual(t, s.at.Add(res.RetryAfter), c.set.Add(c.d), "RetryAfter points before the block's end")
				}
				res, err = l.Peek(ctx, "o")
				require.NoError(t, err)
				want := ""
				if s.holds {
					want = "abusive"
				}
				assert.Equal(t, want, res.Tier, "override at set%+v", s.at.Sub(c.set))
			}
		})
	}
}

// A ban triggered between milliseconds lasts at least For, as a block does.
func TestBanLastsAtLeastFor(t *testing.T) {
	ctx := context.Background()
	l, mock := newTiered(t, BanPolicy{Denials: 1, For: time.Second})
	start := at(10, 0, 0).Add(700 * time.Microsecond)
	mock.Set(start)
	assert.Equal(t, 3, admitted(t, l, "k", 4), "the fourth request is denied and bans the key")
	for _, c := range []struct {
		at      time.Time
		blocked bool
	}{
		{start, true},
		{start.Add(time.Second - 1), true},
		{start.Add(time.Second + time.Millisecond), false},
	} {
		mock.Set(c.at)
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, c.blocked, res.Blocked, "at start%+v", c.at.Sub(start))
		if res.Blocked {
			assert.GreaterOrEqual(t, c.at.Add(res.RetryAfter), start.Add(time.Second), "RetryAfter at start%+v", c.at.Sub(start))
		}
	}
}

// Forget at its bounds: with 1ms, a ban starting at the instant the last
// one ended doubles it, one starting after that instant (which the store
// counts from the next millisecond) does not; with MaxWindow and For = Max = MaxWindow,
// the arithmetic stays in range.
func TestBanForgetBounds(t *testing.T) {
	ctx := context.Background()
	offend := func(t *testing.T, l *Limiter, mock *stepClock, now time.Time) time.Duration {
		t.Helper()
		mock.Set(now)
		admitted(t, l, "k", 4) // the free tier admits 3 a minute: a denial
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Blocked, "banned at %v", now)
		return res.RetryAfter
	}
	t.Run("1ms", func(t *testing.T) {
		l, mock := newTiered(t, BanPolicy{Denials: 1, For: time.Second, Max: time.Hour, Forget: time.Millisecond})
		start := at(10, 0, 0)
		assert.Equal(t, time.Second, offend(t, l, mock, start))
		end := start.Add(time.Second)
		assert.Equal(t, 2*time.Second, offend(t, l, mock, end), "at the last end: within Forget")
		end = end.Add(2 * time.Second)
		assert.Equal(t, time.Second+time.Millisecond-1, offend(t, l, mock, end.Add(1)), "Forget passed (the ban starts at the next millisecond)")
	})
	t.Run("1ns", func(t *testing.T) {
		l, mock := newTiered(t, BanPolicy{Denials: 1, For: time.Second, Max: time.Hour, Forget: time.Nanosecond})
		start := at(10, 0, 0)
		assert.Equal(t, time.Second, offend(t, l, mock, start))
		assert.Equal(t, time.Second, offend(t, l, mock, start.Add(time.Second)), "never doubles")
	})
	t.Run("MaxWindow", func(t *testing.T) {
		l, mock := newTiered(t, BanPolicy{Denials: 1, For: MaxWindow, Max: MaxWindow, Forget: MaxWindow})
		start := at(10, 0, 0)
		assert.Equal(t, MaxWindow, offend(t, l, mock, start))
		assert.Equal(t, MaxWindow, offend(t, l, mock, start.Add(MaxWindow)), "doubled, capped at Max")
		bs, err := l.Blocks(ctx)
		require.NoError(t, err)
		require.Len(t, bs, 1)
		assert.Equal(t, 2, bs[0].Strikes)
		assert.Equal(t, start.Add(2*MaxWindow), bs[0].Until)
	})
	t.Run("0 is the default", func(t *testing.T) {
		cfg := tierCfg
		cfg.Ban = BanPolicy{Denials: 1}
		checked, err := cfg.validate()
		require.NoError(t, err)
		assert.Equal(t, 24*time.Hour, checked.Ban.Forget)
	})
}
