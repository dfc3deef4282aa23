package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// WaitN returns at once, with an error wrapping context.DeadlineExceeded
// (not ctx's own error, which it would return had it waited for the
// deadline), when ctx's deadline comes before
// the request would proceed: before it is admitted, or, for a
// LeakyBucket rule, before its Delay in the queue ends (the place it took
// stays taken, and Result.Allowed says so).
func TestWaitNDeadlineBeforeProceeding(t *testing.T) {
	ctx := context.Background()
	for _, r := range []Rule{
		{Limit: 5, Window: time.Second},
		{Limit: 10, Window: time.Second, Type: LeakyBucket, Burst: 20},
	} {
		l, _ := newMockLimiter(t, Config{Rules: []Rule{r}})
		for range 5 {
			_, err := l.Allow(ctx, "k")
			require.NoError(t, err)
		}
		// The mock clock stands still: a WaitN that waits returns
		// ctx's error when the deadline comes.
		dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		res, err := l.WaitN(dctx, "k", 1)
		cancel()
		assert.ErrorContains(t, err, "a request of cost 1 ", "%v", r)
		assert.ErrorContains(t, err, "past the context deadline", "%v", r)
		assert.NotEqual(t, context.DeadlineExceeded, err, "%v: WaitN waited for the deadline", r)
		assert.ErrorIs(t, err, context.DeadlineExceeded, "%v: errors.Is tells a deadline", r)
		assert.Equal(t, r.Type == LeakyBucket, res.Allowed, "%v", r)
	}
}
