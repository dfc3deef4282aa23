package hybridlimit

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// The share policy on a mock clock: nodes sharing a memory store, traffic
// spread round robin at a fixed pace, each node syncing every 100ms at its
// own phase. Everything is deterministic.

const (
	shareLimit = 400 // per second
	shareRate  = 100 * time.Millisecond
)

// stepClock is a clock set by hand, like clock.Mock, whose Set does not
// sleep (clock.Mock's does, a millisecond each time); the limiter reads
// only Now when Config.Manual is set.
type stepClock struct {
	*clock.Mock
	now atomic.Int64
}

func (c *stepClock) Now() time.Time      { return time.Unix(0, c.now.Load()) }
func (c *stepClock) Set(t time.Time)     { c.now.Store(t.UnixNano()) }
func (c *stepClock) Add(d time.Duration) { c.now.Add(int64(d)) }

type shareCluster struct {
	t     *testing.T
	typ   Algorithm // the rule's: Sliding by default
	mock  *stepClock
	store store.Store
	nodes []*Limiter
	skew  []time.Duration
	next  []time.Time // each node's next sync
	rr    int
}

func newShareCluster(t *testing.T, n int, policy AsyncPolicy, st func(*store.Memory) store.Store) *shareCluster {
	return newShareClusterOf(t, n, policy, Sliding, st)
}

// newShareClusterOf is newShareCluster with a rule of type typ.
func newShareClusterOf(t *testing.T, n int, policy AsyncPolicy, typ Algorithm, st func(*store.Memory) store.Store) *shareCluster {
	c := &shareCluster{t: t, typ: typ, mock: &stepClock{Mock: clock.NewMock()}}
	c.mock.Set(t0)
	mem := store.NewMemory(c.mock)
	c.store = mem
	if st != nil {
		c.store = st(mem)
	}
	for range n {
		c.add(policy, 0)
	}
	return c
}

// add starts a node whose clock is skew ahead of the store's.
func (c *shareCluster) add(policy AsyncPolicy, skew time.Duration) {
	i := len(c.nodes)
	l, err := New(Config{
		Rules: []Rule{{Limit: shareLimit, Window: time.Second, Type: c.typ}}, Mode: ModeAsync, Store: c.store,
		SyncRate: shareRate, AsyncPolicy: policy, Clock: &skewedStep{c.mock, skew},
		Manual: true, Seed: uint64(i + 1), ClockSync: time.Hour,
	})
	require.NoError(c.t, err)
	require.NoError(c.t, l.SyncClock(context.Background()))
	c.t.Cleanup(func() { _ = l.Close(context.Background()) })
	c.nodes = append(c.nodes, l)
	c.skew = append(c.skew, skew)
	// Phases spread over the period, as nodes started at independent
	// instants would be.
	c.next = append(c.next, c.mock.Now().Add(shareRate*time.Duration(i%4+1)/4))
}

// skewedStep is a stepClock seen from a node whose clock is skew ahead.
type skewedStep struct {
	*stepClock
	skew time.Duration
}

func (c *skewedStep) Now() time.Time { return c.stepClock.Now().Add(c.skew) }

// remove closes node i: it pushes what it holds and decides no more.
func (c *shareCluster) remove(i int) {
	require.NoError(c.t, c.nodes[i].Close(context.Background()))
	c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
	c.skew = append(c.skew[:i], c.skew[i+1:]...)
	c.next = append(c.next[:i], c.next[i+1:]...)
}

// run sends requests for key every gap, round robin over the nodes, for d,
// syncing every node on its schedule, and returns the admissions per
// second of the run.
func (c *shareCluster) run(key string, d, gap time.Duration) []int {
	return c.runKeys([]string{key}, d, gap)[key]
}

