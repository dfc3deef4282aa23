package hybridlimit_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// A sync loop at SyncRate 10 ms under 2 goroutines deciding over 100k
// keys for 2 s, on the standalone server. Proven: either the loop keeps
// the rate, or it says it does not (Stats.SyncPeriod and SyncCycleTime
// above SyncRate, and a warning in the log); nothing is dropped while the
// store answers; after Close, the store holds exactly what was admitted,
// key by key.
func TestFaultSyncLoop100kKeys(t *testing.T) {
	c := redistest.Client(t)
	// The key-by-key check reads 1000 keys a call with a client that waits
	// a minute: the limiter's client waits a second, which a loaded machine
	// can exceed with nothing wrong with the store.
	check := redistest.PatientClient(t)
	pfx := redistest.Prefix(t)
	const nkeys, rate = 100_000, 10 * time.Millisecond
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	var logs logBuffer
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeAsync, Store: newRedisStore(t, c), SyncRate: rate,
		StoreTimeout: time.Second, Prefix: pfx, Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}, Logger: logs.logger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })

	admitted := make([]int64, nkeys) // per key; goroutine g owns the keys of its parity
	ctx := context.Background()
	start := time.Now()
	// Every key exists before the measured phase (creating 100k keys is
	// the key flood's subject, not this test's).
	for k := range keys {
		res, err := l.Allow(ctx, keys[k])
		require.NoError(t, err)
		if res.Allowed {
			admitted[k]++
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	phase := time.Now()
	for g := range 2 {
		wg.Go(func() {
			for i := g; ; i += 2 {
				select {
				case <-stop:
					return
				default:
				}
				k := i % nkeys
				res, err := l.Allow(ctx, keys[k])
				if !assert.NoError(t, err) {
					return
				}
				if res.Allowed {
					admitted[k]++
				}
			}
		})
	}
	var maxPeriod, maxCycle time.Duration
	var maxKeys int
	var samples []string
	for time.Since(phase) < 2*time.Second {
		time.Sleep(250 * time.Millisecond)
		st := l.Stats()
		assert.Zero(t, st.Dropped, "increments dropped while the store answers")
		maxPeriod, maxCycle, maxKeys = max(maxPeriod, st.SyncPeriod), max(maxCycle, st.SyncCycleTime), max(maxKeys, st.SyncCycleKeys)
		samples = append(samples, fmt.Sprintf("period %v cycle %v keys %d", st.SyncPeriod.Round(time.Millisecond), st.SyncCycleTime.Round(time.Millisecond), st.SyncCycleKeys))
	}
	close(stop)
	wg.Wait()
	st := l.Stats()
	t.Logf("SyncRate %v, %d keys: %d cycles; samples: %s", rate, nkeys, st.SyncCycles, strings.Join(samples, "; "))
	t.Logf("slowest cycle seen %v (%d keys), longest period %v; %d decisions in %v after %d to create the keys",
		maxCycle.Round(time.Millisecond), maxKeys, maxPeriod.Round(time.Millisecond), st.Allowed-nkeys, time.Since(phase).Round(time.Millisecond), nkeys)
	if maxCycle > rate {
		assert.Greater(t, maxPeriod, rate, "Stats.SyncPeriod reports the lag")
		assert.Contains(t, logs.String(), "sync cycle slower than Config.SyncRate", "the log reports the lag")
	} else {
		assert.LessOrEqual(t, maxPeriod, 3*rate, "the loop keeps the rate")
	}
	t.Logf("log: %s", strings.TrimSpace(logs.String()))
	// The final flush pushes up to 100k counters; under -race on a loaded
	// machine that can take longer than DefaultCloseTimeout, and how long
	// Close may take is the caller's choice, not this test's subject.
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, l.Close(cctx))
	assert.Zero(t, l.Stats().Dropped)

	// The store holds exactly what was admitted, key by key.
	ids := hourIDs(start, time.Now())
	var total, sum int64
	wms := time.Hour.Milliseconds()
	for from := 0; from < nkeys; from += 1000 {
		var names []string
		for k := from; k < from+1000; k++ {
			for _, id := range ids {
				names = append(names, store.CounterKey(pfx, store.Counter{Key: keys[k], Window: wms, ID: id}))
			}
		}
		vals, err := check.MGet(ctx, names...).Result()
		require.NoError(t, err)
		for j, k := 0, from; k < from+1000; k++ {
			var s int64
			for range ids {
				if v, ok := vals[j].(string); ok {
					var n int64
					_, err := fmt.Sscan(v, &n)
					require.NoError(t, err)
					s += n
				}
				j++
			}
			if s != admitted[k] {
				assert.Equal(t, admitted[k], s, "key %q", keys[k])
			}
			total, sum = total+admitted[k], sum+s
		}
	}
	assert.Equal(t, total, sum)
	t.Logf("admitted %d, stored %d", total, sum)
}
