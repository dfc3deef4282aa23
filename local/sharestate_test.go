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
	x := tb.shareOf(e, 0)
	assert.Equal(t, int64(5), x.snap.win.Load(), "its statistics start at that sync")
	assert.Equal(t, int64(5), x.st.total, "its statistics start at that sync")
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
	tb.settleShare(e, 0, synced-100*ms, 7, 2, 0, false, 1, 0, 1)
	tb.settleShare(e, 0, synced, 7, 4, 0, false, 1, 0, 1)
	tb.mu(e).Unlock()
	v, ok := tb.shareOf(e, 0).snap.load()
	require.True(t, ok)
	require.Equal(t, 1.0, v.share, "handed off to the plain rule")
	require.InDelta(t, 0.5, v.safe, 1e-7, "then a share of one half")
	const hold = 200 * ms // two sync periods of 100 ms
	require.Equal(t, synced+hold, v.until, "handed off for two sync periods")
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
	tb.settleShare(e, 0, synced+100*ms, 7, 6, 0, false, 1, 0, 1)
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
			tb.settleShare(e, 0, s.at, s.win, s.cur, s.prev, prevRead, ownCur, ownPrev, ownCur)
			if k == 1 {
				assert.Equal(t, float32(600), tb.shareOf(e, 0).st.allPeak, "%v: the burst's sync", tc.kind)
			}
		}
		tb.mu(e).Unlock()
		v, ok := tb.shareOf(e, 0).snap.load()
		require.True(t, ok)
		assert.Equal(t, tc.handOff, v.share == 1, "%v: hand-off at the next window's first sync", tc.kind)
		assert.InDelta(t, 0.25, v.share, 1e-9, "%v", tc.kind)
		assert.InDelta(t, tc.lag, v.lag, tc.lagDelta, "%v: the others' unpushed admissions", tc.kind)
	}
}

// TestShareOutageMidBurstDecidesByTheSettledShare checks, over exact
// syncs, which share decides once a key's syncs stop in the middle of a
// Fixed window's burst (a store outage). A node's own push enters its
// average at its sync, the others' only at its next one, so the averages
// taken mid-burst give every node more than its part, and the frozen
// shares add up to more than one. From the hand-off deadline on, the share
// as the previous window ended decides, when lower.
func TestShareOutageMidBurstDecidesByTheSettledShare(t *testing.T) {
	const sec, ms = int64(time.Second), int64(time.Millisecond)
	type sync struct{ at, win, cur, prev, own int64 }
	for _, tc := range []struct {
		name  string
		burst []sync // window 7's first syncs: this node's quarter of the burst
		// whether window 8's first sync hands the key to the plain rule
		// (a burst seen in one sync leaves too little headroom for it)
		handOff bool
	}{
		{"burst over two syncs", []sync{{7*sec + 50*ms, 7, 300, 0, 75}, {7*sec + 150*ms, 7, 600, 0, 75}}, true},
		{"burst in one sync", []sync{{7*sec + 1*ms, 7, 0, 0, 0}, {7*sec + 50*ms, 7, 600, 0, 150}, {7*sec + 150*ms, 7, 600, 0, 0}}, false},
	} {
		syncs := tc.burst
		for at := 7*sec + 250*ms; at < 8*sec; at += 100 * ms {
			syncs = append(syncs, sync{at, 7, 600, 0, 0})
		}
		// Window 8's first sync: this node pushed its part of the new
		// burst, the others' is not in the store yet. The store is lost
		// after it.
		last := sync{8*sec + 50*ms, 8, 150, 600, 150}
		syncs = append(syncs, last)
		tb := NewTable(Options{
			Rules:   []Rule{NewRule(Spec{Kind: Fixed, Limit: 600, Window: time.Second})},
			MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 3 * sec, SyncRate: 100 * ms,
		})
		require.True(t, allow(t, tb, "k", 1, 7*sec))
		e := entry(t, tb, "k")
		tb.mu(e).Lock()
		tb.newShares(e)
		for _, s := range syncs {
			tb.settleShare(e, 0, s.at, s.win, s.cur, s.prev, s.win == 8, s.own, 0, s.own)
		}
		skewed := tb.shareOf(e, 0).st.share()
		tb.mu(e).Unlock()
		require.Greater(t, skewed, 0.3, "%s: the averages mid-burst", tc.name)
		v, ok := tb.shareOf(e, 0).snap.load()
		require.True(t, ok)
		assert.Equal(t, tc.handOff, v.share == 1, "%s: hand-off", tc.name)
		if !tc.handOff {
			assert.InDelta(t, skewed, v.share, 1e-9, "%s: until the deadline, the averages' share", tc.name)
		}
		assert.InDelta(t, 0.25, v.safe, 1e-6, "%s: the share as window 7 ended", tc.name)
		require.Equal(t, last.at+200*ms, v.until, "%s: two sync periods past the last sync", tc.name)
		for _, c := range []struct {
			at    int64
			share float64
		}{
			{v.until - 1, v.share},
			{v.until, 0.25},
			{10 * sec, 0.25}, // two windows on: the rule is own ≤ share·limit
		} {
			win, el := WindowOf(c.at, sec)
			_, room, applies := tb.shareRoomOf(e, 0, 0, 0, win, el)
			if c.share >= 1 {
				assert.False(t, applies, "%s, at %d ms: the plain rule", tc.name, c.at/ms)
				continue
			}
			require.True(t, applies, "%s, at %d ms", tc.name, c.at/ms)
			// The table saw no push: the counter's base is 0, and so are
			// own and known.
			want := c.share*(600-v.lag) + v.dith
			if win > 8 {
				want = c.share*600 + v.dith
			}
			assert.InDelta(t, want, room, 1e-3, "%s, at %d ms", tc.name, c.at/ms)
		}
	}
}

