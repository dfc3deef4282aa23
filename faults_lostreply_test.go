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
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Replies are lost one way for 1.5 s (a proxy forwards the calls to the
// standalone server, which runs them, and drops its answers) under 32
// goroutines deciding in ModeSynchronous with FailOpen. Proven: decisions
// go on (Degraded, no error); afterwards the store holds every admission,
// and counts twice at most the requests of the calls whose answer was lost:
// the calls on their way when the replies stopped (at most 2, one per
// in-flight slot) and one call per probe of the circuit breaker while they
// stayed lost (the breaker waits BreakerMin, 100 ms, doubling after each
// failed probe, so at most 5 probes fit in 1.5 s).
func TestFaultLostRepliesSynchronous(t *testing.T) {
	p := redistest.NewProxy(t, redistest.Addr(t))
	pfx := redistest.Prefix(t)
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	inDoubt := newTally(keys)
	var doubtCalls atomic.Int64
	w := &watched{Store: newRedisStore(t, faultClient(t, p.Addr()))}
	w.onTake = func(_, _ time.Time, rs []*store.TakeRequest) {
		n := 0
		for _, r := range rs {
			if r.Status == store.InDoubt {
				inDoubt.add(r.Key)
				n++
			}
		}
		if n > 0 {
			doubtCalls.Add(1)
		}
	}
	l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, Store: w, StoreTimeout: faultTimeout,
		Prefix: pfx, Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	allowed := newTally(keys)
	var degraded, lossN atomic.Int64
	var losing atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	traffic(&wg, 32, stop, func(g, i int) bool {
		k := keys[(g+i)%len(keys)]
		res, err := l.Allow(ctx, k)
		if !assert.NoError(t, err) {
			return false
		}
		if res.Allowed {
			allowed.add(k)
		}
		if res.Degraded {
			degraded.Add(1)
		}
		if losing.Load() {
			lossN.Add(1)
		}
		return true
	})
	time.Sleep(500 * time.Millisecond)
	p.DropReplies()
	losing.Store(true)
	time.Sleep(1500 * time.Millisecond)
	losing.Store(false)
	p.Up()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, l.Close(cctx))

	c := redistest.Client(t)
	ids := hourIDs(start, time.Now())
	var sum int64
	for _, k := range keys {
		s, a := stored(t, c, pfx, k, ids), allowed.get(k)
		assert.GreaterOrEqual(t, s, a, "key %q: the store lost admissions", k)
		assert.LessOrEqual(t, s-a, inDoubt.get(k), "key %q: counted twice beyond the requests in doubt", k)
		sum += s
	}
	t.Logf("allowed %d (%d while the replies were lost, %d degraded), stored %d: counted twice %d; %d requests in doubt in %d calls",
		allowed.sum(keys), lossN.Load(), degraded.Load(), sum, sum-allowed.sum(keys), inDoubt.sum(keys), doubtCalls.Load())
	assert.Positive(t, lossN.Load(), "decisions went on while the replies were lost")
	assert.Positive(t, doubtCalls.Load(), "calls were in doubt")
	assert.LessOrEqual(t, doubtCalls.Load(), int64(2+5), "calls in doubt: the 2 on their way and one per probe")
}

// With RedisOptions.WaitReplicas and no replica answering (the standalone
// test server has none), a synchronous call that reaches the master runs
// there and is then in doubt, its requests decided by the FailurePolicy
// (the breaker lets one call through per backoff). Under FailClosed those
// requests are denied, yet counted by the master; under FailOpen they are
// admitted and counted twice, by the master and by the node's push of its
// own count (a push is in doubt too, and sent again until a WAIT succeeds,
// applied once by its marker; Close counts what it could not confirm).
func TestWaitReplicasWithoutReplicaCountsEveryRequest(t *testing.T) {
	c := redistest.Client(t)
	for _, policy := range []hybridlimit.FailurePolicy{hybridlimit.FailClosed, hybridlimit.FailOpen} {
		t.Run(policy.String(), func(t *testing.T) {
			pfx := redistest.Prefix(t)
			st, err := store.NewRedis(c, store.RedisOptions{WaitReplicas: 1, WaitTimeout: 5 * time.Millisecond})
			require.NoError(t, err)
			var ran atomic.Int64 // requests the master ran, in doubt
			w := &watched{Store: st, onTake: func(_, _ time.Time, rs []*store.TakeRequest) {
				for _, r := range rs {
					if r.Status == store.InDoubt {
						ran.Add(1)
					}
				}
			}}
			l, err := hybridlimit.New(hybridlimit.Config{Mode: hybridlimit.ModeSynchronous, FailurePolicy: policy, Store: w,
				Prefix: pfx, Rules: []hybridlimit.Rule{{Limit: 100, Window: time.Hour}}})
			require.NoError(t, err)
			const n = 20
			start := time.Now()
			var allowed int64
			for range n {
				res, err := l.Allow(context.Background(), "k")
				require.NoError(t, err)
				assert.True(t, res.Degraded, "a call without its replica is in doubt")
				if res.Allowed {
					allowed++
				}
				time.Sleep(20 * time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			cerr := l.Close(ctx)
			s := stored(t, c, pfx, "k", hourIDs(start, time.Now()))
			t.Logf("%v: %d requests, %d admitted, %d run by the master (in doubt); the master holds %d; Close: %v", policy, n, allowed, ran.Load(), s, cerr)
			assert.Positive(t, ran.Load())
			if policy == hybridlimit.FailClosed {
				assert.Zero(t, allowed)
				assert.NoError(t, cerr)
				assert.Equal(t, ran.Load(), s, "the master counted every request it ran")
				return
			}
			assert.Equal(t, int64(n), allowed)
			// The node's pushes are in doubt too (their WAIT fails), but the
			// master applies each batch once: it holds the requests it ran,
			// plus the node's count but for what Close reports possibly
			// missing.
			require.Error(t, cerr)
			assert.GreaterOrEqual(t, s, ran.Load()+allowed-unflushed(t, cerr))
			assert.LessOrEqual(t, s, ran.Load()+allowed, "at most counted twice")
		})
	}
}
