package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// The store contract: every Store implementation passes the same tests.

func TestMemoryContract(t *testing.T) {
	runContract(t, func(t *testing.T) (store.Store, string) {
		return store.NewMemory(nil), "hl"
	})
}

func TestRedisContract(t *testing.T) {
	c := redistest.Client(t)
	runContract(t, func(t *testing.T) (store.Store, string) {
		s := store.NewRedis(c)
		t.Cleanup(func() { _ = s.Close() })
		return s, redistest.Prefix(t)
	})
}

// The same contract through go-redis pipelines (Cluster and Sentinel
// clients, or ViaClient) instead of the store's own connections.
func TestRedisViaClientContract(t *testing.T) {
	c := redistest.Client(t)
	runContract(t, func(t *testing.T) (store.Store, string) {
		return store.NewRedis(c, store.ViaClient()), redistest.Prefix(t)
	})
}

// A password and a database are honoured by the store's own connections.
func TestRedisFastPathHandshake(t *testing.T) {
	addr := redistest.Addr(t)
	admin := redistest.Client(t)
	ctx := context.Background()
	user := redistest.Prefix(t)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">secret", "~*", "+@all").Err())
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
	c := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: "secret", DB: 3})
	t.Cleanup(func() { _ = c.Close() })
	s := store.NewRedis(c)
	defer s.Close()
	k := store.CounterKey(store.KeyBase(user, "k"), 1000, 1)
	require.NoError(t, s.Apply(ctx, []store.Op{{Key: k, Delta: 5, ExpireAt: time.Now().Add(time.Minute).UnixMilli()}}))
	v, err := c.Get(ctx, k).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(5), v, "written to DB 3 as the user")
	assert.Equal(t, int64(0), admin.Exists(ctx, k).Val(), "not in DB 0")
	bad := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: "wrong"})
	t.Cleanup(func() { _ = bad.Close() })
	assert.Error(t, store.NewRedis(bad).Apply(ctx, []store.Op{{Key: k, Delta: 1}}))
}

// A batch whose reply is lost after Redis executed it is not counted twice
// when the caller pushes the same increments again.
func TestRedisFastPathExactlyOnce(t *testing.T) {
	proxy := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	direct := redistest.Client(t)
	s := store.NewRedis(c)
	defer s.Close()
	pfx := redistest.Prefix(t)
	base := store.KeyBase(pfx, "once")
	op := func(d int64) []store.Op {
		return []store.Op{{Base: base, WindowMs: 1000, ID: 7, Delta: d, ExpireAt: time.Now().Add(time.Minute).UnixMilli()},
			{Base: base, WindowMs: 1000, ID: 8, Delta: 1}}
	}
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, op(2)))

	proxy.DropReplies()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	assert.Error(t, s.Apply(short, op(5)), "the reply never comes")
	cancel()
	key := store.CounterKey(base, 1000, 7)
	assert.Equal(t, int64(7), mustInt(t, direct.Get(ctx, key)), "but Redis executed the batch")

	// Still unreachable: the next attempt fails before sending anything.
	proxy.Down()
	assert.Error(t, s.Apply(ctx, op(6)))
	proxy.Up()

	// The caller pushes the 5 again with 3 new ones: only the 3 are added.
	ops := op(8)
	require.NoError(t, s.Apply(ctx, ops))
	assert.Equal(t, int64(10), ops[0].Total)
	assert.Equal(t, int64(8), ops[0].Delta, "the caller's ops are left as it sent them")
	assert.Equal(t, int64(2), ops[1].Total, "window 8: 1 + the 1 owed is not added again, + 1 new")
	assert.Equal(t, int64(10), mustInt(t, direct.Get(ctx, key)))

	// A batch that failed before reaching Redis owes nothing.
	proxy.Down()
	assert.Error(t, s.Apply(ctx, op(4)))
	proxy.Up()
	ops = op(4)
	require.NoError(t, s.Apply(ctx, ops))
	assert.Equal(t, int64(14), ops[0].Total)
}

