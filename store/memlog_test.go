package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// TestMemoryLogLivesUntilItsNewestEntryLeaves: the memory store keeps a
// key's log until its newest entry has left the longest log window, also
// when that entry is not on a whole millisecond (the store's clock reads
// milliseconds for expiries, a decision's instant is in microseconds).
func TestMemoryLogLivesUntilItsNewestEntryLeaves(t *testing.T) {
	mock := clock.NewMock()
	mem := store.NewMemory(mock)
	rule := local.NewRule(local.Spec{Kind: local.Log, Limit: 5, Window: 100 * time.Millisecond})
	at := func(us int64) *store.TakeRequest {
		mock.Set(time.UnixMicro(future*1000 + us))
		r := &store.TakeRequest{Prefix: "hl", Key: "k", Rules: []local.Rule{rule}, Now: future*1000 + us, Cost: 5,
			Deadline: future*1000 + us + 1_000_000}
		require.NoError(t, mem.Take(context.Background(), []*store.TakeRequest{r}))
		require.Equal(t, store.Applied, r.Status, "%v", r.Err)
		return r
	}
	require.True(t, at(500).Allowed)
	// The five entries at 500 µs count until 100,500 µs.
	r := at(100_200)
	require.False(t, r.Allowed)
	require.Equal(t, int64(5), r.Counts[0].Cur)
	require.Equal(t, int64(300*time.Microsecond), r.Counts[0].Expire)
	require.True(t, at(100_500).Allowed)
}
