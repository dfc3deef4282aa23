package local

import (
	"math"
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

// TestShareHandOffHoldsUntilItsDeadline checks, over exact instants, how
// long a sync's hand-off of a key to the plain rule holds: two sync periods
// past that sync of the key, after which the share decides (a store
// outage). A sync of another key does not extend it (in a Cluster, the
// other shards answering while the key's is down); the key's next sync
// does.
func TestShareHandOffHoldsUntilItsDeadline(t *testing.T) {
	const sec, ms = int64(time.Second), int64(time.Millisecond)
	tb := NewTable(Options{
		Rules:   []Rule{NewRule(Spec{Kind: Fixed, Limit: 100, Window: time.Second})},
		MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 3 * sec, SyncRate: 100 * ms,
	})
	start := 7 * sec
	require.True(t, allow(t, tb, "k", 1, start))
	e := entry(t, tb, "k")
	// Two syncs 100 ms apart; between them this node and another admitted
	// one each: a share of one half, and nearly all the quota left.
	synced := start + 150*ms
	tb.mu(e).Lock()
	tb.newShares(e)
	tb.settleShare(e, 0, synced-100*ms, 7, 2, 0, false, 1, 0)
	tb.settleShare(e, 0, synced, 7, 4, 0, false, 1, 0)
	tb.mu(e).Unlock()
	v, ok := tb.shareOf(e, 0).snap.load()
	require.True(t, ok)
	require.InDelta(t, 0.5, v.share, 1e-9)
	const hold = 200 * ms // two sync periods of 100 ms
	require.Equal(t, synced+hold, v.hold, "handed off for two sync periods")
	// Another key synced just before the deadline.
	require.True(t, allow(t, tb, "other", 1, synced+hold-2))
	o := entry(t, tb, "other")
	pushes, _ := tb.Take(o, synced+hold-1, nil)
	tb.Settle(o, synced+hold-1, pushes, []int64{1})
	for _, tc := range []struct {
		at      int64
		applies bool
	}{
		{synced, false},
		{synced + hold - 1, false},
		{synced + hold, true},
		{synced + hold + 1, true},
	} {
		_, room, applies := tb.shareRoomOf(e, 0, 0, 1, 7, tc.at-start)
		assert.Equal(t, tc.applies, applies, "synced%+d ns", tc.at-synced)
		if applies {
			// The counter's base, 0 (no push taken: known 0, own 1), and
			// the dither's mean.
			assert.InDelta(t, 0.5*(100-0-v.lag)+0.5-1, room, 1e-9, "synced%+d ns", tc.at-synced)
		}
	}
	// The key's own next sync renews the hand-off.
	tb.mu(e).Lock()
	tb.settleShare(e, 0, synced+100*ms, 7, 6, 0, false, 1, 0)
	tb.mu(e).Unlock()
	_, _, applies := tb.shareRoomOf(e, 0, 0, 1, 7, synced+hold-start)
	assert.False(t, applies, "renewed by the key's next sync")
}

// TestShareRemembersAFixedWindowsBurst checks, over exact syncs, that the
// share policy sizes a Fixed window's start by the busiest sync of the
// last windows, not by the window's average. Four nodes at 6× a Fixed
// limit of 1000/s spend the quota in the first two syncs of a window and
// admit nothing after; at the next window's first sync the average
// (100 per sync) would hand the key to the plain rule on every node, and
// the others' rate (which saw the idle end of the window) would count
// almost none of their unpushed burst.
func TestShareRemembersAFixedWindowsBurst(t *testing.T) {
	const sec, ms = int64(time.Second), int64(time.Millisecond)
	type sync struct{ at, win, cur, prev, own int64 }
	// This node's quarter of the store's totals, synced every 100 ms.
	syncs := []sync{{7*sec + 50*ms, 7, 300, 0, 75}, {7*sec + 150*ms, 7, 900, 0, 150}, {7*sec + 250*ms, 7, 1000, 0, 25}}
	for at := 7*sec + 350*ms; at < 8*sec; at += 100 * ms {
		syncs = append(syncs, sync{at, 7, 1000, 0, 0})
	}
	syncs = append(syncs, sync{8*sec + 50*ms, 8, 300, 1000, 75})
	for _, tc := range []struct {
		kind     Kind
		handOff  bool
		lag      float64
		lagDelta float64
	}{
		// The others' busiest rate, 450 per 100 ms, faded over 9 syncs
		// of 1/40 of 4 windows each, times half a sync period.
		{Fixed, false, 0.5 * 450 * math.Pow(1-0.1/peakWindows, 9), 1e-3},
		// A Sliding window's quota frees as it slides: the others' recent
		// rate, 225 per 100 ms after a run of idle syncs, halved each sync.
		{Sliding, false, 0.5 * 113, 1},
	} {
		tb := NewTable(Options{
			Rules:   []Rule{NewRule(Spec{Kind: tc.kind, Limit: 1000, Window: time.Second})},
			MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 3 * sec,
		})
		require.True(t, allow(t, tb, "k", 1, 7*sec))
		e := entry(t, tb, "k")
		tb.mu(e).Lock()
		tb.newShares(e)
		for k, s := range syncs {
			prevRead := s.win == 8
			ownCur, ownPrev := s.own, int64(0)
			tb.settleShare(e, 0, s.at, s.win, s.cur, s.prev, prevRead, ownCur, ownPrev)
			if k == 1 {
				assert.Equal(t, float32(600), tb.shareOf(e, 0).st.allPeak, "%v: the burst's sync", tc.kind)
			}
		}
		tb.mu(e).Unlock()
		v, ok := tb.shareOf(e, 0).snap.load()
		require.True(t, ok)
		assert.Equal(t, tc.handOff, v.hold > 0, "%v: hand-off at the next window's first sync", tc.kind)
		assert.InDelta(t, 0.25, v.share, 1e-9, "%v", tc.kind)
		assert.InDelta(t, tc.lag, v.lag, tc.lagDelta, "%v: the others' unpushed admissions", tc.kind)
	}
}
