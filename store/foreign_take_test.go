package store_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// A Take of several requests, one of them on a foreign counter: that one
// fails (its decision goes to the FailurePolicy), the others are decided
// and counted once.
func TestRedisTakeForeignCounter(t *testing.T) {
	c := redistest.Client(t)
	s := storetest.Redis(t, c)
	ctx := context.Background()
	const w = 60_000
	now := time.Now().UnixMilli()
	id := now / w
	rules := map[string][]local.Rule{
		"sliding":  {wr(10, w)},
		"previous": {wr(10, w)}, // the previous window's counter is foreign
		"fixed":    {fr(10, w)},
		"two":      {wr(10, w), fr(10, 2*w)},
		// a bucket counted, then taken back when the fixed rule fails
		"buckets+fixed": {local.NewRule(local.Spec{Kind: local.Buckets, Limit: 10, Window: 3 * w * time.Millisecond, Buckets: 3}), fr(10, 2*w)},
		"buckets":       {local.NewRule(local.Spec{Kind: local.Buckets, Limit: 10, Window: 3 * w * time.Millisecond, Buckets: 3})},
		"log":           {local.NewRule(local.Spec{Kind: local.Log, Limit: 10, Window: w * time.Millisecond})},
		"gcra":          {local.NewRule(local.Spec{Kind: local.GCRA, Limit: 10, Window: w * time.Millisecond, Burst: 10})},
	}
	for name, rs := range rules {
		for _, kind := range []string{"hash", "list", "text", "float", "max"} {
			if kind == "max" && rs[len(rs)-1].Kind() == local.GCRA {
				continue // an arrival time in the far future: a valid one
			}
			for _, peek := range []bool{false, true} {
				t.Run(name+"/"+kind+"/peek="+strconv.FormatBool(peek), func(t *testing.T) {
					pfx := redistest.Prefix(t)
					last := &rs[len(rs)-1] // the foreign counter: the last rule's current one
					var badKey string
					switch last.Kind() {
					case local.Log:
						badKey = store.LogKey(pfx, "bad")
					default:
						wl, _ := last.Counter()
						badKey = store.CounterKey(pfx, store.CounterOf(last, "bad", now/wl.Milliseconds()))
						if name == "previous" {
							badKey = store.CounterKey(pfx, store.CounterOf(last, "bad", now/wl.Milliseconds()-1))
						}
					}
					if kind == "list" && last.Kind() == local.Log {
						foreign(t, c, badKey, "hash")
					} else {
						foreign(t, c, badKey, kind)
					}
					for round := int64(1); round <= 2; round++ {
						a := newTake(pfx, "a", now, 1, peek, false, rs...)
						bad := newTake(pfx, "bad", now, 1, peek, false, rs...)
						z := newTake(pfx, "z", now, 1, peek, false, rs...)
						require.NoError(t, s.Take(ctx, []*store.TakeRequest{a, bad, z}))
						if last.Kind() != local.Log && last.Kind() != local.GCRA {
							want := round
							if peek {
								want = 0
							}
							for _, k := range []string{"a", "z"} {
								assert.Equal(t, want, getInt(t, c, store.CounterKey(pfx, store.CounterOf(&rs[0], k, id))), "round %d, %s counted once", round, k)
							}
							if len(rs) > 1 {
								assert.Equal(t, int64(0), getInt(t, c, store.CounterKey(pfx, store.CounterOf(&rs[0], "bad", id))),
									"round %d: the failed request's other rules are not counted", round)
							}
						}
						for _, r := range []*store.TakeRequest{a, z} {
							assert.Equal(t, store.Applied, r.Status, "round %d, %s: %v", round, r.Key, r.Err)
							assert.True(t, r.Allowed, "round %d, %s", round, r.Key)
						}
						typed := (kind == "hash" || kind == "list") && last.Kind() != local.Log
						if typed && (peek || last.Kind() == local.GCRA || name == "previous") {
							// A hash or a list reads as absent (MGET); an
							// arrival time is replaced (SET); a previous
							// window is only read.
							require.Equal(t, store.Applied, bad.Status, "round %d: %v", round, bad.Err)
							continue
						}
						require.Equal(t, store.Failed, bad.Status, "round %d", round)
						require.ErrorIs(t, bad.Err, store.ErrForeign)
					}
				})
			}
		}
	}
}
