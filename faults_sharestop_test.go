package hybridlimit_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// The standalone server hangs (SIGSTOP) for 5 s, 50 ms into a window of a
// Fixed 800/1s limit that four ModeAsync nodes (share policy, 20 ms sync)
// decide at 6× the limit, unevenly (the nodes take 1, 1.5, 2 and 2.5
// parts of the traffic). The hang starts in the window's burst, where the
// share each node's averages give overstates its part of the cluster's
// admissions (docs/design.md, "Store outages"); once the server is back,
// the nodes push what they admitted meanwhile only after their backoff.
// Proven: every window from the one the hang starts in to the one after
// the server is back admits at most 10 % over the limit and at least 80 %
// of it (deciding with the shares of the last syncs: 905–1,049 per window
// inside the hang, up to +31 %, and up to 1,108 in the window it ends in).
func TestFaultStandaloneStopMidBurst(t *testing.T) {
	redistest.Destructive(t)
	addr := redistest.Addr(t)
	pfx := redistest.Prefix(t)
	const limit, hang = 800, 5
	nodes := asyncNodes(t, 4, addr, nil, func(st store.Store) hybridlimit.Config {
		return hybridlimit.Config{Mode: hybridlimit.ModeAsync, Store: st, SyncRate: 20 * time.Millisecond,
			StoreTimeout: faultTimeout, Prefix: pfx,
			Rules: []hybridlimit.Rule{{Limit: limit, Window: time.Second, Type: hybridlimit.Fixed}}}
	})
	// Admissions per second of Unix time, from first on.
	first := time.Now().Unix()
	var perSec [16]atomic.Int64
	var errs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	parts := []float64{1, 1.5, 2, 2.5}
	for i, l := range nodes {
		rate := 6 * limit * parts[i] / 7 // per second
		wg.Add(1)
		go func() {
			defer wg.Done()
			start, done := time.Now(), 0
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				for due := int(time.Since(start).Seconds() * rate); done < due; done++ {
					res, err := l.Allow(context.Background(), "k")
					if err != nil {
						errs.Add(1)
						return
					}
					if s := time.Now().Unix() - first; res.Allowed && s >= 0 && s < int64(len(perSec)) {
						perSec[s].Add(1)
					}
				}
			}
		}()
	}
	// Three whole windows of syncs first, then the hang 50 ms into one.
	at := time.Unix(first+4, 50*int64(time.Millisecond))
	time.Sleep(time.Until(at))
	srv := redistest.ServerAt(t, addr)
	srv.Stop()
	stopped := time.Now()
	time.Sleep(hang * time.Second)
	srv.Cont()
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	closeAll(t, nodes, 10*time.Second)

	assert.Zero(t, errs.Load(), "decisions returned errors")
	// The windows from the one the hang started in to the one after the
	// one it ended in.
	from := stopped.Unix() - first
	assert.Less(t, stopped.Sub(at), 100*time.Millisecond, "the hang started late: %v", stopped.Sub(at))
	var got []int64
	for s := range perSec {
		got = append(got, perSec[s].Load())
	}
	t.Logf("admitted per window from %d (the hang in windows %d to %d, limit %d): %v", first, from, from+hang, limit, got)
	for s := from; s <= from+hang+1; s++ {
		assert.LessOrEqual(t, got[s], int64(limit*11/10), "window %d of the hang: over the limit", s-from)
		assert.GreaterOrEqual(t, got[s], int64(limit*8/10), "window %d of the hang: well under the limit", s-from)
	}
}
