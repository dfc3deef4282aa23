package store

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/local"
)

// Foreign values in the markers (only a writer into the library's keys
// under a node's random name puts them there): a marker Redis cannot read
// (a hash) fails the call before it writes anything; one that holds no
// number counts as absent; a number counts as the last sequence applied.
func TestRedisForeignMarkers(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	s, err := NewRedis(c, RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	const w = 60_000
	id := int64(1_893_456_000_000) / w
	cases := []struct {
		name   string
		set    func(key string) error
		status Status
		total  int64 // the counter after the batch
	}{
		{"hash", func(k string) error { return c.HSet(ctx, k, "f", "v").Err() }, Failed, 0},
		{"text", func(k string) error { return c.Set(ctx, k, "not a number", 0).Err() }, Applied, 1},
		{"huge", func(k string) error { return c.Set(ctx, k, "99999999999999999999", 0).Err() }, Applied, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pfx := redistest.Prefix(t)
			g := s.Group("k")
			require.NoError(t, tc.set(markerKey(pfx, 'm', s.slotOf(g), "n")))
			b := &Batch{Prefix: pfx, Node: "n", Group: g, Seq: 1, Ops: []Op{{Counter: Counter{Key: "k", Window: w, ID: id}, Delta: 1}}}
			require.NoError(t, s.Push(ctx, []*Batch{b}))
			assert.Equal(t, tc.status, b.Status, "%v", b.Err)
			v, _ := c.Get(ctx, CounterKey(pfx, b.Ops[0].Counter)).Int64()
			assert.Equal(t, tc.total, v)

			// The take marker of the store's first stream.
			tk := markerKey(pfx, 't', s.slotOf(0), s.node+".0")
			if tc.name == "huge" {
				require.NoError(t, c.Set(ctx, tk, "99999999999999999999:1", 0).Err()) // a take marker's form
			} else {
				require.NoError(t, tc.set(tk))
			}
			rule := local.NewRule(local.Spec{Kind: local.Fixed, Limit: 10, Window: time.Minute})
			r := &TakeRequest{Prefix: pfx, Key: "t", Rules: []local.Rule{rule}, Now: time.Now().UnixMicro(), Cost: 1, Deadline: time.Now().Add(time.Minute).UnixMicro()}
			require.NoError(t, s.Take(ctx, []*TakeRequest{r}))
			switch tc.name {
			case "hash":
				assert.Equal(t, Failed, r.Status, "nothing written: the FailurePolicy decides")
			case "text":
				assert.Equal(t, Applied, r.Status, "%v", r.Err)
			case "huge":
				assert.Equal(t, InDoubt, r.Status, "a later call's outcome: this one's is lost")
				// A bare number is not of a take marker's form: no marker.
				require.NoError(t, c.Set(ctx, tk, "99999999999999999999", 0).Err())
				r := &TakeRequest{Prefix: pfx, Key: "t", Rules: []local.Rule{rule}, Now: time.Now().UnixMicro(), Cost: 1, Deadline: time.Now().Add(time.Minute).UnixMicro()}
				require.NoError(t, s.Take(ctx, []*TakeRequest{r}))
				assert.Equal(t, Applied, r.Status, "%v", r.Err)
			}
			require.NoError(t, c.Del(ctx, tk).Err())
		})
	}
}

