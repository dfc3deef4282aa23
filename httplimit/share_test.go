package httplimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// TestHeadersFollowTheSharePolicy holds the RateLimit field to the
// decision on three ModeAsync nodes under the share policy, whose shares
// deny what the plain rules admit: the item of the decision's rule has the
// decision's remaining (RateLimit-Remaining), admitted or denied.
func TestHeadersFollowTheSharePolicy(t *testing.T) {
	ctx := context.Background()
	mc := clock.NewMock()
	mc.Set(epoch)
	st := store.NewMemory(mc)
	rules := []hybridlimit.Rule{
		{Limit: 100, Window: time.Second},
		{Limit: 300, Window: 5 * time.Second, Type: hybridlimit.Bucketed, Buckets: 5},
	}
	names := map[string]string{"100": "1s", "300": "5s"} // by RateLimit-Limit
	var nodes []*hybridlimit.Limiter
	var mws []*httplimit.Middleware
	for range 3 {
		l, err := hybridlimit.New(hybridlimit.Config{
			Rules: rules, Mode: hybridlimit.ModeAsync, SyncRate: 100 * time.Millisecond,
			Store: st, Clock: mc, Manual: true, Seed: 7,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(ctx) })
		nodes = append(nodes, l)
		mws = append(mws, mustNew(t, l, header(t, "K"), httplimit.Options{}))
	}
	denied := 0
	for step := range 800 {
		mc.Add(5 * time.Millisecond)
		if step%20 == 0 {
			for _, l := range nodes {
				require.NoError(t, l.Sync(ctx))
			}
		}
		i := step % 3
		if (step/300)%2 == 1 {
			i = 0 // one node takes all, against the others' shares
		}
		w := doKey(mws[i], "k")
		if w.StatusCode == 429 {
			denied++
		}
		name, ok := names[w.Header.Get("RateLimit-Limit")]
		require.True(t, ok, "step %d: RateLimit-Limit %q", step, w.Header.Get("RateLimit-Limit"))
		items, err := parseSFList(w.Header.Get("RateLimit"))
		require.NoError(t, err)
		var r string
		for _, it := range items {
			if it.Name == name {
				r = it.Params["r"]
			}
		}
		require.Equal(t, w.Header.Get("RateLimit-Remaining"), r,
			"step %d (status %d): RateLimit-Remaining (want) and the r of %q in RateLimit %q (got)", step, w.StatusCode, name, w.Header.Get("RateLimit"))
	}
	t.Logf("800 requests, %d denied", denied)
	require.Positive(t, denied)
}
