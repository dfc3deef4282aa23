package store

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// Memory is a Store held in this process's memory, with the semantics of
// the Redis store: counters with expiries, batches applied at most once,
// and atomic decisions for the synchronous mode. Its calls never fail
// except for a done context, so nothing it holds is ever in doubt. Use it
// for tests, for the simulation, and for several limiters in one process.
//
// Memory is safe for concurrent use. The zero value is not usable: create
// one with NewMemory.
type Memory struct {
	clock clock.Clock

	mu      sync.Mutex
	m       map[string]memCounter
	logs    map[string]*memLog
	markers map[string]uint64
	sweep   int                          // size at which expired counters are swept next
	pol     map[string]map[string]string // per prefix: policies (see PolicyStore)
	polVer  map[string]uint64
	tags    map[string]*memTags // by TagsKey

	calls atomic.Uint64
	ops   atomic.Uint64
}

// memLog is a key's log: instants in µs, newest first.
type memLog struct {
	ts  []int64
	exp int64 // Unix ms
}

type memCounter struct {
	v   int64
	exp int64 // Unix ms, 0 for none
}

// memGroups is the number of groups of a Memory store.
const memGroups = 16

// NewMemory returns an empty in-memory store whose expiries and Time follow
// c; a nil c means the real clock.
func NewMemory(c clock.Clock) *Memory {
	if c == nil {
		c = clock.New()
	}
	return &Memory{clock: c, m: make(map[string]memCounter), logs: make(map[string]*memLog), markers: make(map[string]uint64), sweep: 1024}
}

// Calls returns how many times Push and Take have been called: the round
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

// Get returns the value of counter c under prefix (0 when missing or
// expired).
func (s *Memory) Get(prefix string, c Counter) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(CounterKey(prefix, c), s.clock.Now().UnixMilli())
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

// incr adds d to key and returns the new value; a counter it creates
// expires at exp.
func (s *Memory) incr(key string, d, now, exp int64) int64 {
	c, ok := s.m[key]
	if !ok || (c.exp != 0 && c.exp <= now) {
		c = memCounter{exp: exp}
	}
	c.v += d
	s.m[key] = c
	return c.v
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

// Group implements Store.
func (s *Memory) Group(key string) int { return Slot(key) % memGroups }

// Push implements Store.
func (s *Memory) Push(ctx context.Context, batches []*Batch) error {
	if err := ctx.Err(); err != nil {
		for _, b := range batches {
			b.Status, b.Err = Failed, err
		}
		return err
	}
	s.calls.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now().UnixMilli()
	s.maybeSweep(now)
	for _, b := range batches {
		s.ops.Add(uint64(len(b.Ops)))
		b.Totals = resize(b.Totals, len(b.Ops))
		marker := markerKey(b.Prefix, 'm', b.Group, b.Node)
		dup := s.markers[marker] >= b.Seq
		for i := range b.Ops {
			op := &b.Ops[i]
			key := CounterKey(b.Prefix, op.Counter)
			switch {
			case dup || op.Delta == 0:
				b.Totals[i] = s.get(key, now)
			case op.Rate > 0:
				b.Totals[i] = s.advance(key, op.Delta, op.Rate, s.clock.Now().UnixMicro())
			default:
				b.Totals[i] = s.incr(key, op.Delta, now, ExpireAt(op.Window, op.ID, op.Span))
			}
		}
		if !dup {
			s.markers[marker] = b.Seq
		}
		b.Status, b.Err = Applied, nil
	}
	return nil
}

// check validates the shape of r before a store runs it.
func (r *TakeRequest) check() error {
	switch {
	case len(r.Rules) == 0:
		return fmt.Errorf("store: TakeRequest has no rules")
	case r.Key == "":
		return fmt.Errorf("store: TakeRequest has an empty key")
	case r.Cost < 0:
		return fmt.Errorf("store: TakeRequest cost %d is negative", r.Cost)
	case r.Now < 0:
		return fmt.Errorf("store: TakeRequest instant %d is before the epoch", r.Now)
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
