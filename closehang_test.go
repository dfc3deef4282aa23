package hybridlimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// hungPolicies is a memory store whose policy reads wait until their
// context ends, like a hung Redis.
type hungPolicies struct {
	*store.Memory
	calls chan struct{}
}

func (s hungPolicies) PolicyVersion(ctx context.Context, prefix string) (uint64, error) {
	select {
	case s.calls <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return 0, ctx.Err()
}

// Close ends within its context even while the background reload of the
// policies waits on a store that does not answer: Close stops the reload
// rather than waiting up to StoreTimeout (here a minute) for it.
func TestCloseStopsAPolicyReloadUnderWay(t *testing.T) {
	st := hungPolicies{Memory: store.NewMemory(nil), calls: make(chan struct{}, 1)}
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeAsync, Store: st, SyncRate: 5 * time.Millisecond,
		StoreTimeout: time.Minute, Rules: []hybridlimit.Rule{{Limit: 10, Window: time.Hour}}})
	require.NoError(t, err)
	select {
	case <-st.calls: // a reload is under way
	case <-time.After(10 * time.Second):
		t.Fatal("no policy reload")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	assert.NoError(t, l.Close(ctx))
	assert.Less(t, time.Since(start), 5*time.Second, "Close waited for the policy reload")
}
