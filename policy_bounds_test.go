package hybridlimit

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
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

// Odd input to the policy methods: an error naming the argument and what
// it accepts, never a panic, and nothing stored.
func TestPolicyInputErrors(t *testing.T) {
	ctx := context.Background()
	l, _ := newTiered(t, BanPolicy{})
	long := strings.Repeat("k", DefaultMaxKeyLen)
	over := long + "k"
	for _, c := range []struct {
		name string
		call func() error
		is   error  // errors.Is, when set
		msg  string // contained in the error, when set
	}{
		{"SetOverride empty key", func() error { return l.SetOverride(ctx, "", "paid", 0) }, ErrEmptyKey, "SetOverride: empty key; want 1 to Config.MaxKeyLen (1024) bytes"},
		{"SetOverride long key", func() error { return l.SetOverride(ctx, over, "paid", 0) }, ErrKeyTooLong, "SetOverride: key of 1025 bytes exceeds Config.MaxKeyLen 1024"},
		{"SetOverride unknown tier", func() error { return l.SetOverride(ctx, "k", "gold", 0) }, ErrUnknownTier, `SetOverride: tier "gold" is not in Config.Tiers`},
		{"SetOverride negative ttl", func() error { return l.SetOverride(ctx, "k", "paid", -1) }, nil, "SetOverride: ttl is -1ns, want 0 (no end) to 8784h0m0s"},
		{"SetOverride huge ttl", func() error { return l.SetOverride(ctx, "k", "paid", MaxWindow+1) }, nil, "ttl is 8784h0m0.000000001s, want 0 (no end) to 8784h0m0s"},
		{"SetOverride MinInt64 ttl", func() error { return l.SetOverride(ctx, "k", "paid", math.MinInt64) }, nil, "want 0 (no end) to"},
		{"Block empty key", func() error { return l.Block(ctx, "", time.Second, "") }, ErrEmptyKey, "Block: empty key; want 1 to Config.MaxKeyLen (1024) bytes"},
		{"Block long key", func() error { return l.Block(ctx, over, time.Second, "") }, ErrKeyTooLong, "Block: key of 1025 bytes"},
		{"Block negative d", func() error { return l.Block(ctx, "k", -time.Second, "") }, nil, "Block: d is -1s, want 0 (no end) to 8784h0m0s"},
		{"Block huge d", func() error { return l.Block(ctx, "k", math.MaxInt64, "") }, nil, "Block: d is 2562047h47m16.854775807s, want 0 (no end) to"},
		{"Unblock empty key", func() error { _, err := l.Unblock(ctx, ""); return err }, ErrEmptyKey, "Unblock: empty key; want 1 to Config.MaxKeyLen (1024) bytes"},
		{"Unblock long key", func() error { _, err := l.Unblock(ctx, over); return err }, ErrKeyTooLong, "Unblock: key of 1025 bytes"},
		{"RemoveOverride empty key", func() error { _, err := l.RemoveOverride(ctx, ""); return err }, ErrEmptyKey, "RemoveOverride: empty key; want 1 to Config.MaxKeyLen (1024) bytes"},
		{"RemoveOverride long key", func() error { _, err := l.RemoveOverride(ctx, over); return err }, ErrKeyTooLong, "RemoveOverride: key of 1025 bytes"},
		{"Contributors empty key", func() error { _, err := l.Contributors(ctx, ""); return err }, ErrEmptyKey, "Contributors: empty key; want 1 to Config.MaxKeyLen (1024) bytes"},
		{"Contributors long key", func() error { _, err := l.Contributors(ctx, over); return err }, ErrKeyTooLong, "Contributors: key of 1025 bytes"},
		{"AllowTagged empty key", func() error { _, err := l.AllowTagged(ctx, "", "t", 1); return err }, ErrEmptyKey, ""},
		{"AllowTagged n=0", func() error { _, err := l.AllowTagged(ctx, "k", "t", 0); return err }, ErrCost, "AllowN(n=0): cost must be at least 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { err = c.call() })
			require.Error(t, err)
			if c.is != nil {
				assert.ErrorIs(t, err, c.is)
			}
			if c.msg != "" {
				assert.ErrorContains(t, err, c.msg)
			}
		})
	}
	ov, err := l.Overrides(ctx)
	require.NoError(t, err)
	assert.Empty(t, ov)
	bs, err := l.Blocks(ctx)
	require.NoError(t, err)
	assert.Empty(t, bs)

	// The bounds themselves are accepted, and keys and reasons of any
	// bytes come back as given.
	odd := "a:b|c\n{d}\x00"
	require.NoError(t, l.SetOverride(ctx, long, "paid", MaxWindow))
	require.NoError(t, l.SetOverride(ctx, odd, "", 0))
	require.NoError(t, l.Block(ctx, long, MaxWindow, "x"))
	require.NoError(t, l.Block(ctx, odd, 1, "why|not:\n"))
	bs, err = l.Blocks(ctx)
	require.NoError(t, err)
	require.Len(t, bs, 2)
	assert.Equal(t, odd, bs[0].Key)
	assert.Equal(t, "why|not:\n", bs[0].Reason)
	res, err := l.Allow(ctx, odd)
	require.NoError(t, err)
	assert.True(t, res.Blocked)
	res, err = l.Allow(ctx, long)
	require.NoError(t, err)
	assert.True(t, res.Blocked)
	assert.Equal(t, "paid", res.Tier)
	ok, err := l.Unblock(ctx, long)
	require.NoError(t, err)
	assert.True(t, ok)
	_, ok = l.TierRules("gold")
	assert.False(t, ok)
	rules, ok := l.TierRules("")
	assert.True(t, ok)
	assert.Equal(t, tierCfg.Rules, rules)
}

