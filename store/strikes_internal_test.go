package store

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// escalation stays within [base, max] for every strike, however large,
// and ends in a bounded number of steps whatever base and max are.
func TestEscalationSaturates(t *testing.T) {
	const day = 24 * time.Hour
	for _, c := range []struct {
		base, max time.Duration
		n         int
		want      time.Duration
	}{
		{time.Second, day, 1, time.Second},
		{time.Second, day, 2, 2 * time.Second},
		{time.Second, day, 0, time.Second},
		{time.Second, day, -5, time.Second},
		{time.Second, day, 18, day},
		{time.Second, day, math.MaxInt, day},
		{time.Second, math.MaxInt64, 62, math.MaxInt64}, // 2^61 s would wrap past 2^63 ns
		{time.Second, math.MaxInt64, math.MaxInt, math.MaxInt64},
		{math.MaxInt64, math.MaxInt64, math.MaxInt, math.MaxInt64},
		{0, day, math.MaxInt, 0}, // 0 doubled is 0: no endless loop
	} {
		assert.Equal(t, c.want, escalation(c.base, c.max, c.n), "escalation(%v, %v, %d)", c.base, c.max, c.n)
	}
}

// A strikes record holding a count no Escalate wrote (MaxInt, beyond
// int64, negative: another program's write to the policy hash) neither
// wraps nor panics: a count too large saturates at MaxStrikes and gives
// the longest block; a negative or malformed one counts as no strike.
func TestEscalateCorruptStrikes(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	const now = int64(1_893_456_000_000)
	const base, maxBlock, forget = time.Minute, 24 * time.Hour, time.Hour
	for _, tc := range []struct {
		name, strikes string
		want          int
		block         time.Duration
	}{
		{"maxint64", strconv.FormatInt(math.MaxInt64, 10), MaxStrikes, maxBlock},
		{"max", strconv.Itoa(MaxStrikes), MaxStrikes, maxBlock},
		{"beyond int64", "99999999999999999999999", MaxStrikes, maxBlock},
		{"negative", "-9223372036854775808", 1, base},
		{"three", "3", 4, 8 * base},
	} {
		until := strconv.FormatInt(now+forget.Milliseconds(), 10)
		record := until + "|" + tc.strikes + "|"
		t.Run("memory/"+tc.name, func(t *testing.T) {
			m := NewMemory(nil)
			m.policyHash("hl")["s:k"] = record
			p, err := m.Escalate(ctx, "hl", "k", "r", now, base, maxBlock, forget)
			require.NoError(t, err)
			assert.Equal(t, tc.want, p.Strikes)
			assert.Equal(t, now+tc.block.Milliseconds(), p.Until)
			_, ps, err := m.Policies(ctx, "hl")
			require.NoError(t, err)
			require.Len(t, ps, 1)
			assert.Equal(t, tc.want, ps[0].Strikes, "the block as Policies reads it")
		})
		t.Run("redis/"+tc.name, func(t *testing.T) {
			pfx := redistest.Prefix(t)
			s, err := NewRedis(c, RedisOptions{})
			require.NoError(t, err)
			require.NoError(t, c.HSet(ctx, policyKeys(pfx)[0], "s:k", record).Err())
			p, err := s.Escalate(ctx, pfx, "k", "r", now, base, maxBlock, forget)
			require.NoError(t, err)
			assert.Equal(t, tc.want, p.Strikes)
			assert.Equal(t, now+tc.block.Milliseconds(), p.Until)
			_, ps, err := s.Policies(ctx, pfx)
			require.NoError(t, err)
			require.Len(t, ps, 1)
			assert.Equal(t, tc.want, ps[0].Strikes, "the block as Policies reads it")
		})
	}
}

// A block in force whose record holds a huge strikes count (written by
// another program) is returned by Escalate with the count saturated, not
// wrapped negative.
func TestEscalateBlockInForceCorruptStrikes(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	const now = int64(1_893_456_000_000)
	record := strconv.FormatInt(now+60_000, 10) + "|" + strconv.FormatInt(math.MaxInt64, 10) + "|why"
	m := NewMemory(nil)
	m.policyHash("hl")["b:k"] = record
	p, err := m.Escalate(ctx, "hl", "k", "r", now, time.Minute, time.Hour, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, Policy{Kind: Block, Key: "k", Value: "why", Until: now + 60_000, Strikes: MaxStrikes}, p, "memory")

	pfx := redistest.Prefix(t)
	s, err := NewRedis(c, RedisOptions{})
	require.NoError(t, err)
	require.NoError(t, c.HSet(ctx, policyKeys(pfx)[0], "b:k", record).Err())
	p, err = s.Escalate(ctx, pfx, "k", "r", now, time.Minute, time.Hour, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, Policy{Kind: Block, Key: "k", Value: "why", Until: now + 60_000, Strikes: MaxStrikes}, p, "redis")
}

