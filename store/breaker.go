package store

import (
	"sync"
	"time"
)

// breaker is a circuit breaker per Redis server: after a call to a server
// fails without an answer (a timeout, a refused or cut connection), calls
// to that server fail at once, without being sent, until a backoff has
// passed; then one call goes through as a probe, and its success closes
// the circuit. A hung server thus costs one timeout per backoff, not one
// per call, and a dead shard of a cluster never slows the healthy ones.
type breaker struct {
	min, max time.Duration
	now      func() time.Time

	mu    sync.Mutex
	nodes map[string]*circuit
}

type circuit struct {
	failures int       // consecutive failed calls
	until    time.Time // open until
	probing  bool      // a probe is under way
}

func newBreaker(minBackoff, maxBackoff time.Duration) *breaker {
	return &breaker{min: minBackoff, max: maxBackoff, now: time.Now, nodes: map[string]*circuit{}}
}

// allow reports whether a call to node may be sent now. A true answer
// after the backoff makes the call the circuit's probe: report its outcome
// with done.
func (b *breaker) allow(node string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.nodes[node]
	if c == nil || c.failures == 0 {
		return true
	}
	if c.probing || b.now().Before(c.until) {
		return false
	}
	c.probing = true
	return true
}

// done records the outcome of a call to node: ok when the server answered.
func (b *breaker) done(node string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.nodes[node]
	if ok {
		if c != nil {
			delete(b.nodes, node)
		}
		return
	}
	if c == nil {
		c = &circuit{}
		b.nodes[node] = c
	}
	c.failures++
	c.probing = false
	d := b.min << min(c.failures-1, 20)
	c.until = b.now().Add(min(d, b.max))
}
