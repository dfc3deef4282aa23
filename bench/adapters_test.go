package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
)

// A decider makes one decision of cost 1 for key and reports whether it
// was admitted. Every limiter under test is wrapped in one, so that every
// benchmark pays the same interface call.
type decider interface {
	allow(key string) bool
	close()
}

// limit is one rule in the benchmarks' terms: n requests per window.
type limit struct {
	n      int64
	window time.Duration
}

// Rule sets. The limits are high enough that every benchmarked decision is
// admitted (the common path of a warm key); the smoke test uses small ones.
var (
	oneRule    = []limit{{1e9, time.Minute}}
	threeRules = []limit{{1e8, time.Second}, {1e9, time.Minute}, {1e10, time.Hour}}
)

// impl builds a decider for a rule set. redis is nil for the local
// implementations; prefix isolates the counters of one benchmark in Redis.
type impl struct {
	name string
	// multi reports whether the implementation expresses several rules
	// natively (hybridlimit) or only by chaining one limiter per rule.
	multi bool
	new   func(tb testing.TB, rules []limit) decider
}

var ctx = context.Background()

// --- hybridlimit ---

func hybridRules(rules []limit) []hybridlimit.Rule {
	var out []hybridlimit.Rule
	for _, r := range rules {
		out = append(out, hybridlimit.Rule{Limit: r.n, Window: r.window})
	}
	return out
}

type hybrid struct{ l *hybridlimit.Limiter }

func (h hybrid) allow(key string) bool {
	res, err := h.l.Allow(ctx, key)
	return err == nil && res.Allowed
}

func (h hybrid) close() { _ = h.l.Close(ctx) }

func newHybrid(tb testing.TB, cfg hybridlimit.Config) hybrid {
	tb.Helper()
	l, err := hybridlimit.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return hybrid{l}
}

func hybridLocal(tb testing.TB, rules []limit) decider {
	return newHybrid(tb, hybridlimit.Config{Rules: hybridRules(rules)})
}

// hybridAsync runs the real sync loop against the test Redis every 100ms
// (the default SyncRate) while the benchmark decides.
func hybridAsync(tb testing.TB, rules []limit) decider {
	return newHybrid(tb, hybridlimit.Config{
		Rules:  hybridRules(rules),
		Mode:   hybridlimit.ModeAsync,
		Store:  storetest.Redis(tb, hybridClient(tb)),
		Prefix: redistest.Prefix(tb),
	})
}

// hybridAsyncManual is hybridAsync without the background sync loop.
func hybridAsyncManual(tb testing.TB, rules []limit) decider {
	return newHybrid(tb, hybridlimit.Config{
		Rules:  hybridRules(rules),
		Mode:   hybridlimit.ModeAsync,
		Store:  storetest.Redis(tb, hybridClient(tb)),
		Prefix: redistest.Prefix(tb),
		Manual: true,
	})
}

func hybridSync(tb testing.TB, rules []limit) decider {
	return newHybrid(tb, hybridlimit.Config{
		Rules:  hybridRules(rules),
		Mode:   hybridlimit.ModeSynchronous,
		Store:  storetest.Redis(tb, hybridClient(tb)),
		Prefix: redistest.Prefix(tb),
	})
}

// hybridSyncCluster is hybridSync on the test topology's Redis Cluster.
func hybridSyncCluster(tb testing.TB, rules []limit) decider {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(tb), ContextTimeoutEnabled: true})
	tb.Cleanup(func() { _ = c.Close() })
	return newHybrid(tb, hybridlimit.Config{
		Rules:  hybridRules(rules),
		Mode:   hybridlimit.ModeSynchronous,
		Store:  storetest.Redis(tb, c),
		Prefix: redistest.Prefix(tb),
	})
}