// Escalate and PutPolicy refuse arguments they cannot keep exactly, with
// an error naming the argument and the accepted range, in both stores.
func TestPolicyArgumentsChecked(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	const now = int64(1_893_456_000_000)
	r, err := NewRedis(c, RedisOptions{})
	require.NoError(t, err)
	for name, s := range map[string]PolicyStore{"memory": NewMemory(nil), "redis": r} {
		pfx := redistest.Prefix(t)
		for _, e := range []struct {
			now               int64
			base, max, forget time.Duration
			want              string
		}{
			{now, 0, time.Hour, 0, "base"},
			{now, -time.Second, time.Hour, 0, "base"},
			{now, time.Hour, time.Minute, 0, "max"},
			{now, time.Minute, time.Hour, -1, "forget"},
			{-1, time.Minute, time.Hour, 0, "now"},
			{math.MaxInt64, time.Minute, time.Hour, 0, "now"},
		} {
			_, err := s.Escalate(ctx, pfx, "k", "r", e.now, e.base, e.max, e.forget)
			if assert.Error(t, err, "%s: Escalate(now %d, base %v, max %v, forget %v)", name, e.now, e.base, e.max, e.forget) {
				assert.Contains(t, err.Error(), e.want, name)
			}
		}
		for _, p := range []Policy{
			{Kind: 's', Key: "k", Until: now + 1, Strikes: math.MaxInt},
			{Kind: Block, Key: "k", Strikes: -1},
			{Kind: Block, Key: "k", Strikes: MaxStrikes + 1},
			{Kind: Block, Key: "k", Until: -1},
		} {
			assert.Error(t, s.PutPolicy(ctx, pfx, p, now), "%s: PutPolicy(%+v)", name, p)
		}
		_, ps, err := s.Policies(ctx, pfx)
		require.NoError(t, err)
		assert.Empty(t, ps, name)
	}
}

// Escalate keeps a block's end exactly up to the largest now it accepts
// (2^52 ms): in both stores the block and its strikes read back with the
// end Escalate returned, in force until then, and the next ban after it
// doubles. (Lua writes a number of 15 digits or more in exponent form
// unless the script formats it as an integer.)
func TestEscalateFarInstants(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	r, err := NewRedis(c, RedisOptions{})
	require.NoError(t, err)
	const base, maxBlock, forget = time.Minute, time.Hour, 24 * time.Hour
	for _, now := range []int64{99_999_999_999_999, 100_000_000_000_000, maxPolicyMs - 2*int64(maxBlock/time.Millisecond) - int64(forget/time.Millisecond)} {
		for name, s := range map[string]PolicyStore{"memory": NewMemory(nil), "redis": r} {
			pfx := redistest.Prefix(t)
			p, err := s.Escalate(ctx, pfx, "k", "r", now, base, maxBlock, forget)
			require.NoError(t, err, "%s at %d", name, now)
			assert.Equal(t, Policy{Kind: Block, Key: "k", Value: "r", Until: now + base.Milliseconds(), Strikes: 1}, p, "%s at %d", name, now)
			_, ps, err := s.Policies(ctx, pfx)
			require.NoError(t, err)
			assert.Equal(t, []Policy{p}, ps, "%s at %d: the block as Policies reads it", name, now)
			again, err := s.Escalate(ctx, pfx, "k", "r", p.Until-1, base, maxBlock, forget)
			require.NoError(t, err)
			assert.Equal(t, p, again, "%s at %d: in force until its end", name, now)
			next, err := s.Escalate(ctx, pfx, "k", "r", p.Until, base, maxBlock, forget)
			require.NoError(t, err)
			assert.Equal(t, Policy{Kind: Block, Key: "k", Value: "r", Until: p.Until + 2*base.Milliseconds(), Strikes: 2}, next, "%s at %d: doubled", name, now)
		}
	}
}
