package httplimit_test

import (
	"math"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/httplimit"
)

// Quota is total: for every Rule, validated or not, it returns a quota and
// a window of at least zero, the window saturating at the longest Duration
// rather than wrapping, and exact (no float rounding) for buckets.
func TestQuotaEveryRule(t *testing.T) {
	const maxD = time.Duration(math.MaxInt64)
	tb, lb, sl := hybridlimit.TokenBucket, hybridlimit.LeakyBucket, hybridlimit.Sliding
	for i, c := range []struct {
		r hybridlimit.Rule
		q int64
		w time.Duration
	}{
		// Window rules: Limit per Window.
		{hybridlimit.Rule{Limit: 100, Window: time.Minute}, 100, time.Minute},
		{hybridlimit.Rule{Type: sl, Limit: 0, Window: time.Minute}, 0, time.Minute},
		{hybridlimit.Rule{Limit: -5, Window: time.Minute}, 0, time.Minute},
		{hybridlimit.Rule{Limit: 100, Window: 0}, 100, 0},
		{hybridlimit.Rule{Limit: 100, Window: -time.Second}, 100, 0},
		{hybridlimit.Rule{Limit: math.MaxInt64, Window: maxD}, math.MaxInt64, maxD},
		// Buckets: Burst (Limit when 0) over the time it takes to refill.
		{hybridlimit.Rule{Type: tb, Limit: 10, Window: time.Second}, 10, time.Second},
		{hybridlimit.Rule{Type: tb, Limit: 10, Burst: 30, Window: time.Second}, 30, 3 * time.Second},
		{hybridlimit.Rule{Type: lb, Limit: 3, Burst: 1, Window: time.Second}, 1, 333333333},
		{hybridlimit.Rule{Type: tb, Limit: 3, Burst: 7, Window: time.Second}, 7, 2333333333},
		{hybridlimit.Rule{Type: tb, Limit: 0, Burst: 5, Window: time.Second}, 5, 0},  // no rate: no refill time
		{hybridlimit.Rule{Type: tb, Limit: 0, Window: time.Second}, 0, 0},            // was 0/0: NaN
		{hybridlimit.Rule{Type: tb, Limit: -4, Burst: 8, Window: time.Second}, 8, 0}, // was a negative window
		{hybridlimit.Rule{Type: tb, Limit: 4, Burst: -8, Window: time.Second}, 0, 0},
		{hybridlimit.Rule{Type: lb, Limit: 4, Burst: 8, Window: 0}, 8, 0},
		{hybridlimit.Rule{Type: lb, Limit: 4, Burst: 8, Window: -time.Hour}, 8, 0},
		{hybridlimit.Rule{Type: tb, Limit: 1, Burst: math.MaxInt64, Window: time.Hour}, math.MaxInt64, maxD},
		{hybridlimit.Rule{Type: tb, Limit: 1, Burst: 1 << 40, Window: hybridlimit.MaxWindow}, 1 << 40, maxD},
		{hybridlimit.Rule{Type: tb, Limit: math.MaxInt64, Burst: math.MaxInt64, Window: maxD}, math.MaxInt64, maxD},
		{hybridlimit.Rule{Type: tb, Limit: math.MaxInt64, Burst: 1, Window: maxD}, 1, 1},
		{hybridlimit.Rule{Type: tb, Limit: 1 << 40, Burst: 1<<40 - 1, Window: hybridlimit.MaxWindow}, 1<<40 - 1, hybridlimit.MaxWindow - 28761},
	} {
		q, w := httplimit.Quota(c.r)
		if q != c.q || w != c.w {
			t.Errorf("case %d: Quota(%+v) = %d, %v; want %d, %v", i, c.r, q, w, c.q, c.w)
		}
	}
}

// The seconds of the draft fields and Retry-After round up without
// wrapping, up to the longest Duration: a window Quota saturates is
// advertised as 9223372037 s, not as 1 s, and a block that ends past the
// longest Duration gives that many seconds to wait.
func TestSecondsNeverWrap(t *testing.T) {
	p, err := httplimit.NewPolicy([]hybridlimit.Rule{
		{Limit: 100, Window: time.Duration(math.MaxInt64)},
		{Type: hybridlimit.TokenBucket, Limit: 1, Burst: 1 << 40, Window: hybridlimit.MaxWindow},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"9223372036854ms";q=100;w=9223372037, "366d";q=1099511627776;w=9223372037`; p.Field() != want {
		t.Errorf("Field() = %s, want %s", p.Field(), want)
	}
	got := string(p.AppendRateLimit(nil, []hybridlimit.RuleState{{Rule: 0, Remaining: 0, ResetAfter: math.MaxInt64}}, 0))
	if want := `"9223372036854ms";r=0;t=9223372037`; got != want {
		t.Errorf("AppendRateLimit = %s, want %s", got, want)
	}
}