func TestRedisFastPathErrors(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	pfx := redistest.Prefix(t)
	s := store.NewRedis(c)
	defer s.Close()
	k := store.CounterKey(store.KeyBase(pfx, "text"), 1000, 1)
	require.NoError(t, c.Set(ctx, k, "not a number", time.Minute).Err())
	assert.ErrorContains(t, s.Apply(ctx, []store.Op{{Key: k, Delta: 1}}), "not an integer")
	assert.ErrorContains(t, s.Apply(ctx, []store.Op{{Key: k}}), "not an integer")
	// The connection was dropped, not reused mid-reply: the next call works.
	ok := store.CounterKey(store.KeyBase(pfx, "ok"), 1000, 1)
	ops := []store.Op{{Key: ok, Delta: 2}, {Key: ok}}
	require.NoError(t, s.Apply(ctx, ops))
	assert.Equal(t, []int64{2, 2}, []int64{ops[0].Total, ops[1].Total})
	// A large batch crosses the write buffer's flush size.
	big := make([]store.Op, 20_000)
	for i := range big {
		big[i] = store.Op{Key: store.CounterKey(store.KeyBase(pfx, fmt.Sprint("big", i%1000)), 1000, 1), Delta: 1, ExpireAt: time.Now().Add(time.Minute).UnixMilli()}
	}
	require.NoError(t, s.Apply(ctx, big))
	assert.Equal(t, int64(20), big[len(big)-1].Total)
}

