package hybridlimit

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// The worked examples of the articles the algorithms come from, as tables
// over exact instants on a mock clock, in the local mode and in the
// synchronous mode on the memory store (the Redis store runs the same
// tables in integration tests).

// at is an instant as the examples write it: 12:33:35 is at(12, 33, 35).
func at(h, m, s int) time.Time { return time.Date(2030, 1, 1, h, m, s, 0, time.UTC) }

type algoStep struct {
	at        time.Time
	n         int64
	allowed   bool
	retry     time.Duration // checked when denied
	remaining int64         // checked when not negative
	rule      int           // checked when not negative
	delay     time.Duration // checked when allowed
}

// eachMode runs f with a local limiter and a synchronous one on a memory
// store, both on a clock set by hand.
func eachMode(t *testing.T, rules []Rule, f func(t *testing.T, l *Limiter, mock *stepClock)) {
	for _, name := range []string{"local", "synchronous", "synchronous-redis"} {
		t.Run(name, func(t *testing.T) {
			mock := &stepClock{Mock: clock.NewMock()}
			cfg := Config{Rules: rules, Clock: mock, Manual: true}
			switch name {
			case "synchronous":
				cfg.Mode, cfg.Store, cfg.ClockSync = ModeSynchronous, store.NewMemory(mock), -1
			case "synchronous-redis":
				// The store decides at the node's (mock) instant; its
				// deadlines and expiries fall in the mock's far future.
				cfg.Mode, cfg.Store, cfg.ClockSync = ModeSynchronous, storetest.Redis(t, redistest.Client(t)), -1
				cfg.Prefix = redistest.Prefix(t)
			}
			l, err := New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			f(t, l, mock)
		})
	}
}

func runAlgoSteps(t *testing.T, l *Limiter, mock *stepClock, key string, steps []algoStep) {
	t.Helper()
	for i, s := range steps {
		mock.Set(s.at)
		res, err := l.AllowN(context.Background(), key, s.n)
		require.NoError(t, err, "step %d", i)
		assert.Equal(t, s.allowed, res.Allowed, "step %d at %v: allowed", i, s.at.Format("15:04:05.000"))
		if !s.allowed {
			assert.Equal(t, s.retry, res.RetryAfter, "step %d at %v: retry after", i, s.at.Format("15:04:05.000"))
		} else {
			assert.Equal(t, s.delay, res.Delay, "step %d at %v: delay", i, s.at.Format("15:04:05.000"))
		}
		if s.remaining >= 0 {
			assert.Equal(t, s.remaining, res.Remaining, "step %d at %v: remaining", i, s.at.Format("15:04:05.000"))
		}
		if s.rule >= 0 {
			assert.Equal(t, s.rule, res.Rule, "step %d at %v: rule", i, s.at.Format("15:04:05.000"))
		}
	}
}

// DomainTools: rules 1/s and 5/min, requests at 12:33:35, 12:33:37,
// 12:34:14, 12:34:26 and 12:34:28. At 12:34:31 the 5/min rule denies, and
// the request fits exactly when 12:33:35 leaves the minute: in 4 s. At
// 12:34:40 it is admitted.
func TestLogDomainTools(t *testing.T) {
	rules := []Rule{{Limit: 1, Window: time.Second, Type: Log}, {Limit: 5, Window: time.Minute, Type: Log}}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		runAlgoSteps(t, l, mock, "client", []algoStep{
			{at: at(12, 33, 35), n: 1, allowed: true, remaining: -1, rule: -1},
			{at: at(12, 33, 37), n: 1, allowed: true, remaining: -1, rule: -1},
			{at: at(12, 34, 14), n: 1, allowed: true, remaining: -1, rule: -1},
			{at: at(12, 34, 26), n: 1, allowed: true, remaining: -1, rule: -1},
			{at: at(12, 34, 28), n: 1, allowed: true, remaining: 0, rule: -1},
			{at: at(12, 34, 31), n: 1, allowed: false, retry: 4 * time.Second, remaining: -1, rule: 1},
			{at: at(12, 34, 35), n: 1, allowed: true, remaining: 0, rule: -1},
			// Both rules deny: the second fits in 500 ms, the minute in
			// 1.5 s, when 12:33:37 leaves it.
			{at: at(12, 34, 35).Add(500 * time.Millisecond), n: 1, allowed: false, retry: 1500 * time.Millisecond, remaining: -1, rule: 1},
			{at: at(12, 34, 40), n: 1, allowed: true, remaining: -1, rule: -1},
		})
	})
}

