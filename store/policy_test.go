package store_test

import (
	"context"
	"sort"
	"testing"
	"time"

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
