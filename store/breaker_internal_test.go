package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The calls on their way when a server stops answering count as one
// failure; only failed probes double the backoff; a canceled probe hands
// its turn to the next call.
func TestBreakerCountsOneFailurePerOpening(t *testing.T) {
	now := time.Unix(1000, 0)
	b := newBreaker(100*time.Millisecond, time.Second)
	b.now = func() time.Time { return now }

	sent := now
	for range 4 { // four lanes' pipelines on their way
		require.True(t, b.allow("a"))
	}
	now = now.Add(300 * time.Millisecond) // they all time out
	for range 4 {
		b.done("a", sent, false)
	}
	now = now.Add(50 * time.Millisecond)
	assert.False(t, b.allow("a"), "open")
	now = now.Add(50 * time.Millisecond)
	require.True(t, b.allow("a"), "the probe, after BreakerMin: one failure, not doubled by each call that failed with it")
	assert.False(t, b.allow("a"), "one probe at a time")

	probe := now
	now = now.Add(10 * time.Millisecond)
	b.done("a", probe, false)
	now = now.Add(150 * time.Millisecond)
	assert.False(t, b.allow("a"), "a failed probe doubles the backoff")
	now = now.Add(60 * time.Millisecond)
	require.True(t, b.allow("a"), "the next probe")

	b.abandon("a") // its caller canceled it
	require.True(t, b.allow("a"), "a canceled probe hands its turn to the next call")
	b.done("a", now, true)
	for range 3 {
		assert.True(t, b.allow("a"), "closed")
	}
}

// allow reports whether a call to node may be sent now (allowAt without
// the probe's time).
func (b *breaker) allow(node string) bool {
	_, ok := b.allowAt(node)
	return ok
}
