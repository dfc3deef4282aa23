package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRouteNumbersAreRecycled: a Redis Cluster's masters change address
// over time (failovers, resharding onto new nodes, pods rescheduled). The
// route numbers of the masters the slot map no longer names are reused,
// so that the numbers stay at most one more than the masters serving
// slots,
// the store keeps no record (route, breaker circuit) of a master that
// serves none, and the synchronous mode's queues (maxRoutes, 64) are
// never shared while the cluster has at most 64 masters. The slot map of
// each generation is fed as the store learns it from the client
// (noteRoute); no server is needed, and the client has no slot map of
// its own (so a new master's sweep of the slots stops at once).
func TestRouteNumbersAreRecycled(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
		return nil, errors.New("no slot map")
	}})
	t.Cleanup(func() { _ = c.Close() })
	s, err := NewRedis(c, RedisOptions{BreakerMin: time.Millisecond, BreakerMax: time.Second})
	require.NoError(t, err)
	const masters, generations = 3, 200
	for gen := range generations {
		// Each generation's three masters, on new addresses, take over
		// the slots one after another, as a failover moves them.
		for m := range masters {
			addr := fmt.Sprintf("10.%d.%d.%d:6379", gen/250, gen%250, m)
			if gen > 0 {
				// The master it replaces failed its last call.
				s.breaker.done(fmt.Sprintf("10.%d.%d.%d:6379", (gen-1)/250, (gen-1)%250, m), time.Now(), false)
			}
			for g := m * Slots / masters; g < (m+1)*Slots/masters; g++ {
				s.noteRoute(g, addr)
			}
		}
		seen := map[uint32]bool{}
		for g := range Slots {
			r := s.routeOf[g].Load()
			// A new master takes a number while the one it replaces
			// still serves slots: masters + 1 at most.
			require.True(t, r >= 1 && r <= masters+1, "generation %d: slot %d on route %d, want 1 to %d", gen, g, r, masters+1)
			seen[r] = true
		}
		require.Len(t, seen, masters, "generation %d", gen)
		s.routeMu.Lock()
		n := len(s.routeIdx)
		s.routeMu.Unlock()
		require.Equal(t, masters, n, "generation %d: addresses remembered", gen)
	}
	s.breaker.mu.Lock()
	circuits := len(s.breaker.nodes)
	s.breaker.mu.Unlock()
	assert.Zero(t, circuits, "no circuit kept for a master that serves no slot")
	for i := range 100 {
		r := s.Route("hl", fmt.Sprint(i))
		assert.True(t, r >= 1 && r <= masters+1, "key %d on route %d", i, r)
	}
}

// TestRouteSweepFreesAFailedMastersNumber: a failover gives a master's
// slots to a new address. The calls that follow note the new master for
// the slots they go to; the slots no call goes to are noted again from
// the client's slot map when the new master is first seen, so the failed
// master's number and circuit are freed at once, not when every one of
// its slots sees a call again. The slot map comes from
// ClusterOptions.ClusterSlots: no server is needed.
func TestRouteSweepFreesAFailedMastersNumber(t *testing.T) {
	var masters atomic.Pointer[[3]string]
	masters.Store(&[3]string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"})
	c := redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			m := masters.Load()
			var out []redis.ClusterSlot
			for i, a := range m {
				out = append(out, redis.ClusterSlot{Start: i * Slots / 3, End: (i+1)*Slots/3 - 1, Nodes: []redis.ClusterNode{{Addr: a}}})
			}
			return out, nil
		},
	})
	t.Cleanup(func() { _ = c.Close() })
	s, err := NewRedis(c, RedisOptions{BreakerMin: time.Millisecond, BreakerMax: time.Second})
	require.NoError(t, err)
	// Keys on slots of every master, as calls would note them.
	var keys []string
	for i := range 300 {
		k := fmt.Sprint("k", i)
		keys = append(keys, k)
		require.NotEmpty(t, s.server(context.Background(), Slot(k)))
	}
	routeOf := func(k string) int { return s.Route("hl", k) }
	second := []string{} // the keys of the second master's slots
	for _, k := range keys {
		if g := Slot(k); g >= Slots/3 && g < 2*Slots/3 {
			second = append(second, k)
		}
	}
	require.NotEmpty(t, second)
	old := routeOf(second[0])
	s.breaker.done("10.0.0.2:6379", time.Now(), false) // the failed master's circuit

	// The second master fails over to a new address; one call, on the
	// first of its keys, meets the new master.
	masters.Store(&[3]string{"10.0.0.1:6379", "10.0.0.9:6379", "10.0.0.3:6379"})
	c.ReloadState(context.Background())
	require.Eventually(t, func() bool {
		m, err := c.MasterForKey(context.Background(), "{"+slotTag(Slot(second[0]))+"}")
		return err == nil && m.Options().Addr == "10.0.0.9:6379"
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, "10.0.0.9:6379", s.server(context.Background(), Slot(second[0])))

	moved := routeOf(second[0])
	assert.NotEqual(t, old, moved)
	for _, k := range second {
		assert.Equal(t, moved, routeOf(k), "key %q, its slot idle since the failover: route", k)
	}
	s.routeMu.Lock()
	_, kept := s.routeIdx["10.0.0.2:6379"]
	n := len(s.routeIdx)
	s.routeMu.Unlock()
	assert.False(t, kept, "the failed master's number is still in use")
	assert.Equal(t, 3, n, "masters with a number")
	s.breaker.mu.Lock()
	_, circuit := s.breaker.nodes["10.0.0.2:6379"]
	s.breaker.mu.Unlock()
	assert.False(t, circuit, "the failed master's circuit is kept")
}
