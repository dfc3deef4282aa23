package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStateRemainingIsWhatAllowNAdmits holds State's and PeekN's
// Remaining r to the decisions at the same instant: AllowN(r+1) is denied
// and AllowN(r) admitted. The instants are where a sliding window's estimate lies within
// rounding of a whole count plus Epsilon (one request of the previous
// window weighs 1e-9 a nanosecond per second of window before the current
// one ends), where the floor of limit − estimate + Epsilon and the
// admission test estimate + n ≤ limit + Epsilon round apart; and some at
// thirds of 300 ms windows, whose weights are not exact in binary.
func TestStateRemainingIsWhatAllowNAdmits(t *testing.T) {
	ctx := context.Background()
	ms := time.Millisecond
	cases := []struct {
		rule      Rule
		prev, cur int64         // admitted at the previous window's start, and at the current one's
		at        time.Duration // into the current window
	}{
		{Rule{Limit: 2, Window: time.Second}, 1, 1, time.Second - 1},
		{Rule{Limit: 32, Window: time.Second}, 1, 1, time.Second - 1},
		{Rule{Limit: 32, Window: time.Second}, 1, 2, time.Second - 1},
		{Rule{Limit: 9, Window: time.Second}, 7, 1, 857142857}, // weighs 7·142857143/10⁹ = 1.000000001
		{Rule{Limit: 32, Window: time.Minute}, 1, 2, time.Minute - 60},
		{Rule{Limit: 2, Window: time.Hour}, 1, 1, time.Hour - 3600},
		{Rule{Limit: 40, Window: time.Hour}, 1, 3, time.Hour - 3600},
		{Rule{Limit: 3, Window: 300 * ms}, 3, 0, 100 * ms},
		{Rule{Limit: 3, Window: 300 * ms}, 2, 1, 200 * ms},
		{Rule{Limit: 7, Window: 300 * ms}, 5, 2, 100 * ms},
		{Rule{Limit: 7, Window: 300 * ms}, 5, 1, 200 * ms},
		{Rule{Limit: 7, Window: 300 * ms}, 6, 0, 100*ms + 1},
	}
	// setup returns a limiter of rule that admitted prev at the start of
	// a window and cur at the start of the next, at instant at into it.
	setup := func(i int, rule Rule, prev, cur int64, at time.Duration) *Limiter {
		l, mock := newMockLimiter(t, Config{Rules: []Rule{rule}})
		for k, n := range []int64{prev, cur} {
			mock.Set(t0.Add(time.Duration(k) * rule.Window))
			if n > 0 {
				res, err := l.AllowN(ctx, "k", n)
				require.NoError(t, err)
				require.True(t, res.Allowed, "case %d: setting up", i)
			}
		}
		mock.Set(t0.Add(rule.Window + at))
		return l
	}
	for i, c := range cases {
		l := setup(i, c.rule, c.prev, c.cur, c.at)
		st, err := l.State(ctx, "k", nil)
		require.NoError(t, err)
		r := st[0].Remaining
		peek, err := l.PeekN(ctx, "k", 1)
		require.NoError(t, err)
		if peek.Remaining != r {
			t.Errorf("case %d (%v, prev %d, cur %d, at %v): PeekN's Remaining %d, State's %d", i, c.rule, c.prev, c.cur, c.at, peek.Remaining, r)
		}
		over, err := l.PeekN(ctx, "k", r+1)
		require.NoError(t, err)
		denied, err := l.AllowN(ctx, "k", r+1)
		require.NoError(t, err)
		if over.Allowed || denied.Allowed {
			t.Errorf("case %d (%v, prev %d, cur %d, at %v): State's Remaining is %d, got PeekN(%d) %v, AllowN(%d) %v, want both denied",
				i, c.rule, c.prev, c.cur, c.at, r, r+1, over.Allowed, r+1, denied.Allowed)
		}
		if r == 0 {
			continue
		}
		fits, err := l.PeekN(ctx, "k", r)
		require.NoError(t, err)
		admitted, err := l.AllowN(ctx, "k", r)
		require.NoError(t, err)
		if !fits.Allowed || !admitted.Allowed {
			t.Errorf("case %d (%v, prev %d, cur %d, at %v): State's Remaining is %d, got PeekN(%d) %v, AllowN(%d) %v, want both admitted",
				i, c.rule, c.prev, c.cur, c.at, r, r, fits.Allowed, r, admitted.Allowed)
		}
	}
}