// runKeys sends requests for each of keys every gap, round robin over the
// nodes (the keys of one instant to consecutive nodes), for d, syncing
// every node on its schedule, and returns each key's admissions per
// second of the run.
func (c *shareCluster) runKeys(keys []string, d, gap time.Duration) map[string][]int {
	ctx := context.Background()
	end := c.mock.Now().Add(d)
	perSecond := make(map[string][]int, len(keys))
	for _, k := range keys {
		perSecond[k] = make([]int, int((d+time.Second-1)/time.Second))
	}
	start := c.mock.Now()
	for now := c.mock.Now(); now.Before(end); now = now.Add(gap) {
		c.mock.Set(now)
		for i, l := range c.nodes {
			for !c.next[i].After(now) {
				_ = l.Sync(ctx) // a failing store is part of some tests
				c.next[i] = c.next[i].Add(shareRate)
			}
		}
		for j, k := range keys {
			l := c.nodes[(c.rr+j)%len(c.nodes)]
			res, err := l.Allow(ctx, k)
			require.NoError(c.t, err)
			if res.Allowed {
				perSecond[k][int(now.Sub(start)/time.Second)]++
			}
		}
		c.rr++
	}
	return perSecond
}

func sum(xs []int) (n int) {
	for _, x := range xs {
		n += x
	}
	return n
}

// assertNear checks that the admissions per second, after the first
// seconds, are within frac of the limit on average.
func assertNear(t *testing.T, perSecond []int, skip int, frac float64, what string) {
	t.Helper()
	got := float64(sum(perSecond[skip:])) / float64(len(perSecond)-skip)
	assert.InDelta(t, shareLimit, got, frac*shareLimit, "%s: %v per second", what, perSecond)
}

func TestShareConvergesOnTheLimit(t *testing.T) {
	// 4 nodes, 2× the limit, round robin. The naive policy overshoots by
	// about (3/4)·τ/W ≈ 7.5%; the share policy spends what is free.
	naive := newShareCluster(t, 4, Naive, nil).run("k", 10*time.Second, time.Second/(2*shareLimit))
	share := newShareCluster(t, 4, Share, nil).run("k", 10*time.Second, time.Second/(2*shareLimit))
	t.Logf("naive %v\nshare %v", naive, share)
	assertNear(t, share, 2, 0.02, "share")
	assert.Greater(t, float64(sum(naive[2:]))/8, 1.04*shareLimit, "naive overshoots: %v", naive)
	// Every window on its own, across each rollover: no second admits
	// much more than the limit, or much less.
	for i, n := range share[2:] {
		assert.InDelta(t, shareLimit, n, 0.05*shareLimit, "second %d: %v", i+2, share)
	}
}

func TestShareFollowsNodesJoiningAndLeaving(t *testing.T) {
	c := newShareCluster(t, 2, Share, nil)
	gap := time.Second / (2 * shareLimit)
	two := c.run("k", 5*time.Second, gap)
	c.add(Share, 0)
	c.add(Share, 0)
	four := c.run("k", 5*time.Second, gap)
	c.remove(3)
	c.remove(2)
	back := c.run("k", 5*time.Second, gap)
	t.Logf("2 nodes %v\n4 nodes %v\n2 again %v", two, four, back)
	assertNear(t, two, 2, 0.03, "two nodes")
	assertNear(t, four, 2, 0.03, "after two joined")
	assertNear(t, back, 2, 0.03, "after two left")
}

