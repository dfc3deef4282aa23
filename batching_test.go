package hybridlimit

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// gateStore is a memory store whose Take reports its number of requests
// on entered, then waits for a value on release.
type gateStore struct {
	*store.Memory
	entered chan int
	release chan struct{}
}

func (g *gateStore) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	g.entered <- len(reqs)
	<-g.release
	return g.Memory.Take(ctx, reqs)
}

func newGated(t *testing.T) (*Limiter, *gateStore) {
	t.Helper()
	g := &gateStore{Memory: store.NewMemory(nil), entered: make(chan int, 100), release: make(chan struct{})}
	l, err := New(Config{
		Rules:        []Rule{{Limit: 1000, Window: time.Hour}},
		Mode:         ModeSynchronous,
		Store:        g,
		StoreTimeout: time.Minute,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l, g
}

// enters returns the size of the next Take, failing when none begins.
func (g *gateStore) enters(t *testing.T) int {
	t.Helper()
	select {
	case n := <-g.entered:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no round trip began")
		return 0
	}
}

// quiet fails if a Take has begun that the test has not seen.
func (g *gateStore) quiet(t *testing.T, why string) {
	t.Helper()
	select {
	case n := <-g.entered:
		t.Fatalf("a round trip of %d began: %s", n, why)
	default:
	}
}

// queued waits until n decisions wait in the queue.
func queued(t *testing.T, l *Limiter, n int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		l.sync.one.mu.Lock()
		got := len(l.sync.one.queue)
		l.sync.one.mu.Unlock()
		if got == n {
			return
		}
		require.Less(t, time.Since(start), 10*time.Second, "%d decisions queued, want %d", got, n)
	}
}

// A lone decision goes to the store at once, alone: one round trip per
// decision, whatever came before.
func TestSynchronousLoneDecisionIsSentAtOnce(t *testing.T) {
	l, g := newGated(t)
	for i := range 20 {
		done := make(chan Result)
		go func() {
			res, err := l.Allow(context.Background(), fmt.Sprint("k", i%3))
			assert.NoError(t, err)
			done <- res
		}()
		require.Equal(t, 1, g.enters(t), "decision %d", i)
		g.release <- struct{}{}
		res := <-done
		assert.True(t, res.Allowed)
		assert.False(t, res.Degraded)
	}
	assert.Equal(t, uint64(20), l.sync.calls.Load())
}

// Decisions that arrive while round trips are on their way share the next
// one; with one round trip on its way, a second leaves only once the queue
// holds as many decisions as it carries.
func TestSynchronousBurstSharesRoundTrips(t *testing.T) {
	l, g := newGated(t)
	var wg sync.WaitGroup
	decide := func(n int) {
		for range n {
			wg.Go(func() {
				res, err := l.Allow(context.Background(), "k")
				assert.NoError(t, err)
				assert.True(t, res.Allowed)
				assert.False(t, res.Degraded)
			})
		}
	}
	decide(1)
	require.Equal(t, 1, g.enters(t), "the first decision goes at once")
	decide(1)
	require.Equal(t, 1, g.enters(t), "the second slot takes a lone decision beside a lone one")
	decide(8)
	queued(t, l, 8)
	g.quiet(t, "both slots are taken")
	g.release <- struct{}{}
	require.Equal(t, 8, g.enters(t), "the queue leaves in one round trip")
	g.release <- struct{}{}
	// One round trip of 8 on its way: the second slot waits for 8.
	decide(7)
	queued(t, l, 7)
	g.quiet(t, "7 decisions queued beside a round trip of 8")
	decide(1)
	require.Equal(t, 8, g.enters(t), "the eighth sends the queue")
	// Two on their way, 3 queued: when one ends, the queue waits for as
	// many as the other carries, or for its end.
	decide(3)
	queued(t, l, 3)
	g.release <- struct{}{}
	queued(t, l, 3)
	g.quiet(t, "3 decisions queued beside a round trip of 8")
	decide(5)
	require.Equal(t, 8, g.enters(t))
	decide(2)
	queued(t, l, 2)
	g.release <- struct{}{}
	queued(t, l, 2)
	g.quiet(t, "2 decisions queued beside a round trip of 8")
	g.release <- struct{}{}
	require.Equal(t, 2, g.enters(t), "the end of the last round trip on its way sends what is queued")
	g.release <- struct{}{}
	wg.Wait()
	g.quiet(t, "every decision was decided")
	assert.Equal(t, uint64(6), l.sync.calls.Load(), "28 decisions in 6 round trips")
}

// A queue longer than a batch leaves in several, none larger than
// maxBatch, and every decision is answered, once.
func TestSynchronousLongQueue(t *testing.T) {
	l, g := newGated(t)
	g.entered = make(chan int, 4*maxBatch)
	var wg sync.WaitGroup
	var allowed sync.Map
	decide := func(from, n int) {
		for i := range n {
			wg.Go(func() {
				res, err := l.Allow(context.Background(), fmt.Sprint("k", from+i))
				assert.NoError(t, err)
				assert.False(t, res.Degraded)
				allowed.Store(from+i, res.Allowed)
			})
		}
	}
	decide(0, 2)
	require.Equal(t, 1, g.enters(t))
	require.Equal(t, 1, g.enters(t))
	const n = 2*maxBatch + 100 // more than two batches wait
	decide(2, n)
	queued(t, l, n)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	g.release <- struct{}{} // a lone one ends: the queue's first batch leaves
	require.Equal(t, maxBatch, g.enters(t))
	g.release <- struct{}{} // the other lone one ends: the second batch
	require.Equal(t, maxBatch, g.enters(t))
	g.release <- struct{}{} // a batch ends; 100 wait beside a batch of 512
	queued(t, l, 100)
	g.quiet(t, "100 decisions queued beside a round trip of 512")
	g.release <- struct{}{} // the other ends: the rest leaves
	require.Equal(t, 100, g.enters(t))
	g.release <- struct{}{}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("decisions left unanswered")
	}
	count := 0
	allowed.Range(func(_, _ any) bool { count++; return true })
	assert.Equal(t, n+2, count)
	assert.Equal(t, uint64(n+2), l.Stats().Allowed+l.Stats().Denied)
}

