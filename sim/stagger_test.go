package main

import (
	"io"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// memoryEnv is the environment of one configuration on the memory store.
func memoryEnv() env {
	return env{
		start: virtualStart,
		newStore: func(c *vclock) (store.Store, string, error) {
			return store.NewMemory(c), "stagger", nil
		},
	}
}

// pendingSyncs returns, per node slot, the instants (from the start) of the
// sync cycles waiting in d's event queue for the slot's current limiter.
func pendingSyncs(d *driver) [][]time.Duration {
	out := make([][]time.Duration, len(d.nodes))
	for _, e := range d.ev {
		if e.kind == evSync && e.gen == d.nodes[e.node].gen {
			out[e.node] = append(out[e.node], time.Duration(e.at))
		}
	}
	return out
}

// With -stagger, node i of N first syncs (i+1)/N of a sync period after it
// starts: distinct instants, evenly spread. Without it every node syncs one
// period after it starts.
func TestStaggerFirstSyncInstants(t *testing.T) {
	for _, tc := range []struct {
		stagger bool
		want    []time.Duration
	}{
		{true, []time.Duration{25 * time.Millisecond, 50 * time.Millisecond, 75 * time.Millisecond, 100 * time.Millisecond}},
		{false, []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}},
	} {
		o, err := parseFlags([]string{"-nodes", "4", "-modes", "async:100ms", "-stagger=" + map[bool]string{true: "true", false: "false"}[tc.stagger]}, io.Discard)
		require.NoError(t, err)
		d, err := newDriver(o, o.Modes[0], memoryEnv())
		require.NoError(t, err)
		var got []time.Duration
		for i, s := range pendingSyncs(d) {
			require.Len(t, s, 1, "node %d", i)
			got = append(got, s[0])
		}
		assert.Equal(t, tc.want, got, "stagger %v", tc.stagger)
	}
}

// Nodes that leave and rejoin (-churn) come back with the same phases as
// the slots had: slot i first syncs (i+1)/N of a period after the rejoin.
func TestStaggerAfterChurn(t *testing.T) {
	o, err := parseFlags([]string{"-nodes", "4", "-modes", "async:100ms", "-churn", "2@1s+1s"}, io.Discard)
	require.NoError(t, err)
	d, err := newDriver(o, o.Modes[0], memoryEnv())
	require.NoError(t, err)
	require.NoError(t, d.until(int64(2*time.Second))) // the rejoin is due at 2s
	syncs := pendingSyncs(d)
	for i, want := range []time.Duration{2025 * time.Millisecond, 2050 * time.Millisecond, 2075 * time.Millisecond, 2100 * time.Millisecond} {
		require.Len(t, syncs[i], 1, "node %d", i)
		assert.Equal(t, want, syncs[i][0], "node %d", i)
	}
}

// End to end, through the command line: a 1.5 s run syncing every 1 s.
// Staggered, nodes 0 and 1 (first cycles at 0.25 s and 0.5 s) sync twice,
// nodes 2 and 3 (0.75 s, 1 s) once; all at once, every node syncs once, at
// 1 s. Each node also reads the store's clock once when it starts.
func TestStaggerPerNodeStoreCalls(t *testing.T) {
	calls := func(args ...string) []float64 {
		reps, _ := runJSON(t, append([]string{"-nodes", "4", "-duration", "1500ms", "-rate", "400", "-modes", "async:1s", "-per-node"}, args...)...)
		var out []float64
		for _, n := range reps[0]["per_node"].([]any) {
			out = append(out, n.(map[string]any)["store_calls"].(float64))
		}
		return out
	}
	staggered := calls()
	assert.Equal(t, []float64{3, 3, 2, 2}, staggered)
	assert.Equal(t, []float64{2, 2, 2, 2}, calls("-stagger=false"))
	assert.False(t, slices.Equal(staggered, calls("-stagger=false")), "-stagger changes when the nodes sync")
}

// A node that leaves while its paced cycle is in the reply's half of the
// round trip (the store already applied the push) finishes that cycle and
// leaves; the driver does not wait for an apply that already happened.
// Here node 1 syncs at 1.004 s, the push is applied at 1.006 s and the
// reply arrives at 1.008 s; it leaves at 1.007 s, and at 1.008 s before
// the reply (the leave was scheduled first).
func TestChurnDuringReply(t *testing.T) {
	for _, at := range []string{"1007ms", "1008ms"} {
		done := make(chan int, 1)
		go func() {
			done <- run([]string{"-nodes", "2", "-duration", "3s", "-modes", "async:10ms", "-store-latency", "4ms", "-churn", "1@" + at + "+1s", "-small=false", "-quiet"}, io.Discard, io.Discard)
		}()
		select {
		case code := <-done:
			assert.Equal(t, 0, code, "churn at %s", at)
		case <-time.After(2 * time.Minute):
			t.Fatalf("churn at %s: the run is stuck (a leave between a paced cycle's apply and reply)", at)
		}
	}
}

// With -store-latency a node's cycles start every sync rate, as the
// background loop's (sync.Loop.Run schedules the next cycle from the
// instant the last one started), not every rate plus the round trip. One
// node syncing every 100 ms with a 50 ms round trip: the clock read at its
// start, then cycles at 0.1 s … 0.9 s reach the store within the 1 s run
// (the one at 1 s reaches it after the end), as without latency where the
// cycle at 1 s is a call too.
func TestStoreLatencyKeepsTheSyncRate(t *testing.T) {
	calls := func(lat string) float64 {
		reps, _ := runJSON(t, "-nodes", "1", "-keys", "1", "-pattern", "under", "-duration", "1s", "-modes", "async:100ms", "-store-latency", lat, "-small=false")
		return reps[0]["store_calls"].(float64)
	}
	assert.Equal(t, 11.0, calls("0"))
	assert.Equal(t, 10.0, calls("50ms"))
}
