package local

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A removed entry's slot holds tomb, whose key is empty, and keeps the
// removed key's hash. When the removed key was "" itself, a lookup of ""
// compares equal on both: it must still pass over the tombstone.
func TestEmptyKeyPassesOverItsTombstone(t *testing.T) {
	for _, syncing := range []bool{false, true} {
		t.Run(map[bool]string{false: "local", true: "syncing"}[syncing], func(t *testing.T) {
			tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Sliding, Limit: 5, Window: time.Duration(w)})}, MaxKeys: 10, Syncing: syncing, ReadPrev: w})
			require.True(t, allow(t, tb, "", 1, 0))
			if syncing {
				takeSettle(tb, entry(t, tb, ""), 0, 0)
			}
			now := 3*w + 1
			require.Equal(t, 1, tb.Evict(now))
			require.Equal(t, 0, tb.Len())

			assert.Nil(t, tb.load(tb.hash(""), ""), "a lookup of \"\" returned an entry after its removal")
			var v [1]Counts
			assert.False(t, tb.View("", now, 1, v[:]), "View of an evicted \"\" reports it tracked")
			assert.True(t, tb.Peek("", 5, now).Allowed)

			rule, _, _ := tb.Allow1("", 1, now)
			assert.Equal(t, -1, rule, "Allow1 decided on a tombstone")
			require.True(t, allow(t, tb, "", 5, now))
			assert.False(t, allow(t, tb, "", 1, now))
			e := entry(t, tb, "")
			assert.NotSame(t, tomb, e)
			// An empty key whose bytes start elsewhere (a string sliced
			// to nothing) finds the same entry.
			other := strings.Repeat("x", 3)[:0]
			assert.Same(t, e, tb.load(tb.hash(other), other))
			assert.Equal(t, 1, tb.Len())
			assert.Zero(t, tomb.c0.word.Load(), "a decision counted on the shared tombstone")
			assert.Zero(t, tomb.lastSeen.Load(), "a decision touched the shared tombstone")
		})
	}
}
