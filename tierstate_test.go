package hybridlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
)

// TierState reads the named tier's rules for a key whatever tier the key
// is in now, and refuses an unknown tier, an invalid key and a closed
// limiter with State's errors.
func TestTierState(t *testing.T) {
	ctx := context.Background()
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules: []hybridlimit.Rule{{Limit: 5, Window: time.Minute}},
		Tiers: map[string][]hybridlimit.Rule{"paid": {{Limit: 100, Window: time.Minute}, {Limit: 1000, Window: time.Hour}}},
	})
	require.NoError(t, err)
	_, err = l.AllowN(ctx, "k", 2) // the default tier
	require.NoError(t, err)
	require.NoError(t, l.SetOverride(ctx, "k", "paid", time.Hour))

	st, err := l.TierState(ctx, "k", "", nil)
	require.NoError(t, err)
	require.Len(t, st, 1)
	assert.Equal(t, int64(3), st[0].Remaining, "the default tier's count, though the key is in paid now")
	st, err = l.TierState(ctx, "k", "paid", nil)
	require.NoError(t, err)
	require.Len(t, st, 2)
	assert.Equal(t, []int64{100, 1000}, []int64{st[0].Remaining, st[1].Remaining})
	now, err := l.State(ctx, "k", nil)
	require.NoError(t, err)
	assert.Equal(t, st, now, "State reads the key's tier now")

	_, err = l.TierState(ctx, "k", "gold", nil)
	assert.ErrorIs(t, err, hybridlimit.ErrUnknownTier)
	assert.ErrorContains(t, err, `"gold"`)
	assert.ErrorContains(t, err, "want one of", "the error lists the tiers")
	_, err = l.TierState(ctx, "", "", nil)
	assert.ErrorIs(t, err, hybridlimit.ErrEmptyKey)
	require.NoError(t, l.Close(ctx))
	_, err = l.TierState(ctx, "k", "", nil)
	assert.ErrorIs(t, err, hybridlimit.ErrClosed)
}
