package hybridlimit

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// TestAlgorithmsAgreeAtExtremes runs runAgree (agree_test.go) on rules at
// the edges of their ranges: Limit 1, windows of 1 ms and of a day,
// buckets of 1 ms, 64 buckets, bucket rules of one per microsecond. (Windows
// near MaxWindow are left out: 400 random steps of up to two windows run
// the mock clock past 2116, beyond the instants the limiter supports.)
func TestAlgorithmsAgreeAtExtremes(t *testing.T) {
	ms := time.Millisecond
	day := 24 * time.Hour
	sets := []struct {
		name  string
		rules []Rule
	}{
		{"sliding-1", []Rule{{Limit: 1, Window: ms}}},
		{"sliding-1-day", []Rule{{Limit: 1, Window: day}}},
		{"fixed-1", []Rule{{Limit: 1, Window: ms, Type: Fixed}}},
		{"fixed-2-day", []Rule{{Limit: 2, Window: day, Type: Fixed}}},
		{"bucketed-64", []Rule{{Limit: 3, Window: 64 * ms, Type: Bucketed, Buckets: 64}}},
		{"bucketed-2x1ms", []Rule{{Limit: 1, Window: 2 * ms, Type: Bucketed, Buckets: 2}}},
		{"bucketed-day", []Rule{{Limit: 5, Window: day, Type: Bucketed, Buckets: 24}}},
		{"log-1", []Rule{{Limit: 1, Window: ms, Type: Log}}},
		{"log-day", []Rule{{Limit: 4, Window: day, Type: Log}}},
		{"token-1us", []Rule{{Limit: 1000, Window: ms, Type: TokenBucket, Burst: 3}}},
		{"token-1", []Rule{{Limit: 1, Window: ms, Type: TokenBucket}}},
		{"leaky-1", []Rule{{Limit: 1, Window: ms, Type: LeakyBucket}}},
		{"leaky-1us", []Rule{{Limit: 1000, Window: ms, Type: LeakyBucket, Burst: 7}}},
		{"leaky-day", []Rule{{Limit: 3, Window: day, Type: LeakyBucket, Burst: 5}}},
		{"mixed-extremes", []Rule{
			{Limit: 1, Window: ms},
			{Limit: 2, Window: day, Type: Fixed},
			{Limit: 1, Window: 2 * ms, Type: Bucketed, Buckets: 2},
			{Limit: 1000, Window: ms, Type: TokenBucket, Burst: 1},
		}},
	}
	var rs store.Store
	if os.Getenv(redistest.EnvAddr) != "" {
		rs = storetest.Redis(t, redistest.PatientClient(t))
	}
	for si, set := range sets {
		for _, countDenied := range []bool{false, true} {
			for _, jitter := range []bool{false, true} {
				name := fmt.Sprintf("%s/countDenied=%v/ns=%v", set.name, countDenied, jitter)
				t.Run(name, func(t *testing.T) {
					t.Parallel() // each sequence has its own clock, limiters and prefix
					runAgree(t, set.rules, countDenied, jitter, rs, uint64(si)*7+uint64(len(name)))
				})
			}
		}
	}
}
