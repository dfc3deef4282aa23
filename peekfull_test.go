package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// While the key table is full, Peek on a new key answers as AllowN would
// (FailOpen admits it, FailClosed denies it, both flagged Degraded), with
// what is left before the request, and counts nothing in Stats.
func TestPeekNewKeyWhileTableFull(t *testing.T) {
	ctx := context.Background()
	for _, fp := range []FailurePolicy{FailOpen, FailClosed} {
		l, _ := newMockLimiter(t, Config{Rules: []Rule{{Limit: 2, Window: time.Second}}, MaxKeys: 1, FailurePolicy: fp})
		_, err := l.Allow(ctx, "a")
		require.NoError(t, err)
		peek, err := l.Peek(ctx, "b")
		require.NoError(t, err)
		st := l.Stats()
		assert.Equal(t, [3]uint64{1, 0, 0}, [3]uint64{st.Allowed, st.Denied, st.Overflow}, "%v: Peek counts nothing", fp)
		res, err := l.Allow(ctx, "b")
		require.NoError(t, err)
		assert.Equal(t, res.Allowed, peek.Allowed, "%v: Allowed", fp)
		assert.True(t, peek.Degraded, "%v: Degraded", fp)
		if fp == FailOpen {
			assert.Equal(t, int64(2), peek.Remaining, "%v: Remaining before the request", fp)
		} else {
			assert.Equal(t, res, peek, "%v", fp)
			assert.Equal(t, int64(0), res.Remaining, "%v: a denial admits nothing", fp)
		}
		// A tracked key is peeked as usual.
		peek, err = l.Peek(ctx, "a")
		require.NoError(t, err)
		assert.Equal(t, Result{Allowed: true, Limit: 2, Window: time.Second, Remaining: 1, ResetAfter: 2 * time.Second}, peek, "%v: tracked key", fp)
	}
}
