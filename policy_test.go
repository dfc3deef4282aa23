package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

var tierCfg = Config{
	Rules: []Rule{{Limit: 3, Window: time.Minute}},
	Tiers: map[string][]Rule{
		"paid":    {{Limit: 10, Window: time.Minute}, {Limit: 100, Window: time.Hour}},
		"abusive": {{Limit: 1, Window: time.Minute, Type: Fixed}},
	},
	TierOf: func(key string) string {
		if len(key) > 5 && key[:5] == "paid-" {
			return "paid"
		}
		if key == "bad-tier" {
			return "gold"
		}
		return ""
	},
}

// newTiered returns a ModeLocal limiter with tierCfg (and cfg's ban
// policy) on a clock set by hand to at(10, 0, 0).
func newTiered(t *testing.T, ban BanPolicy) (*Limiter, *stepClock) {
	t.Helper()
	mock := &stepClock{Mock: clock.NewMock()}
	mock.Set(at(10, 0, 0))
	cfg := tierCfg
	cfg.Clock, cfg.Manual, cfg.Ban = mock, true, ban
	l, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, mock
}

// admitted makes n decisions on key and returns how many were admitted.
func admitted(t *testing.T, l *Limiter, key string, n int) int {
	t.Helper()
	k := 0
	for range n {
		res, err := l.Allow(context.Background(), key)
		require.NoError(t, err)
		if res.Allowed {
			k++
		}
	}
	return k
}

func TestTiers(t *testing.T) {
	l, _ := newTiered(t, BanPolicy{})
	ctx := context.Background()
	assert.Equal(t, []string{"", "abusive", "paid"}, l.Tiers())
	rules, ok := l.TierRules("paid")
	assert.True(t, ok)
	assert.Equal(t, tierCfg.Tiers["paid"], rules)
	_, ok = l.TierRules("gold")
	assert.False(t, ok)

	assert.Equal(t, 3, admitted(t, l, "free-1", 10))
	assert.Equal(t, 10, admitted(t, l, "paid-1", 20))
	res, err := l.Allow(ctx, "paid-1")
	require.NoError(t, err)
	assert.Equal(t, "paid", res.Tier)
	assert.Equal(t, int64(10), res.Limit)
	res, err = l.Allow(ctx, "free-1")
	require.NoError(t, err)
	assert.Equal(t, "", res.Tier)

	// Costs are checked against the key's tier.
	_, err = l.AllowN(ctx, "free-2", 5)
	assert.ErrorIs(t, err, ErrCost)
	assert.ErrorContains(t, err, "exceeds Config.Rules[0].Limit 3")
	_, err = l.AllowN(ctx, "paid-2", 5)
	assert.NoError(t, err)
	_, err = l.AllowN(ctx, "paid-2", 11)
	assert.ErrorContains(t, err, `exceeds Config.Tiers["paid"][0].Limit 10`)

	// A tier name TierOf makes up is an error of the decision.
	_, err = l.Allow(ctx, "bad-tier")
	assert.ErrorIs(t, err, ErrUnknownTier)
	assert.ErrorContains(t, err, `Config.TierOf returned "gold"`)

	st, err := l.State(ctx, "paid-1", nil)
	require.NoError(t, err)
	require.Len(t, st, 2)
	assert.Equal(t, int64(0), st[0].Remaining)
	assert.Equal(t, int64(90), st[1].Remaining)
	assert.Equal(t, 3, l.Stats().Keys, "free-1, paid-1, paid-2 (free-2 was refused)")
}

