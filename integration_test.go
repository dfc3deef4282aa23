package hybridlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Integration tests: several Limiters in this process act as nodes sharing
// one real redis-server.

func redisNodes(t *testing.T, c redis.UniversalClient, n int, cfg hybridlimit.Config) []*hybridlimit.Limiter {
	t.Helper()
	cfg.Store = storetest.Redis(t, c)
	if cfg.Prefix == "" {
		cfg.Prefix = redistest.Prefix(t)
	}
	var nodes []*hybridlimit.Limiter
	for range n {
		l, err := hybridlimit.New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	return nodes
}

func counter(t *testing.T, c redis.UniversalClient, prefix, key string, window time.Duration, at time.Time) int64 {
	t.Helper()
	wms := window.Milliseconds()
	k := store.CounterKey(prefix, store.Counter{Key: key, Window: wms, ID: at.UnixMilli() / wms})
	v, err := c.Get(context.Background(), k).Int64()
	if err == redis.Nil {
		return 0
	}
	require.NoError(t, err)
	return v
}

func TestRedisAsyncConvergence(t *testing.T) {
	c := redistest.PatientClient(t)
	pfx := redistest.Prefix(t)
	rules := []hybridlimit.Rule{{Limit: 1_000_000, Window: time.Hour}, {Limit: 10_000_000, Window: 24 * time.Hour, Type: hybridlimit.Fixed}}
	// A node reads a key back in its cycles only while it decided on it
	// within the last three sync periods: with SyncRate an hour (the
	// cycles are run by hand), a loaded machine cannot let that time pass
	// between the decisions and the Syncs below.
	nodes := redisNodes(t, c, 4, hybridlimit.Config{Rules: rules, Mode: hybridlimit.ModeAsync, Prefix: pfx, Manual: true, ClockSync: -1,
		StoreTimeout: exactTimeout, SyncRate: time.Hour})
	ctx := context.Background()
	keys := []string{"plain", "with space", "{braces}", "new\nline", "\x00\xffbin"}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for i, l := range nodes {
		wg.Go(func() {
			for j := range 500 * (i + 1) {
				res, err := l.Allow(ctx, keys[j%len(keys)])
				if assert.NoError(t, err) && res.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for range 2 { // the second round reads back what later nodes pushed
		for _, l := range nodes {
			require.NoError(t, l.Sync(ctx))
		}
	}
	now := time.Now()
	var total int64
	for _, k := range keys {
		v := counter(t, c, pfx, k, time.Hour, now)
		assert.Equal(t, v, counter(t, c, pfx, k, 24*time.Hour, now), "both rules count the same admissions of %q", k)
		total += v
		// Every node now sees the same cluster total for the key.
		for i, l := range nodes {
			st, err := l.State(ctx, k, nil)
			require.NoError(t, err)
			assert.Equal(t, rules[1].Limit-v, st[1].Remaining, "node %d, key %q", i, k)
		}
	}
	assert.Equal(t, admitted.Load(), total, "the store holds exactly what the nodes admitted")
	assert.Equal(t, int64(5000), total)
}

func TestRedisSynchronousExactness(t *testing.T) {
	c := redistest.PatientClient(t)
	nodes := redisNodes(t, c, 8, hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 1000, Window: time.Hour}, {Limit: 5000, Window: 24 * time.Hour}},
		Mode:  hybridlimit.ModeSynchronous,
		// Exactness, not latency: a decision past its deadline would be
		// decided Degraded, which a loaded machine must not cause here.
		StoreTimeout: exactTimeout,
	})
	admitted, degraded := decideExact(t, nodes, 32, 6) // 8 × 32 × 6 = 1536 requests for 1000
	assert.Equal(t, int64(0), degraded)
	assert.Equal(t, int64(1000), admitted)
	var calls uint64
	for _, l := range nodes {
		calls += l.Stats().StoreCalls
	}
	t.Logf("1536 synchronous decisions in %d round trips", calls)
	t.Logf("last error: %v", nodes[0].Stats().LastError)
}

func TestRedisOutageKeepsDecidingAndCatchesUp(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	direct := redistest.Client(t)
	pfx := redistest.Prefix(t)
	var errs atomic.Int64
	nodes := redisNodes(t, c, 3, hybridlimit.Config{
		Rules:        []hybridlimit.Rule{{Limit: 100_000, Window: time.Hour}},
		Mode:         hybridlimit.ModeAsync,
		SyncRate:     20 * time.Millisecond,
		StoreTimeout: 200 * time.Millisecond,
		Prefix:       pfx,
		OnError:      func(error) { errs.Add(1) },
	})
	ctx := context.Background()
	var admitted atomic.Int64
	phase := func(d time.Duration) {
		var wg sync.WaitGroup
		stop := time.Now().Add(d)
		for _, l := range nodes {
			wg.Go(func() {
				for i := 0; time.Now().Before(stop); i++ {
					res, err := l.Allow(ctx, fmt.Sprint("k", i%10))
					if !assert.NoError(t, err) {
						return
					}
					if res.Allowed {
						admitted.Add(1)
					}
					if i%100 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
	}
	start := time.Now()
	phase(200 * time.Millisecond)
	proxy.Down()
	before := admitted.Load()
	phase(500 * time.Millisecond)
	assert.Greater(t, admitted.Load(), before, "decisions go on during the outage")
	failing := false
	for _, l := range nodes {
		st := l.Stats()
		failing = failing || st.StoreFailing
		assert.Positive(t, st.Pending, "increments wait for the store")
	}
	assert.True(t, failing)
	assert.Positive(t, errs.Load())
	proxy.Up()
	phase(200 * time.Millisecond)
	for _, l := range nodes {
		require.NoError(t, l.Close(ctx))
	}
	var total int64
	for i := range 10 {
		total += counter(t, direct, pfx, fmt.Sprint("k", i), time.Hour, time.Now())
		if time.Now().Truncate(time.Hour) != start.Truncate(time.Hour) { // the run crossed an hour
			total += counter(t, direct, pfx, fmt.Sprint("k", i), time.Hour, start)
		}
	}
	assert.Equal(t, admitted.Load(), total, "after the outage, the store holds every admission")
	for _, l := range nodes {
		assert.Equal(t, uint64(0), l.Stats().Dropped)
	}
}

func TestRedisCloseFlushes(t *testing.T) {
	thisHour(t) // the counts are read in this hour's window
	c := redistest.Client(t)
	pfx := redistest.Prefix(t)
	nodes := redisNodes(t, c, 2, hybridlimit.Config{
		Rules:    []hybridlimit.Rule{{Limit: 1000, Window: time.Hour}},
		Mode:     hybridlimit.ModeAsync,
		SyncRate: time.Hour, // no cycle would run before Close
		Prefix:   pfx,
	})
	ctx := context.Background()
	for _, l := range nodes {
		for range 7 {
			_, err := l.Allow(ctx, "flush")
			require.NoError(t, err)
		}
	}
	assert.Equal(t, int64(0), counter(t, c, pfx, "flush", time.Hour, time.Now()))
	for _, l := range nodes {
		require.NoError(t, l.Close(ctx))
	}
	assert.Equal(t, int64(14), counter(t, c, pfx, "flush", time.Hour, time.Now()))
	// The counter expires after the next window.
	wms := time.Hour.Milliseconds()
	ttl, err := c.PTTL(ctx, store.CounterKey(pfx, store.Counter{Key: "flush", Window: wms, ID: time.Now().UnixMilli() / wms})).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, time.Hour)
	assert.LessOrEqual(t, ttl, 2*time.Hour+time.Minute)
}

// Every algorithm is exact in the synchronous mode: 10 nodes of 50
// goroutines each admit exactly what the rule admits in a quiet hour.
func TestRedisSynchronousExactnessEveryAlgorithm(t *testing.T) {
	c := redistest.PatientClient(t)
	for _, rule := range []hybridlimit.Rule{
		{Limit: 300, Window: time.Hour},
		{Limit: 300, Window: time.Hour, Type: hybridlimit.Fixed},
		{Limit: 300, Window: time.Hour, Type: hybridlimit.Bucketed, Buckets: 60},
		{Limit: 300, Window: time.Hour, Type: hybridlimit.Log},
		{Limit: 300, Window: time.Hour, Type: hybridlimit.TokenBucket},
		{Limit: 300, Window: time.Hour, Type: hybridlimit.LeakyBucket},
	} {
		t.Run(rule.Type.String(), func(t *testing.T) {
			thisHour(t) // a Fixed window must not end during the run
			nodes := redisNodes(t, c, 10, hybridlimit.Config{Rules: []hybridlimit.Rule{rule}, Mode: hybridlimit.ModeSynchronous, StoreTimeout: exactTimeout})
			admitted, degraded := decideExact(t, nodes, 50, 2) // 1000 requests for 300
			assert.Equal(t, int64(0), degraded)
			assert.Equal(t, int64(300), admitted)
		})
	}
}

// DomainTools' log in Redis: a list of the admitted instants, newest
// first, trimmed to the largest log limit and expiring after the longest
// log window.
func TestRedisLogTrimmedAndExpiring(t *testing.T) {
	c := redistest.Client(t)
	pfx := redistest.Prefix(t)
	nodes := redisNodes(t, c, 1, hybridlimit.Config{Prefix: pfx, Mode: hybridlimit.ModeSynchronous, Rules: []hybridlimit.Rule{
		{Limit: 1, Window: time.Second, Type: hybridlimit.Log}, {Limit: 5, Window: time.Minute, Type: hybridlimit.Log},
	}})
	ctx := context.Background()
	for range 8 {
		_, err := nodes[0].Allow(ctx, "client")
		require.NoError(t, err)
		time.Sleep(1100 * time.Millisecond / 8) // not all in one second
	}
	key := store.LogKey(pfx, "client")
	n, err := c.LLen(ctx, key).Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, n, int64(5))
	assert.Positive(t, n)
	ttl, err := c.PTTL(ctx, key).Result()
	require.NoError(t, err)
	// The longest log window past the newest entry, plus a minute.
	assert.LessOrEqual(t, ttl, 2*time.Minute)
	assert.Greater(t, ttl, 115*time.Second)
}

// exactTimeout is the StoreTimeout of the exactness tests: long enough that
// no decision misses its deadline (and is decided Degraded) because the
// machine is loaded. Their client is redistest.PatientClient, whose reply
// timeout is longer still.
const exactTimeout = 20 * time.Second

// decideExact has goroutines goroutines per node each ask each times for
// the key "exact", all at once, and returns how many requests were
// admitted and how many decided Degraded.
func decideExact(t *testing.T, nodes []*hybridlimit.Limiter, goroutines, each int) (admitted, degraded int64) {
	var a, d atomic.Int64
	var wg sync.WaitGroup
	for _, l := range nodes {
		for range goroutines {
			wg.Go(func() {
				for range each {
					res, err := l.Allow(context.Background(), "exact")
					if !assert.NoError(t, err) {
						return
					}
					if res.Allowed {
						a.Add(1)
					}
					if res.Degraded {
						d.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	return a.Load(), d.Load()
}

// thisHour returns the id of the current hour's window (one hour, in
// Unix ms), for a test that counts in it on the wall clock: within 30
// seconds of the hour's end it first waits for the next hour, so that the
// test does not run across a window boundary.
func thisHour(t *testing.T) int64 {
	t.Helper()
	now := time.Now()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 30*time.Second {
		time.Sleep(left + 10*time.Millisecond)
	}
	return time.Now().UnixMilli() / time.Hour.Milliseconds()
}
