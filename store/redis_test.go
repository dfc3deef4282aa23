package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// proxied returns a store whose client reaches the test server through a
// proxy, with short timeouts and no client retries.
func proxied(t *testing.T, o store.RedisOptions) (*store.Redis, *redistest.Proxy) {
	t.Helper()
	p := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, o)
	require.NoError(t, err)
	return s, p
}

// A Take whose requests go out as several script calls to one server (two
// sets of rules, as two tiers' keys have), whose reply is lost after the
// server ran them all, and which go-redis sends again: every call returns
// its first run's outcome, none is in doubt, and nothing is counted twice.
func TestRedisTakeRetryOfSeveralCalls(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: 1, DialTimeout: time.Second,
		ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	take(t, s, newTake(pfx, "warm", future, 1, false, false, wr(10, w))) // the server has the script cached

	p.DropReplies() // the server runs both calls; their answers never arrive
	time.AfterFunc(300*time.Millisecond, p.Up)
	rs := []*store.TakeRequest{
		newTake(pfx, "a", future, 1, false, false, wr(10, w)),
		newTake(pfx, "b", future, 1, false, false, wr(20, w)),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, s.Take(ctx, rs)) // go-redis sends the pipeline again after its read timeout
	direct := redistest.Client(t)
	for _, r := range rs {
		assert.Equal(t, store.Applied, r.Status, "key %q: %v", r.Key, r.Err)
		v, err := direct.Get(ctx, store.CounterKey(pfx, store.Counter{Key: r.Key, Window: w, ID: future / w})).Int64()
		require.NoError(t, err)
		assert.Equal(t, int64(1), v, "key %q counted once", r.Key)
	}
}

// A batch whose reply is lost is in doubt; sent again unchanged, it is
// applied once whether or not the first sending was.
func TestRedisLostReplyIsAppliedOnce(t *testing.T) {
	s, p := proxied(t, store.RedisOptions{BreakerMin: -1})
	direct := redistest.Client(t)
	pfx := redistest.Prefix(t)
	ctx := context.Background()
	const w = 60_000
	id := future / w

	push(t, s, batch(s, pfx, "n0", "warm", 1, op(w, id, 1))) // the server has the script cached
	p.DropReplies()                                          // the server runs the script; its answer never arrives
	b := batch(s, pfx, "n1", "lost", 1, op(w, id, 5))
	require.NoError(t, s.Push(ctx, []*store.Batch{b}))
	assert.Equal(t, store.InDoubt, b.Status, "%v", b.Err)
	key := store.CounterKey(pfx, store.Counter{Key: "lost", Window: w, ID: id})
	v, err := direct.Get(ctx, key).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(5), v, "the server did apply it")

	p.Up()
	again := batch(s, pfx, "n1", "lost", 1, op(w, id, 5))
	require.NoError(t, s.Push(ctx, []*store.Batch{again}))
	require.Equal(t, store.Applied, again.Status, "%v", again.Err)
	assert.Equal(t, []int64{5}, again.Totals, "sent again: not applied twice")

	// A batch that never reached the server is applied by its second
	// sending.
	p.Down()
	b2 := batch(s, pfx, "n1", "lost", 2, op(w, id, 3))
	require.NoError(t, s.Push(ctx, []*store.Batch{b2}))
	assert.NotEqual(t, store.Applied, b2.Status)
	p.Up()
	again2 := batch(s, pfx, "n1", "lost", 2, op(w, id, 3))
	require.NoError(t, s.Push(ctx, []*store.Batch{again2}))
	require.Equal(t, store.Applied, again2.Status, "%v", again2.Err)
	assert.Equal(t, []int64{8}, again2.Totals)
}