// Instagram: 5000 calls per hour; with 4413 in the last hour, 587 remain,
// exactly.
func TestLogInstagram(t *testing.T) {
	rules := []Rule{{Limit: 5000, Window: time.Hour, Type: Log}}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		ctx := context.Background()
		start := at(9, 0, 0)
		// 1000 calls an hour and a half ago have left the window.
		for i := range 1000 {
			mock.Set(start.Add(time.Duration(i) * time.Millisecond))
			res, err := l.Allow(ctx, "app")
			require.NoError(t, err)
			require.True(t, res.Allowed)
		}
		for i := range 4413 {
			mock.Set(start.Add(90*time.Minute + time.Duration(i)*500*time.Millisecond))
			res, err := l.Allow(ctx, "app")
			require.NoError(t, err)
			require.True(t, res.Allowed)
		}
		mock.Set(start.Add(2*time.Hour + 30*time.Minute - time.Second)) // the 4413 are in the last hour
		res, err := l.Peek(ctx, "app")
		require.NoError(t, err)
		assert.Equal(t, int64(587), res.Remaining)
		st, err := l.State(ctx, "app", nil)
		require.NoError(t, err)
		assert.Equal(t, int64(587), st[0].Remaining)
	})
}

// The Rust article's sequences (outcrawl): a fixed window counts 1, 2, 3
// then 1 in the next window; a sliding log of 1 s with requests at 0, 300
// and 600 ms counts 3, and at 1.5 s counts 2; a sliding window counts 5,
// then one window later 1 + 5·weight. Counted as Limit − Remaining.
func TestRustArticleSequences(t *testing.T) {
	const limit = 100
	count := func(t *testing.T, l *Limiter) int64 {
		st, err := l.State(context.Background(), "user1", nil)
		require.NoError(t, err)
		return limit - st[0].Remaining
	}
	t0 := at(10, 0, 0)
	t.Run("fixed window", func(t *testing.T) {
		eachMode(t, []Rule{{Limit: limit, Window: time.Second, Type: Fixed}}, func(t *testing.T, l *Limiter, mock *stepClock) {
			for i := range 3 {
				mock.Set(t0.Add(time.Duration(i) * 10 * time.Millisecond))
				_, err := l.Allow(context.Background(), "user1")
				require.NoError(t, err)
				assert.Equal(t, int64(i+1), count(t, l))
			}
			mock.Set(t0.Add(time.Second))
			_, err := l.Allow(context.Background(), "user1")
			require.NoError(t, err)
			assert.Equal(t, int64(1), count(t, l))
		})
	})
	t.Run("sliding log", func(t *testing.T) {
		eachMode(t, []Rule{{Limit: limit, Window: time.Second, Type: Log}}, func(t *testing.T, l *Limiter, mock *stepClock) {
			for i := range 3 {
				mock.Set(t0.Add(time.Duration(i) * 300 * time.Millisecond))
				_, err := l.Allow(context.Background(), "user1")
				require.NoError(t, err)
			}
			mock.Set(t0.Add(900 * time.Millisecond))
			assert.Equal(t, int64(3), count(t, l))
			mock.Set(t0.Add(1500 * time.Millisecond))
			_, err := l.Allow(context.Background(), "user1")
			require.NoError(t, err)
			assert.Equal(t, int64(2), count(t, l), "600 ms and 1.5 s")
		})
	})
	t.Run("sliding window", func(t *testing.T) {
		eachMode(t, []Rule{{Limit: limit, Window: time.Second}}, func(t *testing.T, l *Limiter, mock *stepClock) {
			mock.Set(t0)
			for range 5 {
				_, err := l.Allow(context.Background(), "user1")
				require.NoError(t, err)
			}
			assert.Equal(t, int64(5), count(t, l))
			mock.Set(t0.Add(1200 * time.Millisecond))
			_, err := l.Allow(context.Background(), "user1")
			require.NoError(t, err)
			assert.Equal(t, int64(1+4), count(t, l), "1 + 5·0.8")
		})
	})
}

