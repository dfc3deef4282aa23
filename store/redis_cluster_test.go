package store_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// keyOn returns a user key whose counters live on shard.
func keyOn(shard redistest.ClusterShard, prefix string) string {
	for i := 0; ; i++ {
		k := prefix + strconv.Itoa(i)
		slot := store.Slot(k)
		for _, r := range shard.Slots {
			if slot >= r.Start && slot <= r.End {
				return k
			}
		}
	}
}

// Route names a key's master once a call went to its slot: keys of one
// master share a route, keys of different masters do not, and a slot no
// call went to yet is on route 0. A standalone store has one route.
func TestRedisClusterRoute(t *testing.T) {
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	rule := wr(100, 60_000)
	var keys [3][2]string
	for i, sh := range shards {
		keys[i] = [2]string{keyOn(sh, "a"), keyOn(sh, "b")}
		require.NotEqual(t, store.Slot(keys[i][0]), store.Slot(keys[i][1]))
	}
	for i := range keys {
		assert.Zero(t, s.Route(pfx, keys[i][0]), "before any call")
	}
	for i := range keys {
		take(t, s, newTake(pfx, keys[i][0], future, 1, true, false, rule))
	}
	// The second key of each master is on a slot no call went to: its
	// route is read from the client's slot map, and is its master's.
	routes := map[int]bool{}
	for i := range keys {
		r := s.Route(pfx, keys[i][0])
		assert.NotZero(t, r, "a key whose slot was called")
		assert.Equal(t, r, s.Route(pfx, keys[i][1]), "two keys of one master, one of them on a slot not called yet")
		routes[r] = true
	}
	assert.Len(t, routes, 3, "three masters, three routes")

	one, err := store.NewRedis(redistest.Client(t), store.RedisOptions{})
	require.NoError(t, err)
	take(t, one, newTake(pfx, "k", future, 1, true, false, rule))
	assert.Zero(t, one.Route(pfx, "k"))
}

// One master of the cluster hangs (SIGSTOP, shorter than the cluster's
// node timeout, so no failover) while a Push and a Take carry calls for
// every shard. The calls to the healthy masters are applied and reported
// so, and their circuits stay closed; only the hung master's calls are in
// doubt. (go-redis' cluster pipeline, when the context ends during its
// retries for the hung node, sets the context's error on every command of
// the pipeline, including those other masters answered.)
func TestRedisClusterHungMasterFailsOnlyItsCalls(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t),
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	rule := wr(100, w)
	var keys []string
	for _, sh := range shards {
		keys = append(keys, keyOn(sh, "k"))
	}
	// Warm: every master has the scripts cached and a connection open.
	for _, k := range keys {
		push(t, s, batch(s, pfx, "n", k, 1, op(w, id, 1)))
		take(t, s, newTake(pfx, k, future, 1, false, false, rule))
	}

	srv := redistest.ServerAt(t, shards[1].Master)
	srv.Stop()
	var bs []*store.Batch
	var rs []*store.TakeRequest
	for _, k := range keys {
		bs = append(bs, batch(s, pfx, "n", k, 2, op(w, id, 1)))
		r := newTake(pfx, k, future, 1, false, false, rule)
		r.Deadline = time.Now().Add(150 * time.Millisecond).UnixMicro()
		rs = append(rs, r)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		assert.NoError(t, s.Push(ctx, bs))
	})
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		assert.NoError(t, s.Take(ctx, rs))
	})
	wg.Wait()
	srv.Cont()

	for i, k := range keys {
		if i == 1 {
			assert.NotEqual(t, store.Applied, bs[i].Status, "push to the hung master")
			assert.NotEqual(t, store.Applied, rs[i].Status, "take on the hung master")
			continue
		}
		assert.Equal(t, store.Applied, bs[i].Status, "push of %q to a healthy master: %v", k, bs[i].Err)
		assert.Equal(t, store.Applied, rs[i].Status, "take of %q on a healthy master: %v", k, rs[i].Err)
		// The healthy masters' circuits are closed: a call goes out.
		r := newTake(pfx, k, future, 1, true, false, rule)
		require.NoError(t, s.Take(context.Background(), []*store.TakeRequest{r}))
		assert.Equal(t, store.Applied, r.Status, "take of %q on a healthy master after the hang: %v", k, r.Err)
		if r.Status == store.Applied {
			assert.Equal(t, int64(4), r.Counts[0].Cur, "key %q: two pushes and two takes of 1", k)
		}
	}
}