func TestTierConfigErrors(t *testing.T) {
	ok := []Rule{{Limit: 1, Window: time.Second}}
	for _, c := range []struct {
		tiers map[string][]Rule
		want  string
	}{
		{map[string][]Rule{"": ok}, `tier name "" has 0 bytes`},
		{map[string][]Rule{"a b": ok}, `tier name "a b" holds a byte 0x20`},
		{map[string][]Rule{"p": nil}, `Config.Tiers["p"] has 0 rules, want 1 to 16`},
		{map[string][]Rule{"p": {{Limit: 0, Window: time.Second}}}, `Config.Tiers["p"][0].Limit is 0`},
		{map[string][]Rule{"p": {{Limit: 1, Window: time.Second}, {Limit: 2, Window: time.Second, Type: Fixed}}}, `Config.Tiers["p"][1] (2/1s fixed) counts like Config.Tiers["p"][0]`},
	} {
		_, err := New(Config{Rules: ok, Tiers: c.tiers})
		assert.ErrorContains(t, err, c.want)
	}
	tiers := map[string][]Rule{}
	for i := range MaxTiers + 1 {
		tiers[fmt.Sprint(i)] = ok
	}
	_, err := New(Config{Rules: ok, Tiers: tiers})
	assert.ErrorContains(t, err, "Config.Tiers has 65 tiers, want at most 64")
	_, err = New(Config{Rules: ok, Tiers: map[string][]Rule{"b": {{Limit: 5, Window: time.Second, Type: Bucketed, Buckets: 20}}},
		Mode: ModeAsync, Store: store.NewMemory(nil)})
	assert.ErrorContains(t, err, `Config.Tiers["b"][0] has buckets of 50ms, shorter than Config.SyncRate 100ms`)
	for _, c := range []struct {
		ban  BanPolicy
		want string
	}{
		{BanPolicy{For: time.Second}, "Config.Ban has fields set but Denials is 0"},
		{BanPolicy{Denials: -1}, "Config.Ban.Denials is -1"},
		{BanPolicy{Denials: 3, Within: time.Hour * 25}, "Config.Ban.Within is 25h0m0s, want 1ms to 24h"},
		{BanPolicy{Denials: 3, For: time.Hour, Max: time.Minute}, "Config.Ban.For is 1h0m0s and Max 1m0s"},
		{BanPolicy{Denials: 3, Forget: -time.Second}, "Config.Ban.Forget is -1s"},
	} {
		_, err := New(Config{Rules: ok, Ban: c.ban})
		assert.ErrorContains(t, err, c.want)
	}
	// A store without policies cannot ban.
	_, err = New(Config{Rules: ok, Ban: BanPolicy{Denials: 3}, Mode: ModeAsync, Store: errStore{}})
	assert.ErrorIs(t, err, ErrNoPolicies)
}

// errStore is a Store without policies whose calls all fail.
type errStore struct{}

func (errStore) Group(string) int { return 0 }
func (errStore) Push(context.Context, []*store.Batch) error {
	return errors.New("down")
}
func (errStore) Take(context.Context, []*store.TakeRequest) error {
	return errors.New("down")
}
func (errStore) Time(context.Context) (time.Time, error) { return time.Time{}, errors.New("down") }

// Overrides move a key to another tier at once on this node, until they
// end or are removed; the key starts the tier with the counts its
// counters there hold.
func TestOverrides(t *testing.T) {
	l, mock := newTiered(t, BanPolicy{})
	ctx := context.Background()
	assert.Equal(t, 3, admitted(t, l, "acme", 5))
	require.NoError(t, l.SetOverride(ctx, "acme", "paid", 10*time.Minute))
	assert.Equal(t, 10, admitted(t, l, "acme", 15), "the paid tier from its first request")
	require.NoError(t, l.SetOverride(ctx, "paid-bob", "abusive", 0))
	assert.Equal(t, 1, admitted(t, l, "paid-bob", 5))
	res, err := l.Allow(ctx, "paid-bob")
	require.NoError(t, err)
	assert.Equal(t, "abusive", res.Tier)

	ov, err := l.Overrides(ctx)
	require.NoError(t, err)
	assert.Equal(t, []Override{{Key: "acme", Tier: "paid", Until: at(10, 10, 0)}, {Key: "paid-bob", Tier: "abusive"}}, ov)

	// The override of acme ends: its own tier again, whose minute is
	// over by then.
	mock.Set(at(10, 10, 0))
	res, err = l.Allow(ctx, "acme")
	require.NoError(t, err)
	assert.Equal(t, "", res.Tier)
	ov, err = l.Overrides(ctx)
	require.NoError(t, err)
	assert.Len(t, ov, 1)

	removed, err := l.RemoveOverride(ctx, "paid-bob")
	require.NoError(t, err)
	assert.True(t, removed)
	removed, err = l.RemoveOverride(ctx, "paid-bob")
	require.NoError(t, err)
	assert.False(t, removed)
	res, err = l.Allow(ctx, "paid-bob")
	require.NoError(t, err)
	assert.Equal(t, "paid", res.Tier)

	assert.ErrorContains(t, l.SetOverride(ctx, "k", "gold", 0), `tier "gold" is not in Config.Tiers`)
	assert.ErrorContains(t, l.SetOverride(ctx, "k", "paid", -time.Second), "ttl is -1s, want 0 (no end) to")
	assert.ErrorIs(t, l.SetOverride(ctx, "", "paid", 0), ErrEmptyKey)
	require.NoError(t, l.SetOverride(ctx, "k", "", time.Minute), "the default tier is a tier")
}