// The Redis-patterns thresholds: one counter per second summed over 1, 10
// and 15 seconds, at most 1000, 5000 and 7000.
func TestBucketedThresholds(t *testing.T) {
	rules := []Rule{
		{Limit: 1000, Window: time.Second, Type: Fixed},
		{Limit: 5000, Window: 10 * time.Second, Type: Bucketed, Buckets: 10},
		{Limit: 7000, Window: 15 * time.Second, Type: Bucketed, Buckets: 15},
	}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		t0 := at(8, 0, 0)
		sec := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
		var steps []algoStep
		for s := range 5 { // 1000 a second for 5 seconds: 5000 in 10 s
			steps = append(steps, algoStep{at: sec(s), n: 1000, allowed: true, remaining: -1, rule: -1})
		}
		steps = append(steps,
			// The 10 s rule is full until second 0 leaves it, at 10 s.
			algoStep{at: sec(5), n: 1, allowed: false, retry: 5 * time.Second, remaining: 0, rule: 1},
			algoStep{at: sec(10), n: 1000, allowed: true, remaining: 0, rule: 0},
			algoStep{at: sec(11), n: 1000, allowed: true, remaining: 0, rule: 0},
			// 7000 in 15 s: the 15 s rule waits for second 0 to leave, at
			// 15 s; the 10 s rule would let 1000 more in.
			algoStep{at: sec(12), n: 1, allowed: false, retry: 3 * time.Second, remaining: 0, rule: 2},
			algoStep{at: sec(15), n: 1000, allowed: true, remaining: 0, rule: 0},
		)
		runAlgoSteps(t, l, mock, "ip", steps)
	})
}

// A token bucket of 10 per second with a burst of 5: five at once, then
// one every 100 ms.
func TestTokenBucket(t *testing.T) {
	rules := []Rule{{Limit: 10, Window: time.Second, Type: TokenBucket, Burst: 5}}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		t0 := at(7, 0, 0)
		ms := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Millisecond) }
		runAlgoSteps(t, l, mock, "k", []algoStep{
			{at: ms(0), n: 3, allowed: true, remaining: 2, rule: 0},
			{at: ms(0), n: 2, allowed: true, remaining: 0, rule: 0},
			{at: ms(0), n: 1, allowed: false, retry: 100 * time.Millisecond, remaining: 0, rule: 0},
			{at: ms(40), n: 1, allowed: false, retry: 60 * time.Millisecond, remaining: -1, rule: 0},
			{at: ms(100), n: 1, allowed: true, remaining: 0, rule: 0},
			{at: ms(350), n: 2, allowed: true, remaining: 0, rule: 0},
			{at: ms(1000), n: 5, allowed: true, remaining: 0, rule: 0},
		})
	})
}

// A leaky bucket of 10 per second with a queue of 3: requests leave 100 ms
// apart; the fourth waiting one is refused until the queue moves.
func TestLeakyBucket(t *testing.T) {
	rules := []Rule{{Limit: 10, Window: time.Second, Type: LeakyBucket, Burst: 3}}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		t0 := at(6, 0, 0)
		ms := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Millisecond) }
		runAlgoSteps(t, l, mock, "k", []algoStep{
			{at: ms(0), n: 1, allowed: true, delay: 0, remaining: 2, rule: 0},
			{at: ms(0), n: 1, allowed: true, delay: 100 * time.Millisecond, remaining: 1, rule: 0},
			{at: ms(10), n: 1, allowed: true, delay: 190 * time.Millisecond, remaining: 0, rule: 0},
			{at: ms(20), n: 1, allowed: false, retry: 80 * time.Millisecond, remaining: -1, rule: 0},
			{at: ms(100), n: 1, allowed: true, delay: 200 * time.Millisecond, remaining: 0, rule: 0},
			{at: ms(1000), n: 1, allowed: true, delay: 0, remaining: 2, rule: 0},
		})
	})
}

// Rules of different algorithms on one key: all or nothing.
func TestMixedAlgorithmsAllOrNothing(t *testing.T) {
	rules := []Rule{
		{Limit: 3, Window: time.Minute, Type: Log},
		{Limit: 10, Window: time.Second, Type: TokenBucket, Burst: 10},
		{Limit: 100, Window: time.Hour},
	}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		ctx := context.Background()
		mock.Set(at(5, 0, 0))
		for i := range 5 {
			res, err := l.Allow(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, i < 3, res.Allowed, "request %d", i)
		}
		st, err := l.State(ctx, "k", nil)
		require.NoError(t, err)
		assert.Equal(t, []int64{0, 7, 97}, []int64{st[0].Remaining, st[1].Remaining, st[2].Remaining},
			"the denied requests took nothing from the token bucket or the hour")
	})
}