// Redis-specific answers: a server without the script cached, a counter
// holding something else, and the counters' expiry.
func TestRedisScriptsAndExpiry(t *testing.T) {
	c := redistest.Client(t)
	s := storetest.Redis(t, c)
	pfx := redistest.Prefix(t)
	ctx := context.Background()
	const w = 60_000
	id := time.Now().UnixMilli() / w

	require.NoError(t, c.ScriptFlush(ctx).Err())
	b := batch(s, pfx, "n", "exp", 1, op(w, id, 2))
	push(t, s, b)
	key := store.CounterKey(pfx, store.Counter{Key: "exp", Window: w, ID: id})
	ttl, err := c.PTTL(ctx, key).Result()
	require.NoError(t, err)
	want := time.Until(time.UnixMilli(store.ExpireAt(w, id, 1)))
	assert.InDelta(t, float64(want), float64(ttl), float64(2*time.Second), "a counter expires a minute after its window stops counting")
	// A new counter beside a larger delta, a new counter with a negative
	// delta (a correction), and counters that held counts before, whose
	// expiry a push leaves alone.
	for seq, tc := range []struct{ first, second int64 }{{1, 100}, {-1, 5}, {3, 1}} {
		k := fmt.Sprint("exp", seq)
		keyNew := store.CounterKey(pfx, store.Counter{Key: k, Window: w, ID: id})
		keyOld := store.CounterKey(pfx, store.Counter{Key: k, Window: w, ID: id - 1})
		require.NoError(t, c.Set(ctx, keyOld, 50, time.Hour).Err())
		b := batch(s, pfx, "expiry", k, uint64(seq+1), op(w, id, tc.first), op(w, id-1, tc.second))
		push(t, s, b)
		ttl, err := c.PTTL(ctx, keyNew).Result()
		require.NoError(t, err)
		assert.InDelta(t, float64(want), float64(ttl), float64(2*time.Second), "case %d: the new counter's expiry", seq)
		ttl, err = c.PTTL(ctx, keyOld).Result()
		require.NoError(t, err)
		assert.InDelta(t, float64(time.Hour), float64(ttl), float64(2*time.Second), "case %d: an old counter's expiry is its own", seq)
	}

	require.NoError(t, c.ScriptFlush(ctx).Err())
	r := newTake(pfx, "exp", time.Now().UnixMilli(), 1, false, false, wr(10, w))
	take(t, s, r)
	assert.True(t, r.Allowed)

	bad := store.CounterKey(pfx, store.Counter{Key: "text", Window: w, ID: id})
	require.NoError(t, c.Set(ctx, bad, "not a number", time.Minute).Err())
	b = batch(s, pfx, "n", "text", 2, op(w, id, 1), op(w, id+1, 4))
	b.Ops[1].Key = "text"
	require.NoError(t, s.Push(ctx, []*store.Batch{b}))
	assert.Equal(t, store.Applied, b.Status)
	assert.ErrorContains(t, b.Err, "not an integer")
	assert.Equal(t, int64(4), b.Totals[1], "the other counters of the batch are applied")
}

