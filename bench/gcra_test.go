package bench

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/hybridlimit/hybridlimit"
)

// A TokenBucket rule admits exactly what golang.org/x/time/rate admits
// with the same rate and burst, on the same arrivals.
func TestTokenBucketMatchesXTimeRate(t *testing.T) {
	for _, tc := range []struct {
		limit  int64
		window time.Duration
		burst  int64
	}{
		{10, time.Second, 5},
		{100, time.Minute, 20},
		{1, time.Second, 1},
		{250, time.Second, 250},
	} {
		mock := &setClock{Mock: clock.NewMock()}
		start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		mock.Set(start)
		l, err := hybridlimit.New(hybridlimit.Config{Clock: mock, Manual: true, Rules: []hybridlimit.Rule{
			{Limit: tc.limit, Window: tc.window, Type: hybridlimit.TokenBucket, Burst: tc.burst}}})
		require.NoError(t, err)
		ref := rate.NewLimiter(rate.Limit(float64(tc.limit)/tc.window.Seconds()), int(tc.burst))
		rng := rand.New(rand.NewPCG(uint64(tc.limit), 7))
		now := start
		mean := tc.window / time.Duration(tc.limit) / 2 // arrivals at twice the rate
		admitted := 0
		for i := range 5000 {
			now = now.Add(time.Duration(rng.ExpFloat64() * float64(mean)).Truncate(time.Millisecond))
			mock.Set(now)
			n := 1 + rng.Int64N(min(tc.burst, 3))
			got, err := l.AllowN(context.Background(), "k", n)
			require.NoError(t, err)
			want := ref.AllowN(now, int(n))
			require.Equal(t, want, got.Allowed, "%v: request %d at %v, cost %d", tc, i, now.Sub(start), n)
			if want {
				admitted++
			}
		}
		t.Logf("%d/%v burst %d: %d of 5000 admitted by both", tc.limit, tc.window, tc.burst, admitted)
		_ = l.Close(context.Background())
	}
}

// setClock is a clock set by hand whose Set does not sleep (clock.Mock's
// does, a millisecond); a Manual limiter reads only Now.
type setClock struct {
	*clock.Mock
	now time.Time
}

func (c *setClock) Now() time.Time  { return c.now }
func (c *setClock) Set(t time.Time) { c.now = t }
