package local

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// With buckets of one sync period (the shortest New accepts in ModeAsync),
// a bucket stops being the previous one a period after it ends, and the
// other nodes push their last increments of it within a period of its end:
// node a (syncing at 10ms into each bucket) read each closed bucket before
// node b (at 50ms) pushed its last half of it, and never again: it saw 15
// of the 20 requests of every closed bucket for the rest of the window. A
// take now reads every bucket that ended less than ReadPrev ago.
func TestBucketsOfOneSyncPeriodReadLateIncrements(t *testing.T) {
	const bw = int64(100 * time.Millisecond)
	const ms = int64(time.Millisecond)
	rule := NewRule(Spec{Kind: Buckets, Limit: 1 << 20, Window: 4 * time.Duration(bw), Buckets: 4})
	a := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true, ReadPrev: 2 * bw})
	b := NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true, ReadPrev: 2 * bw})
	stored := map[int64]int64{}
	sync := func(tb *Table, now int64) {
		e := tb.load(tb.hash("k"), "k")
		ps, _ := tb.Take(e, now, nil)
		tot := make([]int64, len(ps))
		for k, p := range ps {
			stored[p.Win] += p.Delta
			tot[k] = stored[p.Win]
		}
		tb.Settle(e, now, ps, tot)
	}
	start := int64(1000) * bw
	end := start + 10*bw + 20*ms
	for now := start; now <= end; now += ms {
		switch (now - start) / ms % 100 {
		case 10:
			sync(a, now)
		case 50:
			sync(b, now)
		}
		if (now-start)/ms%10 == 0 {
			allow(t, a, "k", 1, now)
		}
		if (now-start)/ms%10 == 5 {
			allow(t, b, "k", 1, now)
		}
	}
	var v [1]Counts
	a.View("k", end, 1, v[:])
	win := end / bw
	require.Equal(t, []int64{stored[win-3], stored[win-2]}, v[0].Buckets[:2], "the buckets closed more than a sync period ago")
}