func runContract(t *testing.T, open func(t *testing.T) (store.Store, string)) {
	t.Run("ApplyIncrementsAndReads", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		base := store.KeyBase(pfx, "user")
		k1, k2 := store.CounterKey(base, 1000, 7), store.CounterKey(base, 1000, 8)
		far := time.Now().Add(time.Hour).UnixMilli()
		ops := []store.Op{{Key: k1, Delta: 3, ExpireAt: far}, {Key: k1, Delta: 4}, {Key: k2}}
		require.NoError(t, s.Apply(ctx, ops))
		assert.Equal(t, []int64{3, 7, 0}, []int64{ops[0].Total, ops[1].Total, ops[2].Total})
		ops = []store.Op{{Key: k1}, {Key: k2}}
		require.NoError(t, s.Apply(ctx, ops))
		assert.Equal(t, int64(7), ops[0].Total)
		assert.Equal(t, int64(0), ops[1].Total, "a read never creates a counter")
		require.NoError(t, s.Apply(ctx, nil), "an empty batch is fine")
	})
	t.Run("ExpiryInThePastRemovesTheCounter", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		k := store.CounterKey(store.KeyBase(pfx, "gone"), 1000, 1)
		past := time.Now().Add(-time.Minute).UnixMilli()
		require.NoError(t, s.Apply(ctx, []store.Op{{Key: k, Delta: 5, ExpireAt: past}}))
		ops := []store.Op{{Key: k}}
		require.NoError(t, s.Apply(ctx, ops))
		assert.Equal(t, int64(0), ops[0].Total)
	})
	t.Run("ConcurrentApplyLosesNothing", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		k := store.CounterKey(store.KeyBase(pfx, "busy"), 1000, 1)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 50 {
					assert.NoError(t, s.Apply(ctx, []store.Op{{Key: k, Delta: 2}}))
				}
			})
		}
		wg.Wait()
		ops := []store.Op{{Key: k}}
		require.NoError(t, s.Apply(ctx, ops))
		assert.Equal(t, int64(800), ops[0].Total)
	})
	t.Run("TakeAdmitsUpToTheLimit", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		now := int64(1_800_000_000_000) // a minute boundary
		req := func(cost int64, peek bool) *store.TakeRequest {
			return newTake(pfx, "k", now+30_000, cost, peek, false, store.TakeRule{Limit: 5, WindowMs: 60_000})
		}
		var allowed []bool
		for _, cost := range []int64{2, 2, 2, 1, 1} {
			r := req(cost, false)
			require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
			require.NoError(t, r.Err)
			allowed = append(allowed, r.Allowed)
		}
		assert.Equal(t, []bool{true, true, false, true, false}, allowed)
		p := req(1, true)
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{p}))
		assert.False(t, p.Allowed)
		assert.Equal(t, []int64{5, 0}, p.Counts, "cur 5, prev 0")
	})
	t.Run("TakeWeighsThePreviousWindow", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		const w = 60_000
		id := int64(1_800_000_000_000) / w
		base := store.KeyBase(pfx, "slide")
		// Cloudflare's example: 42 in the previous minute, 18 in this one,
		// 15 s in: 42·0.75 + 18 = 49.5, so a limit of 50 admits nothing more
		// and a limit of 51 admits one.
		require.NoError(t, s.Apply(ctx, []store.Op{
			{Key: store.CounterKey(base, w, id-1), Delta: 42, ExpireAt: time.Now().Add(time.Hour).UnixMilli()},
			{Key: store.CounterKey(base, w, id), Delta: 18, ExpireAt: time.Now().Add(time.Hour).UnixMilli()},
		}))
		now := id*w + 15_000
		r := newTake(pfx, "slide", now, 1, false, false, store.TakeRule{Limit: 50, WindowMs: w})
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		assert.False(t, r.Allowed)
		assert.Equal(t, []int64{18, 42}, r.Counts)
		r = newTake(pfx, "slide", now, 1, false, false, store.TakeRule{Limit: 51, WindowMs: w})
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		assert.True(t, r.Allowed)
		assert.Equal(t, []int64{19, 42}, r.Counts)
		// A fixed window ignores the previous one.
		r = newTake(pfx, "slide", now, 1, false, false, store.TakeRule{Limit: 20, WindowMs: w, Fixed: true})
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		assert.True(t, r.Allowed)
		assert.Equal(t, []int64{20, 0}, r.Counts)
	})
	t.Run("TakeChecksEveryRuleBeforeCounting", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		now := int64(1_800_000_000_000)
		rules := []store.TakeRule{{Limit: 10, WindowMs: 1000}, {Limit: 2, WindowMs: 60_000}}
		var got []bool
		for range 3 {
			r := newTake(pfx, "multi", now, 1, false, false, rules...)
			require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
			got = append(got, r.Allowed)
		}
		assert.Equal(t, []bool{true, true, false}, got)
		r := newTake(pfx, "multi", now, 1, true, false, rules...)
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		assert.Equal(t, []int64{2, 0, 2, 0}, r.Counts, "the denied request counted in no rule")
	})
	t.Run("TakeCountDenied", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		now := int64(1_800_000_000_000)
		for _, want := range []bool{true, false, false} {
			r := newTake(pfx, "penalty", now, 1, false, true, store.TakeRule{Limit: 1, WindowMs: 1000})
			require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
			assert.Equal(t, want, r.Allowed)
		}
		r := newTake(pfx, "penalty", now, 1, true, false, store.TakeRule{Limit: 1, WindowMs: 1000})
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		assert.Equal(t, int64(3), r.Counts[0])
	})
	t.Run("TakeBatchAndBadRequests", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		now := int64(1_800_000_000_000)
		good := newTake(pfx, "batch", now, 1, false, false, store.TakeRule{Limit: 1, WindowMs: 1000})
		good2 := newTake(pfx, "batch", now, 1, false, false, store.TakeRule{Limit: 1, WindowMs: 1000})
		bad := newTake(pfx, "batch", now, 1, false, false, store.TakeRule{Limit: 1, WindowMs: 1000})
		bad.Keys = bad.Keys[:1]
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{good, bad, good2}))
		assert.NoError(t, good.Err)
		assert.True(t, good.Allowed)
		assert.NoError(t, good2.Err)
		assert.False(t, good2.Allowed, "requests of one batch are decided in order")
		assert.ErrorContains(t, bad.Err, "1 keys for 1 rules")
	})
	t.Run("TakeSetsExpiryOnNewCounters", func(t *testing.T) {
		s, pfx := open(t)
		ctx := context.Background()
		now := time.Now().UnixMilli()
		r := newTake(pfx, "exp", now, 1, false, false, store.TakeRule{Limit: 5, WindowMs: 1000})
		r.ExpireAt[0] = now - 1 // already past: the counter is gone at once
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		ops := []store.Op{{Key: r.Keys[0]}}
		require.NoError(t, s.Apply(ctx, ops))
		assert.Equal(t, int64(0), ops[0].Total)
	})
	t.Run("Time", func(t *testing.T) {
		s, _ := open(t)
		st, err := s.Time(context.Background())
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), st, 5*time.Second)
	})
	t.Run("CanceledContext", func(t *testing.T) {
		s, pfx := open(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.Error(t, s.Apply(ctx, []store.Op{{Key: store.CounterKey(store.KeyBase(pfx, "x"), 1, 1), Delta: 1}}))
	})
}

