package hybridlimit

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybridlimit/store"
)

// maxBatch bounds the decisions sent to the store in one round trip.
const maxBatch = 512

// call is one synchronous decision waiting for the store.
type call struct {
	req  store.TakeRequest
	ids  [MaxRules]int64
	done chan bool // receives true: lead the next batch; false: req is decided
	err  error
}

var callPool sync.Pool

func getCall(rules int) *call {
	c, _ := callPool.Get().(*call)
	if c == nil || len(c.req.ExpireAt) != rules {
		c = &call{done: make(chan bool, 1)}
		c.req.Keys = make([]string, 2*rules)
		c.req.Counts = make([]int64, 2*rules)
		c.req.ExpireAt = make([]int64, rules)
	}
	return c
}

func putCall(c *call) {
	clear(c.req.Keys)
	c.req.Allowed, c.req.Err, c.err = false, nil, nil
	callPool.Put(c)
}

// batcher coalesces concurrent synchronous decisions: while one round trip
// is under way, the decisions that arrive queue up, and the first of them
// sends them all in the next round trip. With one goroutine there is no
// waiting at all; with many, each round trip carries many decisions.
type batcher struct {
	store   store.Store
	timeout time.Duration

	mu    sync.Mutex
	queue []*call
	busy  bool
	calls atomic.Uint64
}

// do decides c.req in the store, alone or with others, and returns the
// error of the round trip that carried it.
func (b *batcher) do(c *call) error {
	b.mu.Lock()
	b.queue = append(b.queue, c)
	if b.busy {
		b.mu.Unlock()
		if lead := <-c.done; !lead {
			return c.err
		}
		b.mu.Lock()
	}
	b.busy = true
	// c is at the head of the queue: send it with those behind it.
	k := min(len(b.queue), maxBatch)
	batch := make([]*call, k)
	copy(batch, b.queue)
	b.queue = append(b.queue[:0], b.queue[k:]...)
	b.mu.Unlock()

	reqs := make([]*store.TakeRequest, k)
	for i, x := range batch {
		reqs[i] = &x.req
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	b.calls.Add(1)
	err := b.store.Take(ctx, reqs)
	cancel()
	for _, x := range batch[1:] {
		x.err = err
		x.done <- false
	}

	b.mu.Lock()
	if len(b.queue) > 0 {
		b.queue[0].done <- true
	} else {
		b.busy = false
	}
	b.mu.Unlock()
	return err
}