func TestBlocks(t *testing.T) {
	l, mock := newTiered(t, BanPolicy{})
	ctx := context.Background()
	require.NoError(t, l.Block(ctx, "mallory", 90*time.Second, "scraping"))
	require.NoError(t, l.Block(ctx, "eve", 0, "fraud"))
	mock.Set(at(10, 0, 30))
	res, err := l.Allow(ctx, "mallory")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.True(t, res.Blocked)
	assert.Equal(t, time.Minute, res.RetryAfter, "the time left on the block")
	res, err = l.Peek(ctx, "eve")
	require.NoError(t, err)
	assert.True(t, res.Blocked)
	assert.Equal(t, MaxWindow, res.RetryAfter, "a block without end")

	bs, err := l.Blocks(ctx)
	require.NoError(t, err)
	assert.Equal(t, []Block{{Key: "eve", Reason: "fraud"}, {Key: "mallory", Reason: "scraping", Until: at(10, 1, 30)}}, bs)
	st := l.Stats()
	assert.Equal(t, uint64(1), st.Blocked)
	assert.Equal(t, uint64(1), st.Denied)

	mock.Set(at(10, 1, 30))
	assert.Equal(t, 3, admitted(t, l, "mallory", 5), "the block ended; nothing was counted while it held")
	ok, err := l.Unblock(ctx, "eve")
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 3, admitted(t, l, "eve", 5))
	assert.ErrorContains(t, l.Block(ctx, "x", -1, ""), "d is -1ns")
}

// Escalating bans on the clock: 3 denials within a minute block the key
// for 1 min, then 2, 4, at most 5 minutes; forgotten an hour after the
// last block ended.
func TestEscalatingBans(t *testing.T) {
	l, mock := newTiered(t, BanPolicy{Denials: 3, Within: time.Minute, For: time.Minute, Max: 5 * time.Minute, Forget: time.Hour})
	ctx := context.Background()
	now := at(10, 0, 0)
	offend := func() time.Duration {
		t.Helper()
		// The free tier admits 3 a minute; the next 3 are denied and the
		// third denial blocks the key.
		mock.Set(now)
		assert.Equal(t, 3, admitted(t, l, "spammer", 6))
		res, err := l.Allow(ctx, "spammer")
		require.NoError(t, err)
		require.True(t, res.Blocked)
		return res.RetryAfter
	}
	var got []time.Duration
	for range 5 {
		d := offend()
		got = append(got, d)
		now = now.Add(d + 2*time.Minute) // the block is over, a fresh minute
	}
	assert.Equal(t, []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}, got)
	mock.Set(now)
	bs, err := l.Blocks(ctx)
	require.NoError(t, err)
	assert.Empty(t, bs)

	now = now.Add(time.Hour)
	assert.Equal(t, time.Minute, offend(), "forgotten after an hour")
	bs, err = l.Blocks(ctx)
	require.NoError(t, err)
	require.Len(t, bs, 1)
	assert.Equal(t, Block{Key: "spammer", Reason: "too many denied requests", Until: now.Add(time.Minute), Strikes: 1}, bs[0])

	// Denials spread wider than Within do not ban.
	for i := range 6 {
		mock.Set(now.Add(time.Duration(i) * 2 * time.Minute))
		admitted(t, l, "slow", 4)
	}
	res, err := l.Allow(ctx, "slow")
	require.NoError(t, err)
	assert.False(t, res.Blocked)
}