// A ban's For and Max are kept to the millisecond by the store, as a
// rule's Window: a length between milliseconds would make the block end
// before For has passed, so New refuses it with an error naming the field.
func TestBanLengthsWholeMilliseconds(t *testing.T) {
	for _, c := range []struct {
		ban  BanPolicy
		want string
	}{
		{BanPolicy{Denials: 1, For: time.Second + 500*time.Microsecond}, "Config.Ban.For is 1.0005s, want a whole number of milliseconds"},
		{BanPolicy{Denials: 1, For: time.Second, Max: time.Hour + 1}, "Config.Ban.Max is 1h0m0.000000001s, want a whole number of milliseconds"},
	} {
		cfg := tierCfg
		cfg.Ban = c.ban
		_, err := New(cfg)
		assert.ErrorContains(t, err, c.want, "%+v", c.ban)
	}
	// Whole milliseconds are kept exactly: the block holds For, and the
	// next one twice For.
	ctx := context.Background()
	l, mock := newTiered(t, BanPolicy{Denials: 1, For: 1001 * time.Millisecond, Max: time.Hour})
	start := at(10, 0, 0)
	mock.Set(start)
	admitted(t, l, "k", 4)
	res, err := l.Peek(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Blocked)
	assert.Equal(t, 1001*time.Millisecond, res.RetryAfter)
}

// A node counts a key's denials in periods of Within from the first
// denial of a period: Denials of them within one period ban the key, the
// same number straddling two periods does not, however close together.
func TestBanCountsPeriodsFromFirstDenial(t *testing.T) {
	ctx := context.Background()
	l, mock := newTiered(t, BanPolicy{Denials: 3, Within: time.Minute})
	start := at(10, 0, 0)
	deny := func(d time.Duration) {
		t.Helper()
		mock.Set(start.Add(d))
		res, err := l.Allow(ctx, "k")
		require.NoError(t, err)
		require.False(t, res.Allowed, "at start%+v", d)
		require.False(t, res.Blocked, "at start%+v", d)
	}
	mock.Set(start)
	require.Equal(t, 3, admitted(t, l, "k", 3)) // the free tier's 3 a minute
	deny(0)                                     // the period starts: 1
	deny(59 * time.Second)                      // 2
	deny(time.Minute)                           // a new period: 1, two denials a second apart before it
	deny(time.Minute + time.Second)             // 2
	mock.Set(start.Add(time.Minute + 2*time.Second))
	res, err := l.Allow(ctx, "k") // 3 within the period: banned
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	res, err = l.Peek(ctx, "k")
	require.NoError(t, err)
	assert.True(t, res.Blocked)
}

// A block whose end another program put far ahead in the store (up to
// the 2^52 ms a store keeps, or past it) holds with a RetryAfter that
// saturates, never one that wraps into a short or negative wait.
func TestBlockFarEndRetryAfter(t *testing.T) {
	ctx := context.Background()
	mock := clock.NewMock()
	mock.Set(at(10, 0, 0))
	st := store.NewMemory(mock)
	cfg := tierCfg
	cfg.Mode, cfg.Store, cfg.Clock, cfg.Manual = ModeAsync, st, mock, true
	l, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(ctx) })
	now := mock.Now().UnixMilli()
	for _, until := range []int64{now + int64(MaxWindow/time.Millisecond), math.MaxInt64 / int64(time.Millisecond), 1 << 52} {
		require.NoError(t, st.PutPolicy(ctx, l.cfg.Prefix, store.Policy{Kind: store.Block, Key: "k", Until: until}, now))
		require.NoError(t, l.Sync(ctx))
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Blocked, "until %d", until)
		want := time.Duration(math.MaxInt64)
		if until <= math.MaxInt64/int64(time.Millisecond) {
			want = time.Duration(until-now) * time.Millisecond
		}
		assert.Equal(t, want, res.RetryAfter, "until %d", until)
	}
}

// Max defaults to 24 hours, or to For when For is longer: a For of 48h
// bans for 48h, and a repeat within Forget stays at 48h rather than
// doubling.
func TestBanMaxDefaultsToForWhenLonger(t *testing.T) {
	ctx := context.Background()
	l, mock := newTiered(t, BanPolicy{Denials: 1, For: 48 * time.Hour})
	start := mock.Now()
	for i, at := range []time.Time{start, start.Add(48*time.Hour + time.Second)} {
		mock.Set(at)
		assert.Equal(t, 3, admitted(t, l, "k", 4), "ban %d: the fourth request is denied and bans the key", i)
		res, err := l.Peek(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Blocked, "ban %d", i)
		assert.InDelta(t, float64(48*time.Hour), float64(res.RetryAfter), float64(time.Second), "ban %d's length", i)
	}
}