// The async mode for every algorithm: each node decides on the store's
// state of its last sync (a bucket's arrival time, the windows' counts) and
// its own cost since; window rules (a Log rule counts in buckets in this
// mode) by the share policy. Four nodes round robin at twice the rate admit
// the rate, give or take what one node cannot see of the others within a
// sync period.
func TestAsyncAlgorithms(t *testing.T) {
	over := map[Algorithm]float64{Fixed: 1.03, Sliding: 1.03, TokenBucket: 1.03, LeakyBucket: 1.03, Bucketed: 1.06, Log: 1.06}
	for _, rule := range []Rule{
		{Limit: 400, Window: time.Second, Type: Fixed},
		{Limit: 400, Window: time.Second, Type: Sliding},
		{Limit: 400, Window: time.Second, Type: TokenBucket, Burst: 40},
		{Limit: 400, Window: time.Second, Type: LeakyBucket, Burst: 40},
		{Limit: 400, Window: time.Second, Type: Bucketed, Buckets: 10},
		{Limit: 400, Window: time.Second, Type: Log},
	} {
		t.Run(rule.Type.String(), func(t *testing.T) {
			mock := &stepClock{Mock: clock.NewMock()}
			mock.Set(at(4, 0, 0))
			mem := store.NewMemory(mock)
			var nodes []*Limiter
			for i := range 4 {
				l, err := New(Config{Rules: []Rule{rule}, Mode: ModeAsync, Store: mem, SyncRate: 100 * time.Millisecond,
					Clock: mock, Manual: true, Seed: uint64(i + 1)})
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				nodes = append(nodes, l)
			}
			ctx := context.Background()
			start := mock.Now()
			admitted := 0
			gap := time.Second / 800
			for i := 0; i < 8*800; i++ {
				now := start.Add(time.Duration(i) * gap)
				mock.Set(now)
				if i%80 == 0 { // every 100 ms, staggered by a quarter period
					_ = nodes[i/80%4].Sync(ctx)
				}
				if i%20 == 0 {
					_ = nodes[i/20%4].Sync(ctx)
				}
				res, err := nodes[i%4].Allow(ctx, "k")
				require.NoError(t, err)
				if res.Allowed && i >= 2*800 {
					admitted++
				}
			}
			perSecond := float64(admitted) / 6
			t.Logf("%v: %.0f admitted per second for a rate of 400", rule, perSecond)
			assert.GreaterOrEqual(t, perSecond, 400*0.97)
			assert.LessOrEqual(t, perSecond, 400*over[rule.Type])
		})
	}
}

// A LeakyBucket rule delays requests as a queue served at the rate does:
// each request waits for the requests ahead of it to leave, one interval
// per unit of cost, and is refused when it would wait for more than the
// queue holds. Random arrivals, the queue as a reference.
func TestLeakyBucketMatchesAQueue(t *testing.T) {
	const interval = 50 * time.Millisecond // 20 per second
	rules := []Rule{{Limit: 20, Window: time.Second, Type: LeakyBucket, Burst: 6}}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		rng := rand.New(rand.NewPCG(3, 4))
		now := at(3, 0, 0)
		var free time.Time // when the queue's last admitted request has left
		for i := range 2000 {
			now = now.Add(time.Duration(rng.ExpFloat64() * float64(40*time.Millisecond)).Truncate(time.Microsecond))
			mock.Set(now)
			n := 1 + rng.Int64N(2)
			start := now // the request's turn
			if free.After(start) {
				start = free
			}
			fits := start.Add(time.Duration(n)*interval).Sub(now) <= 6*interval
			res, err := l.AllowN(context.Background(), "q", n)
			require.NoError(t, err)
			require.Equal(t, fits, res.Allowed, "request %d", i)
			if fits {
				require.Equal(t, start.Sub(now), res.Delay, "request %d: its wait", i)
				free = start.Add(time.Duration(n) * interval)
			} else {
				require.Equal(t, start.Add(time.Duration(n)*interval).Sub(now)-6*interval, res.RetryAfter, "request %d", i)
			}
		}
	})
}
