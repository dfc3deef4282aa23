package hybridlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A node that decides a key of a Bucketed rule (or of a Log rule in
// ModeAsync, which counts in buckets) for the first time, or for the
// first time since an earlier bucket than the previous one, reads every
// bucket of the store still in the window at its first sync, not only the
// previous one. Nodes A and B fill the window in its first buckets; node
// C, new to the key or last seen on it in the window's first bucket,
// decides it in a later bucket: after its first sync it sees the limit
// reached and admits nothing more.
func TestAsyncNodeReadsEveryBucketOfAKeyNewToIt(t *testing.T) {
	type storeCase struct {
		name string
		new  func(t *testing.T, c clock.Clock) store.Store
	}
	stores := []storeCase{
		{"memory", func(t *testing.T, c clock.Clock) store.Store { return store.NewMemory(c) }},
		{"redis", func(t *testing.T, _ clock.Clock) store.Store { return storetest.Redis(t, redistest.Client(t)) }},
		{"cluster", func(t *testing.T, _ clock.Clock) store.Store {
			return storetest.Redis(t, redistest.ClusterClient(t))
		}},
	}
	// Buckets of 100ms (Bucketed, 10 buckets) and of 200ms (Log, 5 buckets
	// of two sync periods): A counts 50 in the window's first bucket, B 50
	// in its second, and C decides in the next to last.
	rules := []struct {
		name string
		rule Rule
		b    time.Duration // a bucket
		n    int           // buckets per window
	}{
		{"bucketed", Rule{Limit: 100, Window: time.Second, Type: Bucketed, Buckets: 10}, 100 * time.Millisecond, 10},
		{"log", Rule{Limit: 100, Window: time.Second, Type: Log}, 200 * time.Millisecond, 5},
	}
	for _, sc := range stores {
		for _, rc := range rules {
			for _, policy := range []AsyncPolicy{Naive, Share} {
				for _, returning := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/%s/%v/returning=%v", sc.name, rc.name, policy, returning), func(t *testing.T) {
						mock := &stepClock{Mock: clock.NewMock()}
						// A future instant on a second's boundary: the Redis
						// counters expire after it, not at once.
						start := time.Now().Truncate(time.Second).Add(time.Hour)
						mock.Set(start)
						st := sc.new(t, mock)
						prefix := redistest.Prefix(t)
						var nodes []*Limiter
						for i := range 3 {
							l, err := New(Config{
								Rules: []Rule{rc.rule}, Mode: ModeAsync, Store: st, Prefix: prefix,
								SyncRate: 100 * time.Millisecond, AsyncPolicy: policy, Clock: mock, Manual: true, Seed: uint64(i + 1), ClockSync: -1,
							})
							require.NoError(t, err)
							t.Cleanup(func() { _ = l.Close(context.Background()) })
							nodes = append(nodes, l)
						}
						a, b, c := nodes[0], nodes[1], nodes[2]
						ctx := context.Background()
						at := func(d time.Duration) { mock.Set(start.Add(d)) }
						allow := func(l *Limiter, n int) int {
							got := 0
							for range n {
								res, err := l.Allow(ctx, "k")
								require.NoError(t, err)
								if res.Allowed {
									got++
								}
							}
							return got
						}
						admitted := 0
						at(rc.b / 4)
						if returning {
							require.Equal(t, 1, allow(c, 1))
							require.NoError(t, c.Sync(ctx))
							admitted++
						}
						admitted += allow(a, 50)
						require.NoError(t, a.Sync(ctx))
						at(rc.b + rc.b/4)
						admitted += allow(b, 50)
						require.NoError(t, b.Sync(ctx))
						require.GreaterOrEqual(t, admitted, 100, "A and B fill the window")
						// C decides the key in the window's next to last
						// bucket: its previous bucket holds nothing.
						at(time.Duration(rc.n-2)*rc.b + rc.b/4)
						first := allow(c, 1)
						require.NoError(t, c.Sync(ctx))
						assert.Equal(t, 0, allow(c, 150), "after its first sync C sees the %d of the window's first buckets", admitted+first)
						s, err := c.State(ctx, "k", nil)
						require.NoError(t, err)
						assert.Equal(t, int64(0), s[0].Remaining)
					})
				}
			}
		}
	}
}
