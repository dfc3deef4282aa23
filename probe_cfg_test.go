package hybridlimit

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/store"
)

func TestProbeCfg(t *testing.T) {
	mock := clock.NewMock()
	mock.Set(t0)
	ms := time.Millisecond
	r := func(l int64, w time.Duration) Rule { return Rule{Limit: l, Window: w} }
	for i, c := range []Config{
		{Rules: []Rule{r(math.MaxInt64, time.Second)}},
		{Rules: []Rule{r(math.MinInt64, time.Second)}},
		{Rules: []Rule{r(1, math.MaxInt64)}},
		{Rules: []Rule{r(1, math.MinInt64)}},
		{Rules: []Rule{r(1, 0)}},
		{Rules: []Rule{{Limit: 1, Window: ms, Type: Bucketed, Buckets: 64}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Bucketed, Buckets: math.MinInt}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Bucketed, Buckets: math.MaxInt}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: TokenBucket, Burst: math.MaxInt64}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: TokenBucket, Burst: math.MinInt64}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: LeakyBucket, Burst: -1}}},
		{Rules: []Rule{{Limit: MaxLimit, Window: MaxWindow, Type: TokenBucket, Burst: MaxLimit}}},
		{Rules: []Rule{{Limit: 1, Window: MaxWindow, Type: TokenBucket, Burst: 2}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Sliding, Burst: 2}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Log, Buckets: 2}}},
		{Rules: []Rule{{Limit: MaxLogLimit + 1, Window: time.Second, Type: Log}}},
		{Rules: []Rule{r(1, time.Second), {Limit: 2, Window: time.Second, Type: Fixed}}},
		{Rules: []Rule{r(1, time.Second), r(2, time.Second)}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: TokenBucket}, {Limit: 1, Window: time.Second, Type: LeakyBucket}}},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Log}, {Limit: 1, Window: time.Second, Type: Bucketed, Buckets: 5}}, Mode: ModeAsync, Store: store.NewMemory(mock)},
		{Rules: []Rule{{Limit: 1, Window: time.Second, Type: Algorithm(200)}}},
		{Rules: []Rule{r(1, time.Second)}, MaxKeys: math.MaxInt},
		{Rules: []Rule{r(1, time.Second)}, MaxKeys: math.MinInt},
		{Rules: []Rule{r(1, time.Second)}, MaxKeyLen: math.MaxInt},
		{Rules: []Rule{r(1, time.Second)}, Mode: ModeAsync, Store: store.NewMemory(mock), SyncRate: math.MaxInt64},
		{Rules: []Rule{r(1, time.Second)}, Mode: ModeAsync, Store: store.NewMemory(mock), SyncRate: -1},
		{Rules: []Rule{r(1, time.Second)}, Mode: ModeAsync, Store: store.NewMemory(mock), SyncRate: time.Hour},
		{Rules: []Rule{r(1, time.Second)}, SyncRate: time.Second},
		{Rules: []Rule{r(1, time.Second)}, StoreTimeout: -1},
		{Rules: []Rule{r(1, time.Second)}, StoreTimeout: math.MaxInt64},
		{Rules: []Rule{r(1, time.Second)}, ClockResolution: math.MaxInt64},
		{Rules: []Rule{r(1, time.Second)}, ClockResolution: math.MinInt64},
		{Rules: []Rule{r(1, time.Second)}, ClockSync: math.MaxInt64},
		{Rules: []Rule{r(1, time.Second)}, ClockSync: 1},
		{Rules: []Rule{r(1, time.Second)}, LogEvery: -1},
		{Rules: []Rule{r(1, time.Second)}, Prefix: "a:b"},
		{Rules: []Rule{r(1, time.Second)}, Mode: 7},
		{Rules: []Rule{r(1, time.Second)}, AsyncPolicy: 7},
		{Rules: []Rule{r(1, time.Second)}, FailurePolicy: 7},
		{Rules: []Rule{r(1, time.Second)}, Tiers: map[string][]Rule{"": {r(1, time.Second)}}},
		{Rules: []Rule{r(1, time.Second)}, Tiers: map[string][]Rule{"x": nil}},
		{Rules: []Rule{r(1, time.Second)}, Ban: BanPolicy{Denials: -1}},
		{Rules: []Rule{r(1, time.Second)}, Ban: BanPolicy{Denials: 1, Within: math.MaxInt64}},
		{Rules: []Rule{r(1, time.Second)}, Ban: BanPolicy{Denials: 0, Within: time.Second}},
		{Rules: []Rule{r(1, time.Second)}, Ban: BanPolicy{Denials: 1 << 40}},
		{Rules: []Rule{r(1, time.Second)}, Ban: BanPolicy{Denials: 3, For: -1}},
		{Rules: make([]Rule, 17)},
	} {
		c.Clock = mock
		c.Manual = true
		l, err := New(c)
		if err != nil {
			t.Logf("%d: %v", i, err)
			continue
		}
		t.Logf("%d: OK %v", i, l.cfg.Rules)
		l.Close(context.Background())
	}
}
