package hybridlimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Two TokenBucket or LeakyBucket rules count alike exactly when the store
// would keep them in one counter: the same emission interval in whole
// microseconds, rounded up, and the same burst. New refuses the first pair
// and accepts the second.
func TestBucketRulesCountAlikeByStoreInterval(t *testing.T) {
	for _, c := range []struct {
		a, b  Rule
		alike bool
	}{
		// 333.33µs and 333.67µs: both 334µs in the store.
		{Rule{Limit: 3, Window: time.Millisecond, Type: TokenBucket, Burst: 3}, Rule{Limit: 2997, Window: time.Second, Type: TokenBucket, Burst: 3}, true},
		// 999µs and 999.001µs: 999µs and 1000µs in the store.
		{Rule{Limit: 1000, Window: 999 * time.Millisecond, Type: LeakyBucket, Burst: 5}, Rule{Limit: 1001, Window: time.Second, Type: LeakyBucket, Burst: 5}, false},
	} {
		ra, rb := local.NewRule(c.a.spec()), local.NewRule(c.b.spec())
		shared := store.CounterOf(&ra, "k", 0) == store.CounterOf(&rb, "k", 0)
		assert.Equal(t, c.alike, shared, "%v and %v: one store counter", c.a, c.b)
		err := validateRules("Config.Rules", []Rule{c.a, c.b})
		if c.alike {
			assert.ErrorContains(t, err, "counts like", "%v and %v", c.a, c.b)
		} else {
			assert.NoError(t, err, "%v and %v", c.a, c.b)
		}
	}
}