func TestNewRedisErrors(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tt := range []struct {
		o    store.RedisOptions
		want string
	}{
		{store.RedisOptions{Lanes: 65}, "Lanes is 65, want 1 to 64"},
		{store.RedisOptions{Lanes: -1}, "Lanes is -1"},
		{store.RedisOptions{BreakerMin: time.Second, BreakerMax: time.Millisecond}, "BreakerMin is 1s and BreakerMax 1ms"},
		{store.RedisOptions{BreakerMin: -1, BreakerMax: time.Hour}, "BreakerMax is 1h0m0s with BreakerMin -1ns: BreakerMax applies only with the breaker on"},
		{store.RedisOptions{BreakerMin: -1, BreakerMax: -time.Hour}, "BreakerMax is -1h0m0s with BreakerMin -1ns"},
		{store.RedisOptions{WaitReplicas: -1}, "WaitReplicas is -1, want 0 to 64"},
		{store.RedisOptions{WaitTimeout: time.Second}, "WaitTimeout is 1s with WaitReplicas 0"},
		{store.RedisOptions{WaitReplicas: 1, WaitTimeout: time.Minute}, "WaitTimeout is 1m0s"},
	} {
		_, err := store.NewRedis(c, tt.o)
		assert.ErrorContains(t, err, tt.want)
	}
	var nilClient *redis.Client
	var nilCluster *redis.ClusterClient
	for _, nc := range []redis.UniversalClient{nil, nilClient, nilCluster} {
		_, err := store.NewRedis(nc, store.RedisOptions{})
		assert.ErrorContains(t, err, "the client is nil", "%T", nc)
		assert.False(t, errors.Is(err, store.ErrUnavailable))
	}
	_, err := store.NewRedis(c, store.RedisOptions{BreakerMin: -1})
	assert.NoError(t, err, "the breaker off, BreakerMax left 0")
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	_, err = store.NewRedis(cc, store.RedisOptions{WaitReplicas: 1})
	assert.ErrorContains(t, err, "a Redis Cluster client cannot send WAIT")
}

// With WaitReplicas, a call that too few replicas acknowledged is in
// doubt (the standalone test server has none); sent again it stays
// applied once, and a synchronous request is in doubt too.
func TestRedisWaitReplicas(t *testing.T) {
	s, _ := proxied(t, store.RedisOptions{WaitReplicas: 1, WaitTimeout: 5 * time.Millisecond, BreakerMin: -1})
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	ctx := context.Background()
	for range 2 {
		b := batch(s, pfx, "n", "k", 1, op(w, id, 3))
		require.NoError(t, s.Push(ctx, []*store.Batch{b}))
		assert.Equal(t, store.InDoubt, b.Status)
		assert.ErrorContains(t, b.Err, "0 of 1 replicas acknowledged")
	}
	got, err := redistest.Client(t).Get(ctx, store.CounterKey(pfx, store.Counter{Key: "k", Window: w, ID: id})).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(3), got, "applied once, though sent twice")
	r := newTake(pfx, "k", future, 1, false, false, wr(10, w))
	require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
	assert.Equal(t, store.InDoubt, r.Status)

	plain, _ := proxied(t, store.RedisOptions{})
	b := batch(plain, pfx, "n", "k", 2, op(w, id, 1))
	push(t, plain, b)
	assert.Equal(t, []int64{5}, b.Totals, "3 pushed, 1 taken (in doubt, but run), 1 pushed")
}

// With a standalone client, a Take's requests go out as one script call in
// one pipeline, whatever lanes their keys fall in: the server reads and
// answers one round trip per Take.
func TestRedisTakeIsOneCallPerTake(t *testing.T) {
	s := storetest.Redis(t, redistest.Client(t))
	pfx := redistest.Prefix(t)
	rules := []local.Rule{local.NewRule(local.Spec{Kind: local.Sliding, Limit: 100, Window: time.Minute})}
	now := time.Now().UnixMicro()
	var reqs []*store.TakeRequest
	lanes := map[int]bool{}
	for i := 0; len(lanes) < 4 || len(reqs) < 16; i++ {
		key := "k" + strconv.Itoa(i)
		lanes[s.Group(key)] = true
		reqs = append(reqs, &store.TakeRequest{Prefix: pfx, Key: key, Rules: rules, Now: now, Deadline: now + time.Minute.Microseconds(), Cost: 1})
	}
	ctx := context.Background()
	require.NoError(t, s.Take(ctx, reqs[:1])) // the server has the script cached
	before := s.Calls()
	require.NoError(t, s.Take(ctx, reqs))
	assert.Equal(t, uint64(1), s.Calls()-before, "pipelines sent for %d requests in %d lanes", len(reqs), len(lanes))
	for _, r := range reqs {
		require.Equal(t, store.Applied, r.Status, "%v", r.Err)
		assert.True(t, r.Allowed)
	}
}
