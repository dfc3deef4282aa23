package store_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

func TestMemoryPolicies(t *testing.T) {
	runPolicies(t, func(t *testing.T) (store.PolicyStore, string) { return store.NewMemory(nil), "hl" })
}

func TestRedisPolicies(t *testing.T) {
	c := redistest.Client(t)
	runPolicies(t, func(t *testing.T) (store.PolicyStore, string) { return storetest.Redis(t, c), redistest.Prefix(t) })
}

// policies returns ps in force at now, sorted by kind and key.
func inForce(ps []store.Policy, now int64) []store.Policy {
	var out []store.Policy
	for _, p := range ps {
		if p.InForce(now) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Key < out[j].Key
	})
	return out
}

func runPolicies(t *testing.T, open func(t *testing.T) (store.PolicyStore, string)) {
	ctx := context.Background()
	const now = future
	t.Run("PutDeleteVersion", func(t *testing.T) {
		s, pfx := open(t)
		v0, err := s.PolicyVersion(ctx, pfx)
		require.NoError(t, err)
		// Keys with the characters the encoding uses.
		o := store.Policy{Kind: store.Override, Key: "a:b|c\n{x}", Value: "paid", Until: now + 60_000}
		b := store.Policy{Kind: store.Block, Key: "k", Value: "abuse | spam", Until: 0}
		require.NoError(t, s.PutPolicy(ctx, pfx, o, now))
		require.NoError(t, s.PutPolicy(ctx, pfx, b, now))
		v1, ps, err := s.Policies(ctx, pfx)
		require.NoError(t, err)
		assert.Greater(t, v1, v0)
		assert.Equal(t, []store.Policy{b, o}, inForce(ps, now))
		ok, err := s.DeletePolicy(ctx, pfx, store.Override, o.Key)
		require.NoError(t, err)
		assert.True(t, ok)
		ok, err = s.DeletePolicy(ctx, pfx, store.Override, o.Key)
		require.NoError(t, err)
		assert.False(t, ok)
		v2, ps, err := s.Policies(ctx, pfx)
		require.NoError(t, err)
		assert.Greater(t, v2, v1)
		assert.Equal(t, []store.Policy{b}, inForce(ps, now))
		got, err := s.PolicyVersion(ctx, pfx)
		require.NoError(t, err)
		assert.Equal(t, v2, got)
	})
	t.Run("EndedPoliciesArePruned", func(t *testing.T) {
		s, pfx := open(t)
		require.NoError(t, s.PutPolicy(ctx, pfx, store.Policy{Kind: store.Block, Key: "old", Until: now + 10}, now))
		require.NoError(t, s.PutPolicy(ctx, pfx, store.Policy{Kind: store.Block, Key: "new", Until: now + 100}, now+20))
		_, ps, err := s.Policies(ctx, pfx)
		require.NoError(t, err)
		require.Len(t, ps, 1)
		assert.Equal(t, "new", ps[0].Key)
	})
	t.Run("Escalate", func(t *testing.T) {
		s, pfx := open(t)
		const base, max, forget = time.Minute, 5 * time.Minute, time.Hour
		at := int64(now)
		var lengths []time.Duration
		for range 5 {
			p, err := s.Escalate(ctx, pfx, "k", "too many denials", at, base, max, forget)
			require.NoError(t, err)
			assert.Equal(t, store.Block, p.Kind)
			assert.Equal(t, "too many denials", p.Value)
			lengths = append(lengths, time.Duration(p.Until-at)*time.Millisecond)
			// While the block holds, escalating again changes nothing.
			again, err := s.Escalate(ctx, pfx, "k", "other", at+1000, base, max, forget)
			require.NoError(t, err)
			assert.Equal(t, p, again)
			at = p.Until + 1000 // the next offence, a second after the block ended
		}
		assert.Equal(t, []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}, lengths)
		// Forgotten an hour after the last block ended: the next starts over.
		p, err := s.Escalate(ctx, pfx, "k", "x", at+forget.Milliseconds(), base, max, forget)
		require.NoError(t, err)
		assert.Equal(t, 1, p.Strikes)
		assert.Equal(t, base.Milliseconds(), p.Until-(at+forget.Milliseconds()))
	})
}

func TestMemoryTags(t *testing.T) {
	runTags(t, func(t *testing.T) (store.TagStore, string) { return store.NewMemory(nil), "hl" })
}