// While the store is down, each node keeps admitting its share of the
// limit, instead of the limit each once its last sync has slid out.
//
// The outage starts at a window's start, when the last syncs saw the
// window's quota spent, or a little into it, when they saw most of it
// left and handed the key to the plain rule until their next sync: a
// hand-off that no sync renews ends after two sync periods, and the share
// decides again.
func TestShareDuringAnOutage(t *testing.T) {
	var down *flaky
	for _, tc := range []struct {
		typ Algorithm
		at  time.Duration
	}{{Sliding, 0}, {Sliding, 60 * time.Millisecond}, {Fixed, 0}, {Fixed, 30 * time.Millisecond}, {Fixed, 60 * time.Millisecond}, {Fixed, 120 * time.Millisecond}} {
		typ, at := tc.typ, tc.at
		for _, policy := range []AsyncPolicy{Naive, Share} {
			c := newShareClusterOf(t, 4, policy, typ, func(m *store.Memory) store.Store {
				down = &flaky{Store: m}
				return down
			})
			gap := time.Second / (2 * shareLimit)
			c.run("k", 5*time.Second+at, gap)
			down.down.Store(true)
			outage := c.run("k", 5*time.Second, gap)
			down.down.Store(false)
			after := c.run("k", 3*time.Second, gap)
			t.Logf("%v %v, store down %v into a window: outage %v, after %v", policy, typ, at, outage, after)
			if policy == Naive {
				assert.Greater(t, float64(sum(outage[2:]))/3, 2*shareLimit*0.9, "naive: every node admits the limit")
				continue
			}
			assertNear(t, outage, 1, 0.05, fmt.Sprintf("share %v, store down %v into a window", typ, at))
			assertNear(t, after, 1, 0.03, fmt.Sprintf("share %v, store back (down %v into a window)", typ, at))
		}
	}
}

// shardDown is a store of two groups, as a Cluster's shards: key "a" in
// group 1 and every other key in group 0. While down is set, group 1's
// batches fail and group 0's are applied.
type shardDown struct {
	store.Store
	down atomic.Bool
}

func (s *shardDown) Group(key string) int {
	if key == "a" {
		return 1
	}
	return 0
}

func (s *shardDown) Push(ctx context.Context, batches []*store.Batch) error {
	up := make([]*store.Batch, 0, len(batches))
	for _, b := range batches {
		if s.down.Load() && b.Group == 1 {
			b.Status, b.Err = store.Failed, errDown
			continue
		}
		up = append(up, b)
	}
	return s.Store.Push(ctx, up)
}

// While the shard of one key is down and the other shards answer, the
// key's nodes each admit their share of its limit, as in a whole store's
// outage: a hand-off to the plain rule ends two sync periods after the
// key's own last sync, whatever the other keys' syncs do.
func TestShareDuringAShardOutage(t *testing.T) {
	for _, at := range []time.Duration{0, 60 * time.Millisecond, 120 * time.Millisecond} {
		var st *shardDown
		c := newShareClusterOf(t, 4, Share, Fixed, func(m *store.Memory) store.Store {
			st = &shardDown{Store: m}
			return st
		})
		gap := time.Second / (2 * shareLimit)
		c.runKeys([]string{"a", "b"}, 5*time.Second+at, gap)
		st.down.Store(true)
		outage := c.runKeys([]string{"a", "b"}, 5*time.Second, gap)
		st.down.Store(false)
		t.Logf("shard of a down %v into a window: a %v, b %v", at, outage["a"], outage["b"])
		assertNear(t, outage["a"], 1, 0.05, fmt.Sprintf("a, its shard down %v into a window", at))
		assertNear(t, outage["b"], 1, 0.03, fmt.Sprintf("b, its shard up (a's down %v into a window)", at))
	}
}

// Clocks that differ between nodes: windows follow the store's clock.
func TestShareWithSkewedClocks(t *testing.T) {
	c := newShareCluster(t, 0, Share, nil)
	for _, s := range []time.Duration{-50, -20, 20, 50} {
		c.add(Share, s*time.Millisecond)
	}
	got := c.run("k", 10*time.Second, time.Second/(2*shareLimit))
	t.Log(got)
	assertNear(t, got, 2, 0.02, "skewed clocks")
}

// Under the limit the share policy denies nothing.
func TestShareUnderTheLimit(t *testing.T) {
	for i, gap := range []time.Duration{time.Second / (shareLimit * 8 / 10), time.Second / (shareLimit * 95 / 100)} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			c := newShareCluster(t, 4, Share, nil)
			got := c.run("k", 8*time.Second, gap)
			want := int(8 * time.Second / gap)
			assert.InDelta(t, want, sum(got), 1, "every request admitted: %v", got)
		})
	}
}
