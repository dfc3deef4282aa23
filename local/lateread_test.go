package local

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Buckets rule's read of a closed bucket whose answer comes back after
// the counter rolled on once more still reaches the bucket's history: the
// bucket is still in the window, and no later take reads it again. Here
// the node's last read of bucket x as its current one is early in x+1,
// another node pushes its last increments of x after it (within a sync
// period of x's end, as nodes do), the node's first decision in x+1 comes
// late in it, and the take after it, which reads x as the previous bucket,
// is answered after a decision in x+2 rolled the counter over again. The
// node saw x without the other node's last increments for the rest of the
// window: 6 instead of 9. When that take's batch fails instead, the next
// take reads x with the older buckets.
func TestBucketReadAnsweredAfterARolloverIsKept(t *testing.T) {
	const bw = int64(100 * time.Millisecond)
	rule := NewRule(Spec{Kind: Buckets, Limit: 1000, Window: 4 * time.Duration(bw), Buckets: 4})
	cases := []struct {
		name   string
		delta  int64 // this node's increments of bucket x that the late read pushes
		failed bool  // the late read's batch fails: the next take reads x again
	}{
		{"a read", 0, false},
		{"a push", 2, false},
		{"a failed read", 0, true},
		{"a failed push", 2, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true, ReadPrev: bw})
			stored := map[int64]int64{}
			apply := func(ps []Push) []int64 {
				tot := make([]int64, len(ps))
				for k, p := range ps {
					stored[p.Win] += p.Delta
					tot[k] = stored[p.Win]
				}
				return tot
			}
			const x = int64(1000)
			at := func(id, ms int64) int64 { return id*bw + ms*int64(time.Millisecond) }
			// Bucket x: this node admits 3 and syncs, then 1 more; the
			// other node admits 5, of which it pushes 2 at once.
			require.True(t, allow(t, tb, "k", 3, at(x, 10)))
			e := entry(t, tb, "k")
			ps, _ := tb.Take(e, at(x, 20), nil)
			tb.Settle(e, at(x, 20), ps, apply(ps))
			stored[x] += 2
			require.True(t, allow(t, tb, "k", 1, at(x, 90)))
			// The next cycle, early in x+1: the counter is still in x, and
			// the take pushes and reads it as its current bucket.
			ps, _ = tb.Take(e, at(x+1, 5), nil)
			tb.Settle(e, at(x+1, 5), ps, apply(ps))
			if c.delta > 0 {
				// A decision of x that committed after that take: the late
				// read pushes it.
				require.True(t, allow(t, tb, "k", c.delta, at(x, 99)))
			}
			stored[x] += 3                                     // the other node's last increments of x
			require.True(t, allow(t, tb, "k", 1, at(x+1, 95))) // rolls over into x+1
			ps, _ = tb.Take(e, at(x+1, 99), nil)               // reads x, the previous bucket, once
			require.True(t, allow(t, tb, "k", 1, at(x+2, 1)))  // rolls over into x+2 while the read is on its way
			if c.failed {
				tb.Release(e, ps)
			} else {
				tb.Settle(e, at(x+2, 2), ps, apply(ps))
			}
			for range 3 { // the next syncs
				ps, _ = tb.Take(e, at(x+2, 50), nil)
				tb.Settle(e, at(x+2, 50), ps, apply(ps))
			}
			var v [1]Counts
			tb.View("k", at(x+2, 60), 1, v[:])
			require.Equal(t, []int64{stored[x-1], stored[x], stored[x+1], stored[x+2]}, v[0].Buckets, "buckets x-1…x+2 as this node sees them, and in the store")
		})
	}
}
