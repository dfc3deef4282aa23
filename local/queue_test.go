package local

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTouchedQueue checks the touched queue: every entry decided on since
// the last Detach is handed out once, in chunks of at most max; entries
// queued after Detach wait for the next one; an entry handed out is
// queued again by its next decision.
func TestTouchedQueue(t *testing.T) {
	tb := newTestTable(t, true, 1000)
	assert.False(t, tb.Detach(), "nothing decided yet")
	for i := range 10 {
		allow(t, tb, fmt.Sprint("k", i), 1, 5*w)
		allow(t, tb, fmt.Sprint("k", i), 1, 5*w) // queued once
	}
	require.True(t, tb.Detach())
	allow(t, tb, "late", 1, 5*w) // after Detach: the next cycle's
	seen := map[string]int{}
	for {
		chunk := tb.Touched(nil, 3)
		if len(chunk) == 0 {
			break
		}
		assert.LessOrEqual(t, len(chunk), 3)
		for _, e := range chunk {
			seen[e.Key()]++
		}
	}
	assert.Len(t, seen, 10)
	for k, n := range seen {
		assert.Equal(t, 1, n, k)
	}
	allow(t, tb, "k3", 1, 5*w) // handed out: queued again
	require.True(t, tb.Detach())
	got := map[string]bool{}
	for _, e := range tb.Touched(nil, 100) {
		got[e.Key()] = true
	}
	assert.Equal(t, map[string]bool{"late": true, "k3": true}, got)
	assert.Empty(t, tb.Touched(nil, 100))
}

// TestTouchedQueueConcurrent decides on keys from several goroutines while
// cycles detach and drain the queue (run it with -race): within a cycle no
// entry is handed out twice, and at the end no entry is left marked queued
// outside every list (it would never be synced again).
func TestTouchedQueueConcurrent(t *testing.T) {
	tb := newTestTable(t, true, 1<<30)
	const goroutines, keys, rounds = 4, 50, 200
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				for k := range keys {
					if _, st := tb.Allow(fmt.Sprint("k", (k+g+r)%keys), 1, 5*w); st != Decided {
						t.Errorf("status %v", st)
						return
					}
				}
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	drain := func() map[*Entry]bool {
		seen := map[*Entry]bool{}
		tb.Detach()
		for {
			chunk := tb.Touched(nil, 7)
			if len(chunk) == 0 {
				return seen
			}
			for _, e := range chunk {
				if seen[e] {
					t.Errorf("%s handed out twice in one cycle", e.Key())
				}
				seen[e] = true
			}
		}
	}
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		drain()
	}
	drain()
	assert.Empty(t, drain(), "the last cycle took every entry")
	for k := range keys {
		assert.False(t, entry(t, tb, fmt.Sprint("k", k)).has(flagQueued), "k%d is queued in no list", k)
	}
}
