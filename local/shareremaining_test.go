package local

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestShareRemainingIsWhatAllowAdmits holds the Remaining that Levels and
// Peek report under the share policy to the decisions at the same
// instant: a request of cost Remaining+1 is denied (by Peek, Allow1 and
// Allow) and one of cost Remaining admitted. The share's room is set to a
// whole count less a fraction at and around Epsilon, where the decisions'
// test n ≤ room + Epsilon and a floor of the room alone part.
func TestShareRemainingIsWhatAllowAdmits(t *testing.T) {
	const sec = int64(time.Second)
	for _, rules := range [][]Rule{
		{NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Second})},
		{NewRule(Spec{Kind: Fixed, Limit: 100, Window: time.Second})},
		{NewRule(Spec{Kind: Sliding, Limit: 100, Window: time.Second}), NewRule(Spec{Kind: Sliding, Limit: 1000, Window: time.Minute})},
	} {
		for _, below := range []float64{1e-10, 5e-10, 1e-9, 1.5e-9, 1e-6, 0.5, 1} {
			tb := NewTable(Options{Rules: rules, MaxKeys: 10, Syncing: true, Share: true, ReadPrev: 3 * sec})
			now := 60 * sec // a boundary of every window
			require.True(t, allow(t, tb, "k", 40, now))
			e := entry(t, tb, "k")
			// Another node's 10 in the current windows: a share state.
			pushes, _ := tb.Take(e, now+1, nil)
			totals := make([]int64, len(pushes))
			for i, p := range pushes {
				totals[i] = p.Delta
				if p.kind == pushCur {
					totals[i] += 10
				}
			}
			tb.Settle(e, 0, pushes, totals)
			require.NotNil(t, tb.shareOf(e, 0))
			// Window 60, base 50 (the store's total), nothing of this
			// node's since: room = share·(limit − 50) + dither = 0.5·50 +
			// 1 − below = 26 − below.
			for i := range rules {
				if x := tb.shareOf(e, i); x != nil {
					id, _ := WindowOf(now, rules[i].w)
					x.snap.store(snapValues{win: id, base: 50, share: 0.5, dith: 1 - below})
				}
			}
			now += 2
			var lv [2]Level
			tb.Levels("k", now, lv[:len(rules)])
			r := lv[0].Remaining
			for i := range rules {
				r = min(r, lv[i].Remaining)
			}
			name := fmt.Sprintf("%d rules, %v", len(rules), rules[0].Kind())
			p := tb.Peek("k", 1, now)
			assert.Equal(t, r, p.Remaining, "%s, room 26 − %g: Peek's Remaining", name, below)
			assert.False(t, tb.Peek("k", r+1, now).Allowed, "%s, room 26 − %g: Levels' Remaining is %d, Peek(%d)", name, below, r, r+1)
			assert.True(t, tb.Peek("k", r, now).Allowed, "%s, room 26 − %g: Levels' Remaining is %d, Peek(%d)", name, below, r, r)
			rule, _, _ := tb.Allow1("k", r+1, now)
			assert.Negative(t, rule, "%s, room 26 − %g: Levels' Remaining is %d, Allow1(%d)", name, below, r, r+1)
			assert.False(t, allow(t, tb, "k", r+1, now), "%s, room 26 − %g: Levels' Remaining is %d, Allow(%d)", name, below, r, r+1)
			assert.True(t, allow(t, tb, "k", r, now), "%s, room 26 − %g: Levels' Remaining is %d, Allow(%d)", name, below, r, r)
		}
	}
}