// hybridClient returns a client of the test server configured as the
// README configures hybridlimit's: go-redis ends a call at its context's
// deadline itself (ContextTimeoutEnabled), so that the store need not run
// each call on a goroutine of its own to end it there.
func hybridClient(tb testing.TB) *redis.Client {
	o := *redistest.Client(tb).Options()
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(&o)
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// --- chaining for the peers that take one rule per limiter ---

// chain admits a request when every limiter admits it, asking them in
// order. Unlike hybridlimit it is not atomic: when a later limiter denies,
// the earlier ones have already consumed the request. That is what users of
// these libraries write to enforce several windows.
type chain []decider

func (c chain) allow(key string) bool {
	for _, d := range c {
		if !d.allow(key) {
			return false
		}
	}
	return true
}

func (c chain) close() {
	for _, d := range c {
		d.close()
	}
}

// chained returns a chain of one limiter per rule (a single limiter for
// one rule). The chain asks the rules from the last (the longest window in
// threeRules) to the first, so that a peer that denies although the
// limits are not reached (sethvargo's memorystore refills only
// delta·Interval/Tokens tokens at a new interval, a handful for Tokens
// above about √(Interval in ns): sethvargo/go-limiter#29, hit by the
// one-second rule of one hot key after its first second) still asks every
// limiter before the one that denies: its decision does the work of an
// admitted one, where in rule order it stopped at the first limiter and
// skipped the other two.
func chained(one func(tb testing.TB, r limit) decider) func(tb testing.TB, rules []limit) decider {
	return func(tb testing.TB, rules []limit) decider {
		if len(rules) == 1 {
			return one(tb, rules[0])
		}
		var c chain
		for i := len(rules) - 1; i >= 0; i-- {
			c = append(c, one(tb, rules[i]))
		}
		return c
	}
}

// --- golang.org/x/time/rate: a token bucket per key, in a sync.Map ---

// xrate keeps one rate.Limiter per key and rule in a sync.Map, the usual
// way to limit per key with x/time/rate (which has no notion of keys).
type xrate struct {
	m     sync.Map // key -> []*rate.Limiter
	rules []limit
}

func newXRate(_ testing.TB, rules []limit) decider { return &xrate{rules: rules} }

func (x *xrate) allow(key string) bool {
	v, ok := x.m.Load(key)
	if !ok {
		ls := make([]*rate.Limiter, len(x.rules))
		for i, r := range x.rules {
			ls[i] = rate.NewLimiter(rate.Limit(float64(r.n)/r.window.Seconds()), int(r.n))
		}
		v, _ = x.m.LoadOrStore(key, ls)
	}
	// One clock read per decision, as hybridlimit makes: Allow would read
	// it once per rule.
	now := time.Now()
	for _, l := range v.([]*rate.Limiter) {
		if !l.AllowN(now, 1) {
			return false
		}
	}
	return true
}

func (x *xrate) close() {}

// --- github.com/ulule/limiter/v3 ---

type ululeLimiter struct{ l *ulule.Limiter }

func (u ululeLimiter) allow(key string) bool {
	c, err := u.l.Get(ctx, key)
	return err == nil && !c.Reached
}

func (u ululeLimiter) close() {}

func ululeMemory(_ testing.TB, r limit) decider {
	return ululeLimiter{ulule.New(ulmemory.NewStore(), ulule.Rate{Period: r.window, Limit: r.n})}
}

func ululeRedis(tb testing.TB, r limit) decider {
	st, err := ulredis.NewStoreWithOptions(redistest.Client(tb), ulule.StoreOptions{Prefix: redistest.Prefix(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	return ululeLimiter{ulule.New(st, ulule.Rate{Period: r.window, Limit: r.n})}
}

// --- github.com/sethvargo/go-limiter memorystore ---

type sethvargo struct {
	s interface {
		Take(context.Context, string) (uint64, uint64, uint64, bool, error)
		Close(context.Context) error
	}
}

func (s sethvargo) allow(key string) bool {
	_, _, _, ok, err := s.s.Take(ctx, key)
	return err == nil && ok
}

func (s sethvargo) close() { _ = s.s.Close(ctx) }

func sethvargoMemory(tb testing.TB, r limit) decider {
	st, err := memorystore.New(&memorystore.Config{Tokens: uint64(r.n), Interval: r.window})
	if err != nil {
		tb.Fatal(err)
	}
	return sethvargo{st}
}

// --- github.com/throttled/throttled/v2 memstore (GCRA) ---

type throttledLimiter struct{ l *throttled.GCRARateLimiterCtx }

func (t throttledLimiter) allow(key string) bool {
	limited, _, err := t.l.RateLimitCtx(ctx, key, 1)
	return err == nil && !limited
}

func (t throttledLimiter) close() {}

func throttledMemory(tb testing.TB, r limit) decider {
	st, err := memstore.NewCtx(0) // unbounded map: no LRU bookkeeping
	if err != nil {
		tb.Fatal(err)
	}
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{
		MaxRate:  throttled.PerDuration(int(r.n), r.window),
		MaxBurst: int(r.n) - 1, // burst counts beyond the first request
	})
	if err != nil {
		tb.Fatal(err)
	}
	return throttledLimiter{l}
}

// --- github.com/go-redis/redis_rate/v10 (GCRA in one Lua script) ---

type redisRate struct {
	l      *redis_rate.Limiter
	prefix string
	lim    redis_rate.Limit
}

func (r redisRate) allow(key string) bool {
	res, err := r.l.Allow(ctx, r.prefix+key, r.lim)
	return err == nil && res.Allowed > 0
}

func (r redisRate) close() {}

func newRedisRate(tb testing.TB, l limit) decider {
	var c redis.UniversalClient = redistest.Client(tb)
	return redisRate{
		l:      redis_rate.NewLimiter(c),
		prefix: redistest.Prefix(tb) + ":",
		lim:    redis_rate.Limit{Rate: int(l.n), Burst: int(l.n), Period: l.window},
	}
}

// The implementations under test, by family.
var (
	localImpls = []impl{
		{name: "hybridlimit-local", multi: true, new: hybridLocal},
		{name: "hybridlimit-async", multi: true, new: hybridAsync},
		{name: "x-time-rate", new: newXRate},
		{name: "ulule-memory", new: chained(ululeMemory)},
		{name: "sethvargo-memory", new: chained(sethvargoMemory)},
		{name: "throttled-memory", new: chained(throttledMemory)},
	}
	distImpls = []impl{
		{name: "hybridlimit-async", multi: true, new: hybridAsync},
		{name: "hybridlimit-sync", multi: true, new: hybridSync},
		{name: "redis-rate", new: chained(newRedisRate)},
		{name: "ulule-redis", new: chained(ululeRedis)},
	}
)

// keyNames returns n distinct keys.
func keyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%07d", i)
	}
	return keys
}
