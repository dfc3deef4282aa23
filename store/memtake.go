package store

import (
	"context"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
)

// The memory store's arrival times, logs and synchronous decisions: the
// same semantics as the Redis store's scripts (scripts.go).

// maxAheadUs is local.MaxAhead in µs: how far past now an arrival time
// runs at most.
const maxAheadUs = local.MaxAhead / 1000

// advance moves the arrival time key d intervals of rate µs past
// max(itself, now µs) (d < 0 takes back), at most maxAheadUs past now,
// and returns it.
func (s *Memory) advance(key string, d, rate, now int64) int64 {
	tat := s.get(key, now/1000)
	step := d * rate // saturated at ±maxAheadUs
	if rate > 0 && (d > maxAheadUs/rate || d < -maxAheadUs/rate) {
		step = maxAheadUs
		if d < 0 {
			step = -maxAheadUs
		}
	}
	if d > 0 {
		tat = now + min(max(tat-now, 0)+step, maxAheadUs)
	} else {
		tat = max(tat+step, now-maxAheadUs) // an arrival time that far back holds nothing
	}
	s.m[key] = memCounter{v: tat, exp: max(tat, now)/1000 + 60_000}
	return tat
}

// aheadNs returns tat − now (µs) in ns, within ±local.MaxAhead.
func aheadNs(tat, now int64) int64 {
	return min(max(tat-now, -maxAheadUs), maxAheadUs) * 1000
}

// log returns key's log, dropping it when expired.
func (s *Memory) log(key string, nowMs int64) *memLog {
	l := s.logs[key]
	if l != nil && l.exp <= nowMs {
		delete(s.logs, key)
		return nil
	}
	return l
}

// Take implements Store.
func (s *Memory) Take(ctx context.Context, reqs []*TakeRequest) error {
	if err := ctx.Err(); err != nil {
		for _, r := range reqs {
			r.Status, r.Err = Failed, err
		}
		return err
	}
	s.calls.Add(1)
	s.ops.Add(uint64(len(reqs)))
	s.mu.Lock()
	defer s.mu.Unlock()
	nowT := s.clock.Now()
	s.maybeSweep(nowT.UnixMilli())
	for _, r := range reqs {
		if err := r.check(); err != nil {
			r.Status, r.Err = Failed, err
			continue
		}
		if r.Deadline != 0 && nowT.UnixMicro() > r.Deadline {
			r.Status, r.Err = Failed, ErrDeadline
			continue
		}
		s.take(r, nowT.UnixMilli())
		r.Status, r.Err = Applied, nil
	}
	return nil
}

// take decides r at the store's instant nowMs (expiries); the decision
// itself is at r.Now.
func (s *Memory) take(r *TakeRequest, nowMs int64) {
	r.Counts = resize(r.Counts, len(r.Rules))
	r.Allowed = true
	for j := range r.Rules {
		r.Counts[j] = s.counts(r, &r.Rules[j], nowMs)
		if !r.Rules[j].Admits(r.Counts[j], r.Cost) {
			r.Allowed = false
		}
	}
	if r.Peek || !(r.Allowed || r.CountDenied) {
		return
	}
	logged := false
	for j := range r.Rules {
		rule, c := &r.Rules[j], &r.Counts[j]
		switch rule.Kind() {
		case local.Log:
			if !logged {
				s.logPush(r, nowMs)
				logged = true
			}
			if !r.Allowed {
				// A denied request charged by CountDenied waits for its
				// own entries to leave too.
				c.Expire = s.logCounts(r, rule, nowMs).Expire
			}
			c.Cur += r.Cost
			c.Reset = int64(rule.Window())
		case local.GCRA, local.Leaky:
			tat := s.advance(CounterKey(r.Prefix, CounterOf(rule, r.Key, 0)), r.Cost, rule.Interval().Microseconds(), r.Now)
			c.Tat = aheadNs(tat, r.Now)
		default:
			w, span := rule.Counter()
			id, _ := s.decidedAt(r, rule, nowMs)
			v := s.incr(CounterKey(r.Prefix, CounterOf(rule, r.Key, id)), r.Cost, nowMs, ExpireAt(w.Milliseconds(), id, span))
			if rule.Kind() == local.Buckets {
				c.Buckets[len(c.Buckets)-1] = v
			} else {
				c.Cur = v
			}
		}
	}
}

