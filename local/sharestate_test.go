package local

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShareStateOnlyWhenShared checks that a key holds no share state
// while its syncs show only this node's increments, and gets one at the
// first sync that shows another node's.
func TestShareStateOnlyWhenShared(t *testing.T) {
	tb := NewTable(Options{
		Rules:   []Rule{NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Duration(w)})},
		MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 3 * w,
	})
	require.True(t, allow(t, tb, "k", 3, 5*w))
	e := entry(t, tb, "k")
	takeSettle(tb, e, 5*w+1, 0)
	require.True(t, allow(t, tb, "k", 2, 5*w+2))
	takeSettle(tb, e, 5*w+3, 0)
	takeSettle(tb, e, 5*w+4, 0) // a read
	assert.Nil(t, tb.shareOf(e, 0), "only this node's increments: no state")
	assert.Nil(t, tb.ext(e), "nor an extension")
	assert.False(t, e.has(flagShared), "nor the flag decisions read first")
	require.True(t, allow(t, tb, "k", 1, 5*w+5))
	takeSettle(tb, e, 5*w+6, 4) // the store's total grew by 4 more than pushed
	require.NotNil(t, tb.shareOf(e, 0), "another node's increments: a state")
	assert.True(t, e.has(flagShared))
	st := tb.shareOf(e, 0).st
	assert.Equal(t, int64(5), st.win, "its statistics start at that sync")
	assert.Equal(t, int64(5), st.total, "its statistics start at that sync")
}