// TestShareRecoversFromAnOutage checks, over exact syncs, a Fixed rule's
// first syncs after a store outage. The store's totals lack what the
// other nodes admitted in the outage until they push it, after their
// backoff: the plain rule on every node would spend it again. For
// outagePeriods syncs the node gets no hand-off, its averages take no
// sample (the others' late pushes are no traffic of theirs), and its room
// is at most the outage's: safe·limit + dither − what it admitted in the
// window.
func TestShareRecoversFromAnOutage(t *testing.T) {
	const sec, ms = int64(time.Second), int64(time.Millisecond)
	tb, e, settle := recoveryFixture(t, 100*ms)
	// Window 7: this node's quarter of the key's increments, every sync.
	for k := int64(0); k < 10; k++ {
		settle(7*sec+(10*k+5)*ms*10, 7, 40*(k+1), 0, 10)
	}
	// The store is lost from 7.95 s to 10 s. This node admitted 150 of
	// window 10 meanwhile, a quarter of the limit; the others' 450 are not
	// in the store yet.
	samples := tb.shareOf(e, 0).st.samples
	v := settle(10*sec+50*ms, 10, 150, 0, 150)
	st := tb.shareOf(e, 0).st
	assert.Equal(t, int16(outagePeriods), st.recover, "recovering")
	assert.Equal(t, float32(150), st.ownWin)
	require.Less(t, v.share, 1.0, "no hand-off: the quota left is not free")
	assert.InDelta(t, 0.25, v.safe, 1e-6)
	_, room, applies := tb.shareRoomOf(e, 0, 0, 150, 10, 60*ms)
	require.True(t, applies)
	assert.LessOrEqual(t, room, v.dith+1e-9, "the outage's room: 0.25·600 + dither − 150")
	// Two more syncs: this node's own 5 count; the others' still missing.
	settle(10*sec+150*ms, 10, 155, 0, 5)
	v = settle(10*sec+250*ms, 10, 160, 0, 5)
	st = tb.shareOf(e, 0).st
	assert.Equal(t, int16(outagePeriods-2), st.recover)
	assert.Equal(t, float32(160), st.ownWin)
	require.Less(t, v.share, 1.0)
	_, room, _ = tb.shareRoomOf(e, 0, 0, 160, 10, 260*ms)
	assert.LessOrEqual(t, room, v.dith-10+1e-9, "the outage's room, less the 10 admitted since")
	for at := 10*sec + 350*ms; at < 11*sec; at += 100 * ms {
		settle(at, 10, 160, 0, 0)
	}
	st = tb.shareOf(e, 0).st
	require.Equal(t, int16(outagePeriods-9), st.recover)
	assert.Equal(t, int16(samples), st.samples, "no sample while recovering")
	// The next window: the outage's increments are the last window's,
	// and the cap counts this node's in the new one.
	settle(11*sec+50*ms, 11, 20, 600, 5)
	st = tb.shareOf(e, 0).st
	assert.Equal(t, int16(outagePeriods-10), st.recover)
	assert.Equal(t, float32(5), st.ownWin)
	for k := range st.recover {
		settle(11*sec+int64(150+100*k)*ms, 11, 20, 0, 0)
	}
	st = tb.shareOf(e, 0).st
	assert.Zero(t, st.recover)
	assert.Equal(t, int16(samples+1), st.samples, "the last sync of the recovery is a sample")
}