// A queue of exactly maxBatch decisions leaves in one round trip, one of
// maxBatch+1 in two: the one past the batch waits beside it and leaves
// when no other round trip is on its way.
func TestSynchronousQueueAtTheBatchSize(t *testing.T) {
	for _, n := range []int{maxBatch, maxBatch + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			l, g := newGated(t)
			g.entered = make(chan int, 2*maxBatch)
			var wg sync.WaitGroup
			decide := func(from, n int) {
				for i := range n {
					wg.Go(func() {
						res, err := l.Allow(context.Background(), fmt.Sprint("k", from+i))
						assert.NoError(t, err)
						assert.True(t, res.Allowed)
						assert.False(t, res.Degraded)
					})
				}
			}
			decide(0, 2)
			require.Equal(t, 1, g.enters(t))
			require.Equal(t, 1, g.enters(t))
			decide(2, n)
			queued(t, l, n)
			g.release <- struct{}{} // a lone one ends: a full batch leaves
			require.Equal(t, maxBatch, g.enters(t))
			queued(t, l, n-maxBatch)
			g.release <- struct{}{} // the other lone one ends
			if n > maxBatch {
				queued(t, l, 1)
				g.quiet(t, "1 decision queued beside a round trip of 512")
				g.release <- struct{}{} // the batch ends: the last one leaves
				require.Equal(t, 1, g.enters(t))
			}
			g.release <- struct{}{}
			wg.Wait()
			g.quiet(t, "every decision was decided")
			assert.Equal(t, uint64(n+2), l.Stats().Allowed)
		})
	}
}

// slowGate is a memory store whose round trips carrying the key "slow"
// report on entered, then wait for a value on release, like calls to a
// hung shard before its circuit opens; the others are answered at once.
type slowGate struct {
	*store.Memory
	entered chan struct{}
	release chan struct{}
}

func (g *slowGate) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	for _, r := range reqs {
		if r.Key == "slow" {
			g.entered <- struct{}{}
			<-g.release
			break
		}
	}
	return g.Memory.Take(ctx, reqs)
}

// A request that waits in the queue while slow round trips hold every
// in-flight slot still gets its whole deadline (half of StoreTimeout) in
// the store once sent: it is decided by the store, not Degraded. (Counted
// from the decision instead of the sending, the deadline passed in the
// queue, and the store refused the request.)
func TestSynchronousDeadlineCountsFromSending(t *testing.T) {
	const timeout = time.Second
	g := &slowGate{Memory: store.NewMemory(nil), entered: make(chan struct{}, maxInFlight), release: make(chan struct{})}
	l, err := New(Config{
		Rules:        []Rule{{Limit: 100, Window: time.Hour}},
		Mode:         ModeSynchronous,
		Store:        g,
		StoreTimeout: timeout,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	var wg sync.WaitGroup
	for range maxInFlight { // every in-flight slot
		wg.Go(func() {
			_, err := l.Allow(ctx, "slow")
			assert.NoError(t, err)
		})
		select {
		case <-g.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no slow round trip began")
		}
	}
	done := make(chan Result, 1)
	go func() {
		res, err := l.Allow(ctx, "fast")
		assert.NoError(t, err)
		done <- res
	}()
	queued(t, l, 1)
	// The request waits in the queue for at least the whole StoreTimeout,
	// twice its deadline in the store.
	time.Sleep(timeout)
	for range maxInFlight {
		g.release <- struct{}{}
	}
	res := <-done
	wg.Wait()
	assert.True(t, res.Allowed)
	assert.False(t, res.Degraded, "a request that waited in the queue was refused by the store for its deadline")
}
