package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/local"
)

// A take call sent twice (a client's retry after a lost reply) is decided
// once: the second run returns the first run's outcome and counts nothing.
func TestTakeScriptRetryIsDecidedOnce(t *testing.T) {
	c := redistest.Client(t)
	pfx := redistest.Prefix(t)
	ctx := context.Background()
	const w = int64(60_000)
	now := time.Now().UnixMicro()
	id := now / (w * 1000)
	marker := markerKey(pfx, 't', Slot("k"), "test.0")
	cur := CounterKey(pfx, Counter{Key: "k", Window: w, ID: id})
	rule := local.NewRule(local.Spec{Kind: local.Sliding, Limit: 1, Window: time.Duration(w) * time.Millisecond})
	run := func(seq int64) []int64 {
		r := &TakeRequest{Prefix: pfx, Key: "k", Rules: []local.Rule{rule}, Now: now, Deadline: time.Now().Add(time.Minute).UnixMicro(), Cost: 1}
		keys, argv := takeArgs(marker, uint64(seq), 60_000, []*TakeRequest{r})
		v, err := takeScript.Run(ctx, c, keys, argv...).Int64Slice()
		require.NoError(t, err)
		return v
	}
	require.NoError(t, c.Set(ctx, cur, 0, time.Minute).Err())
	assert.Equal(t, []int64{0, 1, 1, 0, 0}, run(1), "decided: admitted, cur 1 (prev 0, not late)")
	assert.Equal(t, []int64{1, 1, 1, 0, 0}, run(1), "sent again: the same outcome, decided before, nothing counted")
	assert.Equal(t, []int64{0, 0, 1, 0, 0}, run(2), "the next call: the limit of 1 is reached")
	assert.Equal(t, []int64{3}, run(1), "an older call after a newer one: its outcome is lost")
	v, err := c.Get(ctx, cur).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), v)
	_, err = c.Get(ctx, marker).Result()
	assert.NotErrorIs(t, err, redis.Nil, "the marker lives under the prefix")
}

// takeArgs returns the take script's keys and arguments for reqs, from a
// fresh arena.
func takeArgs(marker string, seq uint64, ttl int64, reqs []*TakeRequest) ([]string, []any) {
	all, n := new(takeArena).args(marker, seq, ttl, reqs)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = *all[3+i].(*string)
	}
	return keys, all[3+n:]
}

// An arena reused for another call, larger or smaller, gives the same
// arguments as a fresh one.
func TestTakeArenaReuse(t *testing.T) {
	rules := []local.Rule{local.NewRule(local.Spec{Kind: local.Sliding, Limit: 5, Window: time.Minute})}
	reqs := func(n int, key string) []*TakeRequest {
		var rs []*TakeRequest
		for i := range n {
			rs = append(rs, &TakeRequest{Prefix: "p", Key: fmt.Sprint(key, i), Rules: rules, Now: 1_700_000_000_000_000 + int64(i), Cost: int64(i + 1)})
		}
		return rs
	}
	flat := func(all []any) []string {
		var out []string
		for _, x := range all[3:] {
			switch v := x.(type) {
			case *string:
				out = append(out, *v)
			case *int64:
				out = append(out, fmt.Sprint(*v))
			default:
				t.Fatalf("argument of type %T", x)
			}
		}
		return out
	}
	a := new(takeArena)
	for step, rs := range [][]*TakeRequest{reqs(3, "a"), reqs(40, "bb"), reqs(1, "c"), reqs(40, "d")} {
		got, n := a.args("m", uint64(step), 60_000, rs)
		want, wn := new(takeArena).args("m", uint64(step), 60_000, rs)
		require.Equal(t, wn, n, "step %d: keys", step)
		require.Equal(t, flat(want), flat(got), "step %d", step)
		a.release()
		a = takeArenas.Get().(*takeArena)
	}
}

// The scripts saturate arrival times at local.MaxAhead, written in µs.
func TestScriptsKnowMaxAhead(t *testing.T) {
	want := fmt.Sprintf("local maxahead = %d\n", local.MaxAhead/1000)
	for _, s := range []luaScript{pushScript, takeScript} {
		assert.Contains(t, s.src, want)
	}
}
