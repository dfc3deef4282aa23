package hybridlimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
)

// One IP key, users behind it: the tags of the requests made at or near the
// limit are its contributors; requests far from the limit count nothing.
func TestContributors(t *testing.T) {
	l, _ := newTiered(t, BanPolicy{}) // default tier: 3 per minute
	ctx := context.Background()
	tagged := func(tag string, n int) {
		for range n {
			_, err := l.AllowTagged(ctx, "203.0.113.7", tag, 1)
			require.NoError(t, err)
		}
	}
	tagged("quiet", 2) // 2 of 3 left, then 1: not near the limit
	tagged("alice", 6) // the 3rd unit leaves 0: counted, then 5 denials
	tagged("bob", 2)
	tagged("", 5) // untagged: nothing
	got, err := l.Contributors(ctx, "203.0.113.7")
	require.NoError(t, err)
	assert.Equal(t, []Contributor{{"alice", 6}, {"bob", 2}}, got)
	got, err = l.Contributors(ctx, "nobody")
	require.NoError(t, err)
	assert.Empty(t, got)
	_, err = l.Contributors(ctx, "")
	assert.ErrorIs(t, err, ErrEmptyKey)
}

// With more tags than the sketch holds, the heaviest are kept, and counts
// are over by at most what the evicted tags held.
func TestContributorsSketch(t *testing.T) {
	l, _ := newTiered(t, BanPolicy{})
	ctx := context.Background()
	_, _ = l.Allow(ctx, "k")
	_, _ = l.Allow(ctx, "k")
	_, _ = l.Allow(ctx, "k") // at the limit: every tagged decision counts
	for i := range 200 {
		_, err := l.AllowTagged(ctx, "k", fmt.Sprintf("user-%d", i), 1)
		require.NoError(t, err)
		_, err = l.AllowTagged(ctx, "k", "heavy", 2)
		require.NoError(t, err)
	}
	got, err := l.Contributors(ctx, "k")
	require.NoError(t, err)
	require.Len(t, got, sketchSize)
	assert.Equal(t, Contributor{"heavy", 400}, got[0])
}

// Tags from 8 goroutines, each its own: counted exactly (fewer tags than
// the sketch holds), and tagged decisions do not allocate.
func TestContributorsConcurrent(t *testing.T) {
	l, _ := newTiered(t, BanPolicy{})
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 1000 {
				_, _ = l.AllowTagged(ctx, "k", fmt.Sprint("g", g), 1)
			}
		})
	}
	wg.Wait()
	got, err := l.Contributors(ctx, "k")
	require.NoError(t, err)
	require.Len(t, got, 8)
	total := int64(0)
	for _, c := range got {
		total += c.Cost
	}
	// Every decision but those made with more than a quarter left: the
	// first two of the minute's three.
	assert.Equal(t, int64(8000-2), total)
	allocs := testing.AllocsPerRun(1000, func() { _, _ = l.AllowTagged(ctx, "k", "g0", 1) })
	assert.Zero(t, allocs)
}

// Three async nodes on Redis: each adds what it saw to the store at its
// sync, and any node reports the cluster's contributors.
func TestContributorsAcrossNodes(t *testing.T) {
	mock := &stepClock{Mock: clock.NewMock()}
	mock.Set(time.Now())
	c := redistest.Client(t)
	pfx := redistest.Prefix(t)
	var nodes []*Limiter
	for range 3 {
		l, err := New(Config{Rules: []Rule{{Limit: 10, Window: time.Minute}}, Mode: ModeAsync, Store: storetest.Redis(t, c),
			Prefix: pfx, Clock: mock, Manual: true, ClockSync: -1})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	ctx := context.Background()
	for i := range 60 {
		l := nodes[i%3]
		tag := "alice"
		if i%4 == 0 {
			tag = "bob"
		}
		_, err := l.AllowTagged(ctx, "10.0.0.1", tag, 1)
		require.NoError(t, err)
	}
	for _, l := range nodes {
		require.NoError(t, l.Sync(ctx))
	}
	got, err := nodes[0].Contributors(ctx, "10.0.0.1")
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "alice", got[0].Tag)
	assert.Equal(t, "bob", got[1].Tag)
	// Before any sync each node sees only its own 20 requests of the 10
	// per minute: it counts them from the 8th (2 of 10 left) on, 13 each.
	assert.Equal(t, int64(39), got[0].Cost+got[1].Cost)
}

// "Near the limit" is measured against what the rule's Remaining counts
// down from: a bucket's Burst, not its Limit. A token bucket of 100 a
// minute with a burst of 8 is far from its limit with 7 tokens left, and
// near it with 2; one with a burst of 400 is near it with 100 left.
func TestContributorsBucketThreshold(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		rule  Rule
		spend int   // untagged requests first
		want  int64 // the tag's cost counted over 4 tagged requests
	}{
		// Remaining after the tagged requests: 7, 6, 5, 4.
		{"burst below limit, full", Rule{Limit: 100, Window: time.Minute, Type: TokenBucket, Burst: 8}, 0, 0},
		// 4, 3, 2, 1: the last two at most a quarter of 8.
		{"burst below limit, near", Rule{Limit: 100, Window: time.Minute, Type: TokenBucket, Burst: 8}, 3, 2},
		// 102, 101, 100, 99: the last two at most a quarter of 400.
		{"burst above limit, near", Rule{Limit: 100, Window: time.Minute, Type: TokenBucket, Burst: 400}, 297, 2},
		{"leaky bucket", Rule{Limit: 100, Window: time.Minute, Type: LeakyBucket, Burst: 8}, 3, 2},
		{"window rule", Rule{Limit: 8, Window: time.Minute}, 3, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			mock := clock.NewMock()
			mock.Set(at(10, 0, 0))
			l, err := New(Config{Rules: []Rule{c.rule}, Clock: mock, Manual: true})
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(ctx) })
			for range c.spend {
				_, err := l.Allow(ctx, "k")
				require.NoError(t, err)
			}
			for range 4 {
				_, err := l.AllowTagged(ctx, "k", "t", 1)
				require.NoError(t, err)
			}
			got, err := l.Contributors(ctx, "k")
			require.NoError(t, err)
			var cost int64
			for _, x := range got {
				cost += x.Cost
			}
			assert.Equal(t, c.want, cost)
		})
	}
}

// A tag longer than Config.MaxKeyLen counts as its first MaxKeyLen bytes.
func TestContributorsLongTag(t *testing.T) {
	l, _ := newTiered(t, BanPolicy{})
	ctx := context.Background()
	long := strings.Repeat("t", 8*DefaultMaxKeyLen)
	for range 4 {
		_, err := l.AllowTagged(ctx, "k", long, 1)
		require.NoError(t, err)
	}
	got, err := l.Contributors(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []Contributor{{long[:DefaultMaxKeyLen], 2}}, got, "the third unit and the denial")
}
