package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A call its caller cancels (Close cancels the sync loop's push under way)
// says nothing about the server: the circuit stays closed and the next
// call is sent.
func TestRedisCanceledCallKeepsTheCircuitClosed(t *testing.T) {
	s, p := proxied(t, store.RedisOptions{})
	pfx := redistest.Prefix(t)
	const w = 60_000
	id := future / w
	push(t, s, batch(s, pfx, "n", "cancel", 1, op(w, id, 1))) // connection open, script cached

	p.DropReplies()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	b := batch(s, pfx, "n", "cancel", 2, op(w, id, 1))
	require.NoError(t, s.Push(ctx, []*store.Batch{b}))
	assert.Equal(t, store.InDoubt, b.Status)
	p.Up()

	again := batch(s, pfx, "n", "cancel", 2, op(w, id, 1))
	require.NoError(t, s.Push(context.Background(), []*store.Batch{again}))
	require.Equal(t, store.Applied, again.Status, "the call after a canceled one is sent: %v", again.Err)
	assert.Equal(t, []int64{2}, again.Totals, "the canceled batch was applied once")
	r := newTake(pfx, "cancel", future, 1, true, false, wr(10, w))
	require.NoError(t, s.Take(context.Background(), []*store.TakeRequest{r}))
	assert.Equal(t, store.Applied, r.Status, "%v", r.Err)
}
