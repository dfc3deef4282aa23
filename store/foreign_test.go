package store_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Foreign values in the keys of the Redis store: something other than the
// library wrote a counter (a hash, a list, a string that is not an
// integer, an integer out of range). Such a counter fails on its own: the
// other counters of its batch or Take are applied once and reported
// applied, and nothing the store reports failed was applied.

// foreign writes a value of the given kind at key.
func foreign(t *testing.T, c *redis.Client, key, kind string) {
	t.Helper()
	ctx := context.Background()
	var err error
	switch kind {
	case "hash":
		err = c.HSet(ctx, key, "f", "1").Err()
	case "list":
		err = c.RPush(ctx, key, "1").Err()
	case "text":
		err = c.Set(ctx, key, "not a number", 0).Err()
	case "float":
		err = c.Set(ctx, key, "1.5", 0).Err()
	case "badlist":
		err = c.RPush(ctx, key, "not a number").Err()
	case "big":
		err = c.Set(ctx, key, strconv.FormatInt(-1<<62, 10), 0).Err()
	case "max":
		err = c.Set(ctx, key, strconv.FormatInt(1<<63-1, 10), 0).Err()
	default:
		t.Fatalf("kind %q", kind)
	}
	require.NoError(t, err)
}

func getInt(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	v, err := c.Get(context.Background(), key).Int64()
	if err == redis.Nil {
		return 0
	}
	require.NoError(t, err)
	return v
}

// A batch reading or writing a foreign counter beside good ones: the
// sync loop pushes the same increments again in a new batch after a
// failure, so a batch reported failed that had applied some of its
// counters would count them again at every cycle.
func TestRedisPushForeignCounter(t *testing.T) {
	c := redistest.Client(t)
	s := storetest.Redis(t, c)
	ctx := context.Background()
	const w = 60_000
	id := future / w
	gcra := store.Counter{Rate: 1000, Burst: 5}
	for _, kind := range []string{"hash", "list", "text", "float", "max", "big"} {
		for _, oc := range []struct {
			name string
			op   store.Op
		}{
			{"read", store.Op{Counter: store.Counter{Window: w, ID: id - 1}}}, // the previous window
			{"incr", store.Op{Counter: store.Counter{Window: w, ID: id - 1}, Delta: 2}},
			{"correction", store.Op{Counter: store.Counter{Window: w, ID: id - 1}, Delta: -1}},
			{"bucket-read", store.Op{Counter: store.Counter{Window: w, ID: id - 1, Span: 3}}},
			{"bucket-incr", store.Op{Counter: store.Counter{Window: w, ID: id - 1, Span: 3}, Delta: 1}},
			{"arrival", store.Op{Counter: gcra, Delta: 1}},
		} {
			bad := oc.op
			if (kind == "max" || kind == "big") && bad.Delta < 0 {
				continue // an integer that a correction can lower: not foreign to it
			}
			t.Run(kind+"/"+oc.name, func(t *testing.T) {
				pfx := redistest.Prefix(t)
				bad.Key = "bad"
				badKey := store.CounterKey(pfx, bad.Counter)
				foreign(t, c, badKey, kind)
				before, _ := c.Get(ctx, badKey).Result()
				good := store.CounterKey(pfx, store.Counter{Key: "bad", Window: w, ID: id})
				for seq := uint64(1); seq <= 3; seq++ {
					// The same key, so the same group; the good counter
					// comes first and again after the bad one.
					b := batch(s, pfx, "n", "bad", seq, op(w, id, 1), bad, op(w, id+1, 1))
					b.Ops[1].Key = "bad"
					require.NoError(t, s.Push(ctx, []*store.Batch{b}))
					assert.Equal(t, int64(seq), getInt(t, c, good), "cycle %d: each increment applied once", seq)
					require.Equal(t, store.Applied, b.Status, "cycle %d: %v", seq, b.Err)
					require.ErrorIs(t, b.Err, store.ErrForeign, "the foreign counter is reported")
					assert.Equal(t, []bool{false, true, false}, b.Refused, "cycle %d", seq)
					assert.Equal(t, []int64{int64(seq), 0, int64(seq)}, b.Totals, "cycle %d", seq)
				}
				// The same Batch, reused for a clean push: nothing refused.
				b := batch(s, pfx, "n", "bad", 4, op(w, id, 1))
				b.Refused = []bool{true}
				push(t, s, b)
				assert.Empty(t, b.Refused)
				if kind == "hash" || kind == "list" {
					typ, err := c.Type(ctx, badKey).Result()
					require.NoError(t, err)
					assert.Equal(t, kind, typ, "the foreign value is left as it is")
				} else {
					after, err := c.Get(ctx, badKey).Result()
					require.NoError(t, err)
					assert.Equal(t, before, after, "the foreign value is left as it is")
				}
			})
		}
	}
}

// A batch's identity is its Node, Group and Seq. A node that starts again
// under the identity of a node that pushed before it, counting Seq from 1
// again, has its batches taken for ones applied before, and dropped, until
// its Seq passes the old marker or the marker expires: a Node must not be
// reused (the limiter draws a random one per Limiter). A new Node is
// applied from its first batch.
func TestRedisPushNodeReuse(t *testing.T) {
	c := redistest.Client(t)
	s := storetest.Redis(t, c)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	for seq := uint64(1); seq <= 5; seq++ {
		push(t, s, batch(s, pfx, "old", "k", seq, op(w, id, 1)))
	}
	again := batch(s, pfx, "old", "k", 1, op(w, id, 1))
	push(t, s, again)
	assert.Equal(t, []int64{5}, again.Totals, "the same Node and Seq: a duplicate, not applied")
	fresh := batch(s, pfx, "new", "k", 1, op(w, id, 1))
	push(t, s, fresh)
	assert.Equal(t, []int64{6}, fresh.Totals, "a new Node's first batch is applied")
}