// counts reads rule's counts of r's key at r.Now.
func (s *Memory) counts(r *TakeRequest, rule *local.Rule, nowMs int64) local.Counts {
	switch rule.Kind() {
	case local.Log:
		return s.logCounts(r, rule, nowMs)
	case local.GCRA, local.Leaky:
		tat := s.get(CounterKey(r.Prefix, CounterOf(rule, r.Key, 0)), nowMs)
		return local.Counts{Tat: aheadNs(tat, r.Now)}
	}
	_, span := rule.Counter()
	id, el := s.decidedAt(r, rule, nowMs)
	get := func(id int64) int64 { return s.get(CounterKey(r.Prefix, CounterOf(rule, r.Key, id)), nowMs) }
	switch rule.Kind() {
	case local.Buckets:
		b := make([]int64, span)
		for k := range span {
			b[k] = get(id - span + 1 + k)
		}
		return local.Counts{Buckets: b, Elapsed: el}
	case local.Fixed:
		return local.Counts{Cur: get(id), Elapsed: el}
	}
	return local.Counts{Cur: get(id), Prev: get(id - 1), Elapsed: el}
}

// decidedAt returns the window (bucket) id at which rule decides r, and the
// time elapsed in it (ns): r's own, or, when r is late for a sliding or
// bucketed rule (the next window or bucket already holds counts: a node
// whose clock is ahead counted there), the next one's, from its start. See
// takeScript.
func (s *Memory) decidedAt(r *TakeRequest, rule *local.Rule, nowMs int64) (id, elapsed int64) {
	w, _ := rule.Counter()
	wus := w.Microseconds()
	id = r.Now / wus
	if k := rule.Kind(); (k == local.Sliding || k == local.Buckets) &&
		s.get(CounterKey(r.Prefix, CounterOf(rule, r.Key, id+1)), nowMs) > 0 {
		return id + 1, 0
	}
	return id, r.Now % wus * 1000
}

// logCounts reads a Log rule's counts of r's key at r.Now for r.Cost.
func (s *Memory) logCounts(r *TakeRequest, rule *local.Rule, nowMs int64) local.Counts {
	l := s.log(LogKey(r.Prefix, r.Key), nowMs)
	if l == nil {
		return local.Counts{}
	}
	w := rule.Window().Microseconds()
	n := int64(0)
	for n < int64(len(l.ts)) && l.ts[n] > r.Now-w {
		n++
	}
	c := local.Counts{Cur: n}
	if k := n + r.Cost - rule.Limit(); k > 0 {
		c.Expire = (l.ts[n-k] + w - r.Now) * 1000
	}
	if n > 0 {
		c.Reset = (l.ts[0] + w - r.Now) * 1000
	}
	return c
}

// logPush logs r.Cost instants r.Now on r's key, keeping the largest Log
// limit of r's rules, expiring after the longest Log window.
func (s *Memory) logPush(r *TakeRequest, nowMs int64) {
	keep, longest := int64(0), time.Duration(0)
	for j := range r.Rules {
		if r.Rules[j].Kind() == local.Log {
			keep, longest = max(keep, r.Rules[j].Limit()), max(longest, r.Rules[j].Window())
		}
	}
	key := LogKey(r.Prefix, r.Key)
	l := s.log(key, nowMs)
	if l == nil {
		l = &memLog{}
		s.logs[key] = l
	}
	at := r.Now
	if len(l.ts) > 0 {
		at = max(at, l.ts[0]) // newest first, whatever order the nodes' instants arrive in
	}
	// The newest keep instants: min(Cost, keep) new ones, then the old.
	n := min(r.Cost, keep)
	ts := make([]int64, n, n+min(int64(len(l.ts)), keep-n))
	for i := range ts {
		ts[i] = at
	}
	l.ts = append(ts, l.ts[:min(int64(len(l.ts)), keep-n)]...)
	// The newest entry counts until at + longest (µs): expire on the
	// millisecond after, and never before the longest window from the
	// store's own now.
	l.exp = max(nowMs+longest.Milliseconds(), (at+longest.Microseconds()+999)/1000)
}