// TestShareRecoveryGaps checks, over exact syncs, which syncs count as a
// gap: one a sync period or more past the snapshot's deadline, not a
// cycle a little late; and that a gap while recovering (a Cluster that
// answers, then refuses again) keeps what this node admitted in the
// window, rather than starting over from the new sync's increments.
func TestShareRecoveryGaps(t *testing.T) {
	const sec, ms = int64(time.Second), int64(time.Millisecond)
	tb := NewTable(Options{
		Rules:   []Rule{NewRule(Spec{Kind: Fixed, Limit: 6000, Window: 10 * time.Second})},
		MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 30 * sec, SyncRate: 100 * ms,
	})
	require.True(t, allow(t, tb, "k", 1, 70*sec))
	e := entry(t, tb, "k")
	cur := int64(0)
	settle := func(at, own, others int64) *shareStats {
		cur += own + others
		tb.mu(e).Lock()
		defer tb.mu(e).Unlock()
		tb.settleShare(e, 0, at, 7, cur, 0, false, own, 0, own)
		return &tb.shareOf(e, 0).st
	}
	tb.mu(e).Lock()
	tb.newShares(e)
	tb.mu(e).Unlock()
	// Window 7 (70 s to 80 s): syncs every 100 ms, this node a quarter.
	for at := 70*sec + 50*ms; at <= 71*sec+50*ms; at += 100 * ms {
		settle(at, 10, 30)
	}
	// 250 ms on: past the deadline (two periods), not a period past it.
	st := settle(71*sec+300*ms, 10, 30)
	assert.Zero(t, st.recover, "a late sync is no outage")
	// The measured period is now 137.5 ms: the deadline 71.575 s, a gap
	// from 71.7125 s.
	st = settle(71*sec+800*ms, 30, 0)
	require.Equal(t, int16(outagePeriods), st.recover, "a gap")
	assert.Equal(t, float32(30), st.ownWin)
	st = settle(71*sec+900*ms, 10, 0)
	assert.Equal(t, int16(outagePeriods-1), st.recover)
	assert.Equal(t, float32(40), st.ownWin)
	// Another gap while recovering (the deadline 72.175 s), in the same
	// window: the count goes on.
	st = settle(72*sec+400*ms, 20, 0)
	assert.Equal(t, int16(outagePeriods), st.recover, "renewed")
	assert.Equal(t, float32(60), st.ownWin, "what this node admitted in the window since the first gap")
}

// TestShareRecoveryWaitsForTheOthers checks, over exact syncs, that a
// recovery does not end while the store's count of the window lacks the
// other nodes' part of it: in a Redis Cluster, a node can reach the
// promoted replica well before the others (a StoreTimeout and a slot-map
// reload), and ending its recovery on totals that hold only its own
// increments handed the key to the plain rule, which spent the others'
// part again (a real cluster: 1,160 admitted in a window of an 800 limit).
// It waits at most outageWait syncs.
func TestShareRecoveryWaitsForTheOthers(t *testing.T) {
	const sec, ms = int64(time.Second), int64(time.Millisecond)
	for _, back := range []bool{true, false} {
		tb, e, settle3 := recoveryFixture(t, 10*ms)
		settle := func(at, win, cur, own int64) snapValues { return settle3(at, win, cur, 0, own) }
		// Window 7: this node's quarter of the key's increments, every 10 ms.
		for k := int64(0); k < 20; k++ {
			settle(7*sec+(10*k+5)*ms, 7, 4*(k+1), 1)
		}
		// The store is lost from 7.2 s to 10 s; this node admitted 150 of
		// window 10 meanwhile, and its syncs then find only its own.
		at, cur := 10*sec+5*ms, int64(150)
		settle(at, 10, cur, 150)
		st := &tb.shareOf(e, 0).st
		require.Equal(t, int16(outagePeriods), st.recover)
		for range outagePeriods + 5 {
			at += 10 * ms
			v := settle(at, 10, cur, 0)
			require.Positive(t, st.recover, "the others' part is missing: still recovering")
			require.Less(t, v.share, 1.0, "no hand-off")
		}
		if back {
			// The others push their 450 of the outage: the recovery ends.
			cur += 450
			at += 10 * ms
			settle(at, 10, cur, 0)
			assert.Zero(t, st.recover, "the others' part is in")
			continue
		}
		for range outageWait {
			at += 10 * ms
			settle(at, 10, cur, 0)
		}
		assert.Zero(t, st.recover, "waited outageWait syncs at most")
	}
}

// recoveryFixture is a table of a Fixed 600/1s rule under the share
// policy, synced every rate (ns), with key "k" admitted once at 7 s and
// its share state made; settle settles the key's sync at at (window win,
// the store's counts cur and prev, own of them this node's).
func recoveryFixture(t *testing.T, rate int64) (*Table, *Entry, func(at, win, cur, prev, own int64) snapValues) {
	tb := NewTable(Options{
		Rules:   []Rule{NewRule(Spec{Kind: Fixed, Limit: 600, Window: time.Second})},
		MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 3 * int64(time.Second), SyncRate: rate,
	})
	require.True(t, allow(t, tb, "k", 1, 7*int64(time.Second)))
	e := entry(t, tb, "k")
	settle := func(at, win, cur, prev, own int64) snapValues {
		tb.mu(e).Lock()
		tb.settleShare(e, 0, at, win, cur, prev, false, own, 0, own)
		tb.mu(e).Unlock()
		v, ok := tb.shareOf(e, 0).snap.load()
		require.True(t, ok)
		return v
	}
	tb.mu(e).Lock()
	tb.newShares(e)
	tb.mu(e).Unlock()
	return tb, e, settle
}