func TestRedisTags(t *testing.T) {
	c := redistest.Client(t)
	runTags(t, func(t *testing.T) (store.TagStore, string) { return storetest.Redis(t, c), redistest.Prefix(t) })
}

func runTags(t *testing.T, open func(t *testing.T) (store.TagStore, string)) {
	ctx := context.Background()
	s, pfx := open(t)
	require.NoError(t, s.AddTags(ctx, pfx, "ip", []store.TagCount{{"a", 5}, {"b", 3}, {"c", 1}}, 3, time.Minute))
	require.NoError(t, s.AddTags(ctx, pfx, "ip", []store.TagCount{{"b", 4}, {"d", 2}}, 3, time.Minute))
	got, err := s.Tags(ctx, pfx, "ip", 10)
	require.NoError(t, err)
	assert.Equal(t, []store.TagCount{{"b", 7}, {"a", 5}, {"d", 2}}, got, "merged, the 3 most counted kept")
	got, err = s.Tags(ctx, pfx, "ip", 1)
	require.NoError(t, err)
	assert.Equal(t, []store.TagCount{{"b", 7}}, got)
	got, err = s.Tags(ctx, pfx, "other", 10)
	require.NoError(t, err)
	assert.Empty(t, got)
}

// A Redis server restarted without persistence, or flushed, loses the
// policies and their version (deleting the prefix's keys does the same to
// them): the versions handed out afterwards are above every version handed
// out before, so that a node that cached one of those reloads.
func TestRedisPolicyVersionAfterLoss(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	s, pfx := storetest.Redis(t, c), redistest.Prefix(t)
	for i := range 3 {
		require.NoError(t, s.PutPolicy(ctx, pfx, store.Policy{Kind: store.Block, Key: fmt.Sprint(i)}, future))
	}
	before, err := s.PolicyVersion(ctx, pfx)
	require.NoError(t, err)
	keys, err := c.Keys(ctx, pfx+"*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	require.NoError(t, c.Del(ctx, keys...).Err())
	for i := range 3 {
		require.NoError(t, s.PutPolicy(ctx, pfx, store.Policy{Kind: store.Block, Key: "new"}, future))
		v, _, err := s.Policies(ctx, pfx)
		require.NoError(t, err)
		assert.Greater(t, v, before, "change %d after the loss", i)
		before = v
	}
}

// A Memory store keeps the same contract: a new store (the data of the
// old one lost), once its clock has moved on, hands out versions above the
// old store's.
func TestMemoryPolicyVersionAfterLoss(t *testing.T) {
	ctx := context.Background()
	mock := clock.NewMock()
	mock.Set(time.UnixMilli(future))
	old := store.NewMemory(mock)
	for i := range 3 {
		require.NoError(t, old.PutPolicy(ctx, "hl", store.Policy{Kind: store.Block, Key: fmt.Sprint(i)}, future))
	}
	before, err := old.PolicyVersion(ctx, "hl")
	require.NoError(t, err)
	mock.Add(time.Millisecond)
	s := store.NewMemory(mock)
	ok, err := s.DeletePolicy(ctx, "hl", store.Block, "0")
	require.NoError(t, err)
	require.False(t, ok)
	v, err := s.PolicyVersion(ctx, "hl")
	require.NoError(t, err)
	assert.Zero(t, v, "no change yet")
	_, err = s.Escalate(ctx, "hl", "k", "r", future, time.Second, time.Minute, time.Hour)
	require.NoError(t, err)
	v, _, err = s.Policies(ctx, "hl")
	require.NoError(t, err)
	assert.Greater(t, v, before)
}

// A version another program wrote past 2^53, where the scripts' numbers
// are no longer exact, still grows by one per change.
func TestRedisPolicyVersionPast2p53(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	s, pfx := storetest.Redis(t, c), redistest.Prefix(t)
	require.NoError(t, c.Set(ctx, pfx+":polv:{"+pfx+"}", "9007199254740993", 0).Err())
	require.NoError(t, s.PutPolicy(ctx, pfx, store.Policy{Kind: store.Block, Key: "k"}, future))
	v, err := s.PolicyVersion(ctx, pfx)
	require.NoError(t, err)
	assert.Equal(t, uint64(9007199254740994), v)
	ok, err := s.DeletePolicy(ctx, pfx, store.Block, "k")
	require.NoError(t, err)
	require.True(t, ok)
	v, err = s.PolicyVersion(ctx, pfx)
	require.NoError(t, err)
	assert.Equal(t, uint64(9007199254740995), v)
}
