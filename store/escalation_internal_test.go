package store

import (
	"math"
	"testing"
	"time"
)

// escalation doubles without overflow whatever the strikes: it stops at
// max, and every length lies within [base, max].
func TestEscalationBounds(t *testing.T) {
	const maxWindow = 366 * 24 * time.Hour // hybridlimit.MaxWindow
	for _, c := range []struct{ base, max time.Duration }{
		{time.Second, maxWindow},
		{time.Second, time.Second},
		{maxWindow, maxWindow},
		{time.Second, 3 * time.Second},
		{maxWindow/2 + 1, maxWindow},
	} {
		prev := time.Duration(0)
		for _, n := range []int{math.MinInt, -1, 0, 1, 2, 3, 30, 62, 63, 64, 1000, math.MaxInt32, math.MaxInt - 1, math.MaxInt} {
			d := escalation(c.base, c.max, n)
			if d < c.base || d > c.max {
				t.Errorf("escalation(%v, %v, %d) = %v, want %v to %v", c.base, c.max, n, d, c.base, c.max)
			}
			if n >= 1 && d < prev {
				t.Errorf("escalation(%v, %v, %d) = %v, less than for fewer strikes (%v)", c.base, c.max, n, d, prev)
			}
			if n >= 1 {
				prev = d
			}
		}
		if got := escalation(c.base, c.max, 2); got != min(2*c.base, c.max) {
			t.Errorf("escalation(%v, %v, 2) = %v, want %v", c.base, c.max, got, min(2*c.base, c.max))
		}
	}
}