func newTake(pfx, key string, nowMs, cost int64, peek, countDenied bool, rules ...store.TakeRule) *store.TakeRequest {
	base := store.KeyBase(pfx, key)
	r := &store.TakeRequest{Rules: rules, NowUs: nowMs * 1000, Cost: cost, Peek: peek, CountDenied: countDenied}
	for _, rule := range rules {
		id := nowMs / rule.WindowMs
		r.Keys = append(r.Keys, store.CounterKey(base, rule.WindowMs, id), store.CounterKey(base, rule.WindowMs, id-1))
		r.ExpireAt = append(r.ExpireAt, store.ExpireAt(rule.WindowMs, id)+time.Now().UnixMilli())
	}
	r.Counts = make([]int64, 2*len(rules))
	return r
}

func TestMemoryExpiryFollowsItsClock(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(time.Unix(1000, 0))
	s := store.NewMemory(mock)
	ctx := context.Background()
	require.NoError(t, s.Apply(ctx, []store.Op{{Key: "a", Delta: 1, ExpireAt: 1_000_500}}))
	assert.Equal(t, int64(1), s.Get("a"))
	assert.Equal(t, 1, s.Len())
	mock.Add(499 * time.Millisecond)
	assert.Equal(t, int64(1), s.Get("a"))
	mock.Add(time.Millisecond)
	assert.Equal(t, int64(0), s.Get("a"))
	assert.Equal(t, 0, s.Len())
	st, err := s.Time(ctx)
	require.NoError(t, err)
	assert.Equal(t, time.Unix(1000, 500_000_000), st)
	assert.Equal(t, uint64(2), s.Calls())
}

// Keys are arbitrary bytes: no two keys share a counter, and every counter
// of a key carries the whole encoded key as its Redis Cluster hash tag.
func TestKeyEncoding(t *testing.T) {
	keys := []string{"a", "a}", "{a}", "}{", "a:b", "a b", "a\nb", "\x00\xff\xfe", "a:{b}:1000:1", strings.Repeat("x", 4096), "ключ", "a=="}
	seen := map[string]string{}
	for _, k := range keys {
		ck := store.CounterKey(store.KeyBase("hl", k), 1000, 5)
		if other, dup := seen[ck]; dup {
			t.Fatalf("keys %q and %q share counter %q", k, other, ck)
		}
		seen[ck] = k
		open := strings.IndexByte(ck, '{')
		end := strings.IndexByte(ck[open:], '}') + open
		tag := ck[open+1 : end]
		assert.Equal(t, store.KeyBase("hl", k), "hl:{"+tag+"}:", "the hash tag is the whole encoded key for %q", k)
		assert.NotContains(t, tag, "{")
		assert.True(t, strings.HasSuffix(ck, "}:1000:5"), fmt.Sprintf("%q", ck))
	}
}

func mustInt(t *testing.T, c *redis.StringCmd) int64 {
	t.Helper()
	v, err := c.Int64()
	require.NoError(t, err)
	return v
}
