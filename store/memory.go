package store

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// Memory is a Store held in this process's memory, with the same semantics
// as the Redis store: counters with expiries, read by the same key layout,
// and atomic decisions for the synchronous mode. Use it for tests, for the
// simulation, and for several limiters in one process.
//
// Memory is safe for concurrent use. The zero value is not usable: create
// one with NewMemory.
type Memory struct {
	clock clock.Clock
	mu    sync.Mutex
	m     map[string]memCounter
	sweep int // size at which expired counters are swept next

	calls atomic.Uint64
	ops   atomic.Uint64
}

type memCounter struct {
	v   int64
	exp int64 // Unix ms, 0 for none
}

// NewMemory returns an empty in-memory store whose expiries and Time follow
// c; a nil c means the real clock.
func NewMemory(c clock.Clock) *Memory {
	if c == nil {
		c = clock.New()
	}
	return &Memory{clock: c, m: make(map[string]memCounter), sweep: 1024}
}

// Calls returns how many times Apply and Take have been called: the round
// trips a network store would have made.
func (s *Memory) Calls() uint64 { return s.calls.Load() }

// Ops returns how many counter operations and decisions the store has run.
func (s *Memory) Ops() uint64 { return s.ops.Load() }

// Len returns the number of live counters.
func (s *Memory) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now().UnixMilli()
	n := 0
	for _, c := range s.m {
		if c.exp == 0 || c.exp > now {
			n++
		}
	}
	return n
}

// Get returns the value of the counter key (0 when missing or expired).
func (s *Memory) Get(key string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(key, s.clock.Now().UnixMilli())
}

func (s *Memory) get(key string, now int64) int64 {
	c, ok := s.m[key]
	if !ok {
		return 0
	}
	if c.exp != 0 && c.exp <= now {
		delete(s.m, key)
		return 0
	}
	return c.v
}

func (s *Memory) incr(key string, d, now int64) (v int64, created bool) {
	c, ok := s.m[key]
	if ok && c.exp != 0 && c.exp <= now {
		ok = false
	}
	if !ok {
		c = memCounter{}
	}
	c.v += d
	s.m[key] = c
	return c.v, !ok
}

func (s *Memory) expire(key string, at int64) {
	if c, ok := s.m[key]; ok {
		c.exp = at
		s.m[key] = c
	}
}

func (s *Memory) maybeSweep(now int64) {
	if len(s.m) < s.sweep {
		return
	}
	for k, c := range s.m {
		if c.exp != 0 && c.exp <= now {
			delete(s.m, k)
		}
	}
	s.sweep = max(1024, 2*len(s.m))
}

// Apply implements Store.
func (s *Memory) Apply(ctx context.Context, ops []Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.calls.Add(1)
	s.ops.Add(uint64(len(ops)))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now().UnixMilli()
	s.maybeSweep(now)
	for i := range ops {
		op := &ops[i]
		key := op.Name()
		if op.Delta == 0 {
			op.Total = s.get(key, now)
		} else {
			op.Total, _ = s.incr(key, op.Delta, now)
		}
		if op.ExpireAt != 0 {
			s.expire(key, op.ExpireAt)
		}
	}
	return nil
}

// Take implements Store.
func (s *Memory) Take(ctx context.Context, reqs []*TakeRequest) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.calls.Add(1)
	s.ops.Add(uint64(len(reqs)))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now().UnixMilli()
	s.maybeSweep(now)
	for i := range reqs {
		r := reqs[i]
		if err := r.check(); err != nil {
			r.Err = err
			continue
		}
		r.Allowed = true
		for j, rule := range r.Rules {
			cur := s.get(r.Keys[2*j], now)
			var prev int64
			if !rule.Fixed {
				prev = s.get(r.Keys[2*j+1], now)
			}
			r.Counts[2*j], r.Counts[2*j+1] = cur, prev
			if !Admits(rule.Limit, rule.WindowMs, r.NowUs, rule.Fixed, cur, prev, r.Cost) {
				r.Allowed = false
			}
		}
		if r.Peek || !(r.Allowed || r.CountDenied) {
			continue
		}
		for j := range r.Rules {
			v, created := s.incr(r.Keys[2*j], r.Cost, now)
			if created {
				s.expire(r.Keys[2*j], r.ExpireAt[j])
			}
			r.Counts[2*j] = v
		}
	}
	return nil
}

// Time implements Store.
func (s *Memory) Time(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	s.calls.Add(1)
	return s.clock.Now(), nil
}
