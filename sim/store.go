package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hybridlimit/hybridlimit/store"
)

// simStore is the store as the nodes of one configuration share it: the
// real store (memory or Redis) behind a decorator that counts round trips,
// fails every call during the outage window, and answers Time from the
// virtual clock (the store's clock is the true, unskewed time).
type simStore struct {
	inner   store.Store
	clock   *vclock
	start   int64
	outage  window
	calls   atomic.Uint64
	failed  atomic.Uint64
	virtual bool // Time answers from clock rather than the inner store
}

func (s *simStore) down() error {
	if s.outage.active(time.Duration(s.clock.nowNs() - s.start)) {
		s.failed.Add(1)
		return fmt.Errorf("sim: simulated outage: %w", store.ErrUnavailable)
	}
	return nil
}

func (s *simStore) push(ctx context.Context, batches []*store.Batch) error {
	s.calls.Add(1)
	if err := s.down(); err != nil {
		for _, b := range batches {
			b.Status, b.Err = store.Failed, err
		}
		return nil
	}
	return s.inner.Push(ctx, batches)
}

// Group implements store.Store.
func (s *simStore) Group(key string) int { return s.inner.Group(key) }

// nodeStore is one node's handle on the shared simStore. With a simulated
// latency, the driver runs the node's sync cycle on a goroutine and paces
// it in virtual time: Apply waits until the driver reaches the instant the
// request arrives at the store (half the round trip), applies it, then
// waits until the reply arrives (the whole round trip). The goroutine is
// always parked on a channel while the driver decides requests, so runs
// stay deterministic.
type nodeStore struct {
	*simStore
	paced   atomic.Bool
	entered chan struct{}
	release chan struct{}
	applied chan struct{}
}

func newNodeStore(s *simStore) *nodeStore {
	return &nodeStore{simStore: s, entered: make(chan struct{}), release: make(chan struct{}), applied: make(chan struct{})}
}

// Push implements store.Store.
func (s *nodeStore) Push(ctx context.Context, batches []*store.Batch) error {
	if !s.paced.Load() {
		return s.push(ctx, batches)
	}
	s.entered <- struct{}{}
	<-s.release
	err := s.push(ctx, batches)
	s.applied <- struct{}{}
	<-s.release
	return err
}

// Take implements store.Store.
func (s *nodeStore) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	s.calls.Add(1)
	if err := s.down(); err != nil {
		for _, r := range reqs {
			r.Status, r.Err = store.Failed, err
		}
		return nil
	}
	return s.inner.Take(ctx, reqs)
}

// Time implements store.Store.
func (s *nodeStore) Time(ctx context.Context) (time.Time, error) {
	s.calls.Add(1)
	if err := s.down(); err != nil {
		return time.Time{}, err
	}
	if s.virtual {
		return s.clock.Now(), nil
	}
	return s.inner.Time(ctx)
}