// Two batches of one group in one Push while their slot migrates: the
// older one creates a counter, which the source master refuses
// (TRYAGAIN: the slot's keys are not all there); the newer one touches
// only keys the source still has. The replies are lost, so both are in
// doubt, and sent again unchanged once the migration is called off. The
// newer one must not have been applied alone: its marker would make the
// older one look applied when sent again, and its increments would be
// lost.
func TestRedisClusterPushOrderDuringMigration(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	p := redistest.NewProxy(t, shards[0].Master)
	dialer := &net.Dialer{Timeout: time.Second}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == shards[0].Master {
				addr = p.Addr()
			}
			return dialer.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	old := keyOn(shards[0], "o")
	g := s.Group(old)
	var fresh string
	for i := 0; fresh == ""; i++ {
		if k := "f" + strconv.Itoa(i); store.Slot(k) == g {
			fresh = k
		}
	}
	push(t, s, batch(s, pfx, "n", old, 1, op(w, id, 1))) // the marker and old's counter, on the source

	ctx := context.Background()
	src, _, _, stable := redistest.MigratingSlot(t, g, shards[0], shards[1])
	p.DropReplies()
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	bs := []*store.Batch{batch(s, pfx, "n", fresh, 2, op(w, id, 5)), batch(s, pfx, "n", old, 3, op(w, id, 1))}
	require.NoError(t, s.Push(pctx, bs))
	cancel()
	for _, b := range bs {
		require.Equal(t, store.InDoubt, b.Status, "%v", b.Err)
	}
	stable() // the migration is called off
	p.Up()

	// The batches in doubt are sent again, unchanged, until applied.
	require.Eventually(t, func() bool {
		again := []*store.Batch{batch(s, pfx, "n", fresh, 2, op(w, id, 5)), batch(s, pfx, "n", old, 3, op(w, id, 1))}
		require.NoError(t, s.Push(ctx, again))
		return again[0].Status == store.Applied && again[1].Status == store.Applied
	}, 10*time.Second, 50*time.Millisecond)
	for k, want := range map[string]int64{fresh: 5, old: 2} {
		v, err := src.Get(ctx, store.CounterKey(pfx, store.Counter{Key: k, Window: w, ID: id})).Int64()
		if !errors.Is(err, redis.Nil) {
			require.NoError(t, err)
		}
		assert.Equal(t, want, v, "key %q: every batch applied once", k)
	}
}

// evalCounter counts the EVAL commands a client sends.
type evalCounter struct{ n atomic.Int64 }

func (h *evalCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *evalCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}
func (h *evalCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}
func (h *evalCounter) count(cmd redis.Cmder) {
	if cmd.Name() == "eval" || cmd.Name() == "evalsha" {
		h.n.Add(1)
	}
}

// The batches of several slots of one master go in one push script call.
// A later batch whose slot the master is giving away, with one of its
// keys already gone, is refused whole before it changes anything, beside
// the call's other batches, which are applied; sent again once the
// migration is called off, it is applied once.
func TestRedisClusterPushCallSpansSlots(t *testing.T) {
	redistest.Destructive(t)
	shards := redistest.WaitClusterOK(t, 30*time.Second)
	require.Len(t, shards, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	t.Cleanup(func() { _ = c.Close() })
	evals := &evalCounter{}
	c.AddHook(evals)
	s, err := store.NewRedis(c, store.RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	keys := laneKeys(shards[0], 3)
	count := func(k string) int64 {
		t.Helper()
		v, err := c.Get(context.Background(), store.CounterKey(pfx, store.Counter{Key: k, Window: w, ID: id})).Int64()
		if !errors.Is(err, redis.Nil) {
			require.NoError(t, err)
		}
		return v
	}
	push(t, s, batch(s, pfx, "n", keys[0], 1, op(w, id, 1)), batch(s, pfx, "n", keys[1], 1, op(w, id, 2)), batch(s, pfx, "n", keys[2], 1, op(w, id, 3)))
	require.Equal(t, int64(1), evals.n.Load(), "one call for the three slots")
	for j, k := range keys {
		require.Equal(t, int64(j+1), count(k))
	}

	// keys[1]'s slot migrates; a key of it that the source does not hold
	// makes its batch refused.
	ctx := context.Background()
	g := store.Slot(keys[1])
	var fresh string
	for i := 0; fresh == ""; i++ {
		if k := "f" + strconv.Itoa(i); store.Slot(k) == g {
			fresh = k
		}
	}
	_, _, _, stable := redistest.MigratingSlot(t, g, shards[0], shards[1])
	bs := []*store.Batch{batch(s, pfx, "n", keys[0], 2, op(w, id, 10)), batch(s, pfx, "n", fresh, 2, op(w, id, 5)), batch(s, pfx, "n", keys[2], 2, op(w, id, 30))}
	require.NoError(t, s.Push(ctx, bs))
	require.Equal(t, int64(2), evals.n.Load(), "one call again")
	assert.Equal(t, store.Applied, bs[0].Status, "%v", bs[0].Err)
	assert.Equal(t, store.Failed, bs[1].Status, "%v", bs[1].Err)
	assert.Error(t, bs[1].Err)
	assert.Equal(t, store.Applied, bs[2].Status, "%v", bs[2].Err)
	assert.Equal(t, []int64{11}, bs[0].Totals)
	assert.Equal(t, []int64{33}, bs[2].Totals)
	stable()
	push(t, s, batch(s, pfx, "n", fresh, 2, op(w, id, 5)))
	push(t, s, batch(s, pfx, "n", fresh, 2, op(w, id, 5))) // sent again: applied before
	for k, want := range map[string]int64{keys[0]: 11, keys[1]: 2, fresh: 5, keys[2]: 33} {
		assert.Equal(t, want, count(k), "key %q: every batch applied once", k)
	}
}

// laneKeys returns n user keys of shard in n hash slots of one lane
// (RedisOptions.Lanes is 4): a Push or Take sends them in one pipeline.
func laneKeys(shard redistest.ClusterShard, n int) []string {
	var keys []string
	seen := map[int]bool{}
	lane := -1
	for i := 0; len(keys) < n; i++ {
		k := keyOn(shard, "s"+strconv.Itoa(i)+"-")
		g := store.Slot(k)
		if lane == -1 {
			lane = g % 4
		}
		if g%4 == lane && !seen[g] {
			seen[g] = true
			keys = append(keys, k)
		}
	}
	return keys
}