// Several nodes on a real Redis: an override or a block set on one node
// holds on the others after their next sync, and an override that ends
// falls back to the tier.
func TestPoliciesAcrossNodes(t *testing.T) {
	for _, mode := range []Mode{ModeAsync, ModeSynchronous} {
		t.Run(mode.String(), func(t *testing.T) {
			mock := &stepClock{Mock: clock.NewMock()}
			mock.Set(time.Now())
			c := redistest.Client(t)
			pfx := redistest.Prefix(t)
			var nodes []*Limiter
			for range 3 {
				cfg := tierCfg
				cfg.Mode, cfg.Store, cfg.Prefix, cfg.Clock, cfg.Manual, cfg.ClockSync = mode, storetest.Redis(t, c), pfx, mock, true, -1
				l, err := New(cfg)
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				nodes = append(nodes, l)
			}
			ctx := context.Background()
			syncAll := func() {
				for _, l := range nodes {
					require.NoError(t, l.Sync(ctx))
				}
			}
			require.NoError(t, nodes[0].SetOverride(ctx, "acme", "paid", time.Minute))
			require.NoError(t, nodes[0].Block(ctx, "mallory", time.Hour, "abuse"))
			res, err := nodes[1].Allow(ctx, "mallory")
			require.NoError(t, err)
			assert.False(t, res.Blocked, "not yet synced")
			syncAll()
			for i, l := range nodes {
				res, err := l.Allow(ctx, "mallory")
				require.NoError(t, err)
				assert.True(t, res.Blocked, "node %d", i)
				res, err = l.Allow(ctx, "acme")
				require.NoError(t, err)
				assert.Equal(t, "paid", res.Tier, "node %d", i)
			}
			// The override holds for its ttl, its end rounded up to the
			// millisecond (mock.Set(time.Now()) is between milliseconds).
			mock.Add(time.Minute + time.Millisecond)
			for i, l := range nodes {
				res, err := l.Allow(ctx, "acme")
				require.NoError(t, err)
				assert.Equal(t, "", res.Tier, "node %d: the override ended", i)
			}
			ok, err := nodes[2].Unblock(ctx, "mallory")
			require.NoError(t, err)
			assert.True(t, ok)
			syncAll()
			for i, l := range nodes {
				res, err := l.Allow(ctx, "mallory")
				require.NoError(t, err)
				assert.False(t, res.Blocked, "node %d", i)
			}
			bs, err := nodes[1].Blocks(ctx)
			require.NoError(t, err)
			assert.Empty(t, bs)
		})
	}
}

// With the background loop, a block set on one node holds on another
// within a few sync periods (a loose bound: this is not a timing test).
func TestBlockReachesOtherNodes(t *testing.T) {
	c := redistest.Client(t)
	pfx := redistest.Prefix(t)
	var nodes []*Limiter
	for range 2 {
		l, err := New(Config{Rules: tierCfg.Rules, Mode: ModeAsync, SyncRate: 20 * time.Millisecond, Store: storetest.Redis(t, c), Prefix: pfx})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	ctx := context.Background()
	require.NoError(t, nodes[0].Block(ctx, "k", time.Minute, "test"))
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := nodes[1].Peek(ctx, "k")
		require.NoError(t, err)
		if res.Blocked {
			break
		}
		require.True(t, time.Now().Before(deadline), "the block never reached the other node")
		time.Sleep(5 * time.Millisecond)
	}
}

// Bans under concurrency: 16 goroutines hammering one key over its limit
// block it once, and only once.
func TestBanUnderConcurrency(t *testing.T) {
	l, _ := newTiered(t, BanPolicy{Denials: 50, Within: time.Minute})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 100 {
				_, _ = l.Allow(context.Background(), "k")
			}
		})
	}
	wg.Wait()
	bs, err := l.Blocks(context.Background())
	require.NoError(t, err)
	require.Len(t, bs, 1)
	assert.Equal(t, 1, bs[0].Strikes)
}

// A key moved to a tier whose rule counts like its old tier's keeps what
// it spent, in ModeAsync and ModeSynchronous: both tiers' counters are the
// same in the store (from the first sync after the move, in ModeAsync). In
// ModeLocal each tier's table counts on its own: the key starts afresh.
func TestOverrideKeepsStoreCounts(t *testing.T) {
	for _, c := range []struct {
		mode Mode
		want int // admitted by "paid" (10 a minute) after 3 as a free key
	}{
		{ModeLocal, 10},
		{ModeAsync, 7},
		{ModeSynchronous, 7},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			mock := clock.NewMock()
			mock.Set(at(10, 0, 0))
			cfg := tierCfg
			cfg.Mode, cfg.Clock, cfg.Manual = c.mode, mock, true
			cfg.Tiers = map[string][]Rule{"paid": {{Limit: 10, Window: time.Minute}}}
			if c.mode != ModeLocal {
				cfg.Store = store.NewMemory(mock)
			}
			if c.mode == ModeAsync {
				cfg.SyncRate = 100 * time.Millisecond
			}
			l, err := New(cfg)
			require.NoError(t, err)
			ctx := context.Background()
			t.Cleanup(func() { _ = l.Close(ctx) })
			require.Equal(t, 3, admitted(t, l, "acme", 5))
			require.NoError(t, l.Sync(ctx))
			require.NoError(t, l.SetOverride(ctx, "acme", "paid", time.Hour))
			got := admitted(t, l, "acme", 1)
			require.NoError(t, l.Sync(ctx))
			mock.Add(time.Millisecond)
			got += admitted(t, l, "acme", 15)
			assert.Equal(t, c.want, got)
		})
	}
}
