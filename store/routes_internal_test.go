package store

import (
	"fmt"
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
// (noteRoute); no server is needed.
func TestRouteNumbersAreRecycled(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
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