// A take marker holds the call's sequence number as the client sent it,
// whatever its size below 2^53: a Lua number formatted back would read
// 1e+15, which the next call could not parse, and a retry of the call
// would be decided again.
func TestRedisTakeMarkerHoldsLargeSeqs(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	s, err := NewRedis(c, RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	s.seq.Store(1e15 - 1)
	rule := local.NewRule(local.Spec{Kind: local.Fixed, Limit: 10, Window: time.Minute})
	r := &TakeRequest{Prefix: pfx, Key: "t", Rules: []local.Rule{rule}, Now: time.Now().UnixMicro(), Cost: 1, Deadline: time.Now().Add(time.Minute).UnixMicro()}
	require.NoError(t, s.Take(ctx, []*TakeRequest{r}))
	require.Equal(t, Applied, r.Status, "%v", r.Err)
	m, err := c.Get(ctx, markerKey(pfx, 't', s.slotOf(0), s.node+".0")).Result()
	require.NoError(t, err)
	assert.Equal(t, "1000000000000000:1", m)
}

// A push marker lasts markerTTL after the last batch the store applied
// for its node and group: a batch sent again within it is recognized,
// and once the marker is gone (as its expiry removes it) the same batch
// is applied again (docs/failures.md, "How long the guarantee lasts").
func TestRedisMarkerLastsTenMinutesAfterTheLastBatch(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	s, err := NewRedis(c, RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := time.Now().UnixMilli() / w
	g := s.Group("k")
	mk := markerKey(pfx, 'm', s.slotOf(g), "n")
	ck := CounterKey(pfx, Counter{Key: "k", Window: w, ID: id})
	push := func(seq uint64) *Batch {
		t.Helper()
		b := &Batch{Prefix: pfx, Node: "n", Group: g, Seq: seq, Ops: []Op{{Counter: Counter{Key: "k", Window: w, ID: id}, Delta: 1}}}
		require.NoError(t, s.Push(ctx, []*Batch{b}))
		require.Equal(t, Applied, b.Status, "%v", b.Err)
		return b
	}
	ttl := func() time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, mk).Result()
		require.NoError(t, err)
		return d
	}
	total := func() int64 {
		t.Helper()
		v, err := c.Get(ctx, ck).Int64()
		require.NoError(t, err)
		return v
	}

	push(1)
	assert.InDelta(t, float64(markerTTL), float64(ttl()), float64(5*time.Second), "the marker lasts %v", markerTTL)
	assert.Equal(t, []int64{1}, push(1).Totals, "a batch sent again within the marker's life is not applied again")
	assert.Equal(t, int64(1), total())

	// A later batch renews the marker's life.
	require.NoError(t, c.PExpire(ctx, mk, time.Second).Err())
	push(2)
	assert.InDelta(t, float64(markerTTL), float64(ttl()), float64(5*time.Second))
	assert.Equal(t, int64(2), total())

	// So does a batch sent again: the call writes, so that WAIT
	// (RedisOptions.WaitReplicas) on its connection covers the first
	// run's writes, on servers that track only writing commands per
	// connection (Redis 7.2 on).
	require.NoError(t, c.PExpire(ctx, mk, time.Second).Err())
	assert.Equal(t, []int64{2}, push(2).Totals)
	assert.InDelta(t, float64(markerTTL), float64(ttl()), float64(5*time.Second), "renewed by the batch sent again")
	assert.Equal(t, int64(2), total())

	// Once the marker is gone, the batch is applied again: the guarantee
	// ends with the marker.
	require.NoError(t, c.Del(ctx, mk).Err())
	push(2)
	assert.Equal(t, int64(3), total())
}

// A take call sent again (the same sequence number) renews its marker's
// life, as a push sent again does: the call writes, so that WAIT
// (RedisOptions.WaitReplicas) on its connection covers the first run's
// writes.
func TestRedisTakeSentAgainRenewsItsMarker(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	s, err := NewRedis(c, RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	rule := local.NewRule(local.Spec{Kind: local.Fixed, Limit: 10, Window: time.Minute})
	take := func() *TakeRequest {
		t.Helper()
		r := &TakeRequest{Prefix: pfx, Key: "t", Rules: []local.Rule{rule}, Now: time.Now().UnixMicro(), Cost: 1, Deadline: time.Now().Add(time.Minute).UnixMicro()}
		require.NoError(t, s.Take(ctx, []*TakeRequest{r}))
		require.Equal(t, Applied, r.Status, "%v", r.Err)
		return r
	}
	seq := s.seq.Load()
	take()
	mk := markerKey(pfx, 't', s.slotOf(0), s.node+".0")
	require.NoError(t, c.PExpire(ctx, mk, time.Second).Err())
	s.seq.Store(seq) // the same call again
	assert.Equal(t, int64(1), take().Counts[0].Cur, "decided once")
	d, err := c.PTTL(ctx, mk).Result()
	require.NoError(t, err)
	assert.InDelta(t, float64(time.Minute), float64(d), float64(5*time.Second), "renewed by the call sent again: a take marker lasts a minute")
}
