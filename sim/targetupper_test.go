package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// The -target search tries sync rates up to the slowest one the library
// accepts for the rules: the longest window, or less where a shorter rule
// (a window, a bucket, a log's two buckets) needs a sync at least as
// often; a rate past it would make New refuse the configuration.
func TestTargetUpperIsTheSlowestRateAccepted(t *testing.T) {
	accepts := func(rules []hybridlimit.Rule, rate time.Duration) bool {
		l, err := hybridlimit.New(hybridlimit.Config{Rules: rules, Mode: hybridlimit.ModeAsync, SyncRate: rate, Manual: true, Store: store.NewMemory(nil)})
		if err != nil {
			return false
		}
		require.NoError(t, l.Close(t.Context()))
		return true
	}
	for _, c := range []struct {
		rules string
		want  time.Duration
	}{
		{"1000/1s", time.Second},
		{"100/50ms,1000/1s", 50 * time.Millisecond},
		{"1000/1s:buckets=4,5000/1m", 250 * time.Millisecond},
		{"1000/1s:log", 500 * time.Millisecond},
		{"10/1s:gcra=20,100/1m", time.Minute},
		{"5/2h", time.Hour},
	} {
		rules, err := parseRules(c.rules)
		require.NoError(t, err, c.rules)
		got := targetUpper(rules)
		assert.Equal(t, c.want, got, c.rules)
		assert.True(t, accepts(rules, got), "%s: New accepts %v", c.rules, got)
		if got < time.Hour {
			assert.False(t, accepts(rules, got+time.Millisecond), "%s: New refuses %v", c.rules, got+time.Millisecond)
		}
	}
}
