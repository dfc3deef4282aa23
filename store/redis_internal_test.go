package store

import (
	"context"
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
	assert.Equal(t, []int64{0, 1, 1, 0}, run(1), "decided: admitted, cur 1")
	assert.Equal(t, []int64{1, 1, 1, 0}, run(1), "sent again: the same outcome, decided before, nothing counted")
	assert.Equal(t, []int64{0, 0, 1, 0}, run(2), "the next call: the limit of 1 is reached")
	assert.Equal(t, []int64{3}, run(1), "an older call after a newer one: its outcome is lost")
	v, err := c.Get(ctx, cur).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(1), v)
	_, err = c.Get(ctx, marker).Result()
	assert.NotErrorIs(t, err, redis.Nil, "the marker lives under the prefix")
}
