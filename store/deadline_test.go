package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A go-redis client without ContextTimeoutEnabled (the default) ignores
// a context's deadline once a command is written: it waits for the reply
// up to its ReadTimeout. The store still ends every call at its
// context's deadline: a server that stops answering (here its replies are
// dropped) holds a call for the caller's timeout, not the client's. A push
// or take so cut short is in doubt, and the breaker counts the failure.
func TestRedisCallsEndAtTheirDeadline(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ReadTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	push(t, s, batch(s, pfx, "n", "k", 1, op(w, id, 1))) // connection open, script cached
	take(t, s, newTake(pfx, "k", future, 1, false, false, wr(10, w)))
	p.DropReplies()

	const deadline = 200 * time.Millisecond
	bound := 10 * deadline // generous on a loaded machine; the client would wait 5 s
	timed := func(name string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		start := time.Now()
		err := f(ctx)
		took := time.Since(start)
		assert.Less(t, took, bound, "%s took %v with a %v deadline", name, took, deadline)
		assert.Error(t, err, name)
	}
	b := batch(s, pfx, "n", "k", 2, op(w, id, 1))
	timed("Push", func(ctx context.Context) error {
		require.NoError(t, s.Push(ctx, []*store.Batch{b}))
		assert.Equal(t, store.InDoubt, b.Status)
		return b.Err
	})
	r := newTake(pfx, "k", future, 1, false, false, wr(10, w))
	timed("Take", func(ctx context.Context) error {
		require.NoError(t, s.Take(ctx, []*store.TakeRequest{r}))
		assert.Equal(t, store.InDoubt, r.Status)
		return r.Err
	})
	timed("Time", func(ctx context.Context) error { _, err := s.Time(ctx); return err })
	timed("PolicyVersion", func(ctx context.Context) error { _, err := s.PolicyVersion(ctx, pfx); return err })
	timed("Policies", func(ctx context.Context) error { _, _, err := s.Policies(ctx, pfx); return err })
	timed("PutPolicy", func(ctx context.Context) error {
		return s.PutPolicy(ctx, pfx, store.Policy{Kind: store.Block, Key: "k", Until: future + w}, future)
	})
	timed("DeletePolicy", func(ctx context.Context) error { _, err := s.DeletePolicy(ctx, pfx, store.Block, "k"); return err })
	timed("Escalate", func(ctx context.Context) error {
		_, err := s.Escalate(ctx, pfx, "k", "r", future, time.Second, time.Minute, time.Hour)
		return err
	})
	timed("AddTags", func(ctx context.Context) error {
		return s.AddTags(ctx, pfx, "k", []store.TagCount{{Tag: "a", Count: 1}}, 4, time.Minute)
	})
	timed("Tags", func(ctx context.Context) error { _, err := s.Tags(ctx, pfx, "k", 4); return err })
}

// A go-redis client with ContextTimeoutEnabled ends a call at its
// context's deadline, but not when the context is canceled before it: a
// blocked read waits for the deadline (or ReadTimeout). The calls that a
// limiter's Close cancels (the sync loop's push and clock read, the policy
// reload and its tags) still end when their context is canceled.
func TestRedisCanceledCallsEnd(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, ReadTimeout: 10 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := store.NewRedis(c, store.RedisOptions{BreakerMin: -1})
	require.NoError(t, err)
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	push(t, s, batch(s, pfx, "n", "k", 1, op(w, id, 1))) // connection open, script cached
	p.DropReplies()

	const after = 100 * time.Millisecond
	bound := 20 * after // generous on a loaded machine; the deadline is 10 s away
	canceled := func(name string, f func(ctx context.Context) error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stop := time.AfterFunc(after, cancel)
		defer stop.Stop()
		start := time.Now()
		err := f(ctx)
		took := time.Since(start)
		assert.Less(t, took, bound, "%s took %v, canceled after %v", name, took, after)
		assert.ErrorIs(t, err, context.Canceled, name)
	}
	b := batch(s, pfx, "n", "k", 2, op(w, id, 1))
	canceled("Push", func(ctx context.Context) error {
		require.NoError(t, s.Push(ctx, []*store.Batch{b}))
		assert.Equal(t, store.InDoubt, b.Status)
		return b.Err
	})
	canceled("Time", func(ctx context.Context) error { _, err := s.Time(ctx); return err })
	canceled("PolicyVersion", func(ctx context.Context) error { _, err := s.PolicyVersion(ctx, pfx); return err })
	canceled("Policies", func(ctx context.Context) error { _, _, err := s.Policies(ctx, pfx); return err })
	canceled("AddTags", func(ctx context.Context) error {
		return s.AddTags(ctx, pfx, "k", []store.TagCount{{Tag: "a", Count: 1}}, 4, time.Minute)
	})
}
