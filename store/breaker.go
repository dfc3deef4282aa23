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
// per call. A dead shard of a cluster never slows the healthy ones: the
// calls to each master go out in their own pipelines, and the synchronous
// mode queues each master's decisions apart (Router).
type breaker struct {
	min, max time.Duration
	now      func() time.Time

	mu    sync.Mutex
	nodes map[string]*circuit
}

type circuit struct {
	failures int       // consecutive failures (of the call that opened it, then of probes)
	opened   time.Time // when it last opened
	until    time.Time // open until
	probing  bool      // a probe is under way
}

func newBreaker(minBackoff, maxBackoff time.Duration) *breaker {
	return &breaker{min: minBackoff, max: maxBackoff, now: time.Now, nodes: map[string]*circuit{}}
}

// allowAt reports whether a call to node may be sent now, and for the
// circuit's probe (a true answer after the backoff) when it was allowed
// (zero otherwise). Report the probe's outcome with done, with a sent
// time no earlier than that: a call sent before the circuit opened changes
// nothing (see done), and a probe's failure must hand the turn on.
func (b *breaker) allowAt(node string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.nodes[node]
	if c == nil || c.failures == 0 {
		return time.Time{}, true
	}
	now := b.now()
	if c.probing || now.Before(c.until) {
		return time.Time{}, false
	}
	c.probing = true
	return now, true
}

// done records the outcome of a call to node sent at sent: ok when the
// server answered. The failure of a call sent before the circuit opened
// is part of the failure that opened it (every call on its way to a server
// that stops answering fails, one lane after another) and changes
// nothing: only a call sent since, the probe, doubles the backoff.
func (b *breaker) done(node string, sent time.Time, ok bool) {
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
	if c.failures > 0 && sent.Before(c.opened) {
		return
	}
	c.failures++
	c.probing = false
	now := b.now()
	c.opened = now
	d := b.min << min(c.failures-1, 20)
	c.until = now.Add(min(d, b.max))
}

// forget drops node's circuit: no call goes to node any more.
func (b *breaker) forget(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.nodes, node)
}

// abandon records that a call to node ended without telling anything
// about the server (the caller canceled it): if it was the probe, the
// next call probes.
func (b *breaker) abandon(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.nodes[node]; c != nil {
		c.probing = false
	}
}
