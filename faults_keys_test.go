package hybridlimit_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// 256 goroutines create new keys, five times MaxKeys between them, while
// Stats is sampled without pause: the table never holds more than MaxKeys
// keys at any sample, ends full, and every key beyond it is decided
// untracked (FailOpen admits it, Overflow counts it).
func TestFaultMaxKeysUnderKeyFlood(t *testing.T) {
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			const maxKeys, goroutines, perG = 50_000, 256, 400
			cfg := hybridlimit.Config{Mode: mode, MaxKeys: maxKeys, Rules: []hybridlimit.Rule{{Limit: 10, Window: time.Hour}}}
			if mode == hybridlimit.ModeAsync {
				cfg.Store, cfg.SyncRate = store.NewMemory(nil), 10*time.Millisecond
			}
			l, err := hybridlimit.New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = l.Close(context.Background()) })

			done := make(chan struct{})
			var samples, filling atomic.Int64
			var sampler sync.WaitGroup
			sampler.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					switch n := l.Stats().Keys; {
					case n > maxKeys:
						t.Errorf("Stats().Keys = %d > MaxKeys %d", n, maxKeys)
					case n < maxKeys:
						filling.Add(1)
					}
					samples.Add(1)
				}
			})
			var wg sync.WaitGroup
			var allowed, degraded atomic.Int64
			for g := range goroutines {
				wg.Go(func() {
					for i := range perG {
						res, err := l.Allow(context.Background(), fmt.Sprintf("g%d-k%d", g, i))
						if !assert.NoError(t, err) {
							return
						}
						if res.Allowed {
							allowed.Add(1)
						}
						if res.Degraded {
							degraded.Add(1)
						}
					}
				})
			}
			wg.Wait()
			close(done)
			sampler.Wait()
			st := l.Stats()
			t.Logf("%d keys offered, MaxKeys %d: %d samples of Stats (%d while filling), none over; Keys %d, Overflow %d",
				goroutines*perG, maxKeys, samples.Load(), filling.Load(), st.Keys, st.Overflow)
			assert.Positive(t, samples.Load())
			assert.Equal(t, maxKeys, st.Keys, "the table ends full")
			assert.Equal(t, int64(goroutines*perG), allowed.Load(), "FailOpen admits every new key")
			assert.Equal(t, uint64(goroutines*perG-maxKeys), st.Overflow, "every key beyond MaxKeys is decided untracked")
			assert.Equal(t, int64(goroutines*perG-maxKeys), degraded.Load())
		})
	}
}
