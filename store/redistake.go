package store

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit/local"
)

// The Redis store's Take: the synchronous decisions, one take script call
// per prefix and set of rules (and, in a Redis Cluster, per hash slot).

// Take implements Store. The requests of one set of rules go out as one
// script call per Redis Cluster hash slot; with a standalone or Sentinel
// client, whose keys are all on one server, as one script call whatever
// their keys: every call of a Take shares one pipeline, and the server's
// cost of a round trip (reading, parsing and answering it) is paid once per
// Take rather than once per lane.
func (s *Redis) Take(ctx context.Context, reqs []*TakeRequest) error {
	if err := ctx.Err(); err != nil {
		for _, r := range reqs {
			r.Status, r.Err = Failed, err
		}
		return err
	}
	calls := s.oneCall(reqs)
	if calls == nil {
		index := map[takeCallKey]*takeCall{}
		for _, r := range reqs {
			if r.check() != nil { // failed by oneCall
				continue
			}
			g := 0
			if s.cluster != nil {
				g = Slot(r.Key)
			}
			k := takeCallKey{g, r.Prefix, &r.Rules[0], len(r.Rules)}
			c := index[k]
			if c == nil {
				c = &takeCall{group: g}
				index[k] = c
				calls = append(calls, c)
			}
			c.reqs = append(c.reqs, r)
		}
	}
	ttl := int64(time.Minute / time.Millisecond)
	addrs := make([]string, len(calls))
	arenas := make([]*takeArena, len(calls))
	defer func() {
		for _, a := range arenas {
			if a != nil {
				a.release()
			}
		}
	}()
	s.lanes(len(calls), func(i int) int { return calls[i].group % s.o.Lanes }, func(items []int) {
		var sent sentAt // when the lane's calls were sent, for the breaker
		sent.start = s.now()
		// Calls of one pipeline must not share a take marker (one prefix
		// and group, several sets of rules): each run would overwrite the
		// marker of the one before, and a client's retry of the pipeline
		// would find every call's outcome but the last's lost. A call
		// whose marker an earlier call of the lane has goes on another
		// stream.
		stream := s.stream()
		var more []*takeStream // only when two calls would share a marker
		defer func() {
			s.releaseStream(stream)
			for _, t := range more {
				s.releaseStream(t)
			}
		}()
		var used map[string]bool // the lane's markers, when it has several calls
		if len(items) > 1 {
			used = make(map[string]bool, len(items))
		}
		var send []int
		for _, i := range items {
			c := calls[i]
			addr, ok := s.allow(ctx, c.group, &sent)
			if !ok {
				for _, r := range c.reqs {
					r.Status, r.Err = Failed, errOpen
				}
				continue
			}
			addrs[i] = addr
			c.seq = s.seq.Add(1)
			c.marker = stream.marker(c.reqs[0].Prefix, s.slotOf(c.group))
			for k := 0; used[c.marker]; k++ {
				if k == len(more) {
					more = append(more, s.stream())
				}
				c.marker = more[k].marker(c.reqs[0].Prefix, s.slotOf(c.group))
			}
			if used != nil {
				used[c.marker] = true
			}
			send = append(send, i)
		}
		at := sent // a copy the closure captures by value: sent would move to the heap
		s.perServer(send, addrs, func(send []int) {
			if len(send) == 0 {
				return
			}
			cmds, answered := execScript(s, ctx, true, takeScript, false, send, func(i int) ([]any, int) {
				c := calls[i]
				arenas[i] = takeArenas.Get().(*takeArena)
				return arenas[i].args(c.marker, c.seq, ttl, c.reqs)
			}, redis.NewIntSliceCmd)
			if !answered {
				for _, i := range send {
					arenas[i] = nil // the client may still write its arguments
				}
			}
			outcome := make(map[string]error, 1)
			for k, i := range send {
				readTake(cmds[k], calls[i].reqs)
				s.merge(outcome, addrs[i], cmdErr(cmds[k]))
			}
			s.reportAll(ctx, outcome, at)
		})
	})
	return nil
}

// takeCall is one take script call: requests that share a Redis Cluster
// hash slot (group), a prefix and their rules.
type takeCall struct {
	group  int
	reqs   []*TakeRequest
	seq    uint64
	marker string // the take marker key of the call's stream and group
}

// takeCallKey is what the requests of one takeCall share.
type takeCallKey struct {
	group  int
	prefix string
	rules  *local.Rule
	n      int
}

// oneCall checks reqs, failing those that are not valid, and returns them
// as one call when they all go in one (the valid ones share their prefix
// and rules, in a standalone or Sentinel deployment), or nil when they do
// not. A Take of one limiter's decisions makes one call without grouping
// its requests in a map or copying them.
func (s *Redis) oneCall(reqs []*TakeRequest) []*takeCall {
	var first *TakeRequest
	failed := 0
	same := s.cluster == nil
	for _, r := range reqs {
		if err := r.check(); err != nil {
			r.Status, r.Err = Failed, err
			failed++
			continue
		}
		if first == nil {
			first = r
		} else if same && (r.Prefix != first.Prefix || &r.Rules[0] != &first.Rules[0] || len(r.Rules) != len(first.Rules)) {
			same = false
		}
	}
	if !same {
		return nil
	}
	if first == nil {
		return []*takeCall{}
	}
	c := &takeCall{reqs: reqs}
	if failed > 0 {
		c.reqs = make([]*TakeRequest, 0, len(reqs)-failed)
		for _, r := range reqs {
			if r.check() == nil {
				c.reqs = append(c.reqs, r)
			}
		}
	}
	return []*takeCall{c}
}

// takeStream is a stream of take calls: its name in the take markers,
// and the last marker key it built.
type takeStream struct {
	node   string // the store's node, a dot and the stream's number
	prefix string // the last marker's prefix and slot
	slot   int
	last   string
}

// marker returns the stream's take marker key for prefix and slot.
func (t *takeStream) marker(prefix string, slot int) string {
	if t.last == "" || t.prefix != prefix || t.slot != slot {
		t.prefix, t.slot, t.last = prefix, slot, markerKey(prefix, 't', slot, t.node)
	}
	return t.last
}

// stream returns a free stream.
func (s *Redis) stream() *takeStream {
	s.streamMu.Lock()
	defer s.streamMu.Unlock()
	if n := len(s.streams); n > 0 {
		t := s.streams[n-1]
		s.streams = s.streams[:n-1]
		return t
	}
	s.nstreams++
	return &takeStream{node: s.node + "." + strconv.Itoa(s.nstreams-1)}
}

func (s *Redis) releaseStream(t *takeStream) {
	s.streamMu.Lock()
	s.streams = append(s.streams, t)
	s.streamMu.Unlock()
}

// kindCode returns the take script's code of a rule's kind.
func kindCode(k local.Kind) int {
	switch k {
	case local.Sliding:
		return 0
	case local.Fixed:
		return 1
	case local.Buckets:
		return 2
	case local.Log:
		return 3
	}
	return 4
}

// takeArena holds a take script call's arguments: the keys' bytes, the
// keys as slices of them, the numbers, and the arguments as pointers into
// both. A call's arena goes back to takeArenas once its Take has read the
// reply, and the next call reuses its arrays: a call allocates nothing
// once the arrays have grown to its size.
type takeArena struct {
	buf  []byte
	ends []int
	keys []string
	nums []int64
	argv []any
}

var takeArenas = sync.Pool{New: func() any { return new(takeArena) }}

// maxArena is the largest arena, in bytes of keys, that goes back to
// takeArenas: a rare huge call does not stay in memory.
const maxArena = 1 << 20

// release clears a's pointers and puts it back in takeArenas.
func (a *takeArena) release() {
	if cap(a.buf) > maxArena {
		return
	}
	clear(a.keys)
	clear(a.argv[:cap(a.argv)])
	a.keys, a.argv = a.keys[:0], a.argv[:0]
	takeArenas.Put(a)
}

// grow returns x emptied, with room for n elements.
func grow[T any](x []T, n int) []T {
	if cap(x) < n {
		return make([]T, 0, n)
	}
	return x[:0]
}

// args returns the take script's arguments for reqs, which share their
// rules, as execScript takes them: three free slots, then the keys and the
// numbers, and the number of keys. The keys are slices of one string and
// the numbers pointers into one array, all in a's arrays, which the
// caller must not release before the call's reply is read.
func (a *takeArena) args(marker string, seq uint64, ttl int64, reqs []*TakeRequest) ([]any, int) {
	rules := reqs[0].Rules
	logCap, longLog := int64(0), int64(0)
	perReq := 0 // keys per request
	for i := range rules {
		r := &rules[i]
		n := 1
		switch r.Kind() {
		case local.Log:
			logCap, longLog = max(logCap, r.Limit()), max(longLog, r.Window().Microseconds())
		case local.Sliding:
			n = 3 // the current window, the previous, the next
		case local.Buckets:
			_, span := r.Counter()
			n = int(span) + 1 // and the next bucket
		}
		perReq += n
	}
	nums := grow(a.nums, 5+5*len(rules)+3*len(reqs))
	nums = append(nums, int64(seq), ttl, reqs[0].Deadline, int64(len(reqs)), int64(len(rules)))
	for i := range rules {
		r := &rules[i]
		w, span := r.Counter()
		var wus, param int64 = w.Microseconds(), span
		switch r.Kind() {
		case local.Log:
			wus, param = r.Window().Microseconds(), logCap
		case local.GCRA, local.Leaky:
			wus, param = r.Interval().Microseconds(), r.Burst()
		}
		nums = append(nums, int64(kindCode(r.Kind())), r.Limit(), wus, param, longLog)
	}
	ends := grow(a.ends, perReq*len(reqs))
	size := 0 // the keys' bytes: a base and at most 24 bytes of counter each
	for _, q := range reqs {
		size += perReq * (len(q.Prefix) + 4 + base64.RawURLEncoding.EncodedLen(len(q.Key)) + 24)
	}
	buf := grow(a.buf, size)
	for _, q := range reqs {
		var flags int64
		if q.Peek {
			flags |= 1
		}
		if q.CountDenied {
			flags |= 2
		}
		nums = append(nums, q.Cost, flags, q.Now)
		for i := range rules {
			r := &rules[i]
			// Every key of a rule begins with the user key's base: the
			// first is built, the others copy it.
			start := len(buf)
			buf = appendKeyBase(buf, q.Prefix, q.Key)
			base := len(buf)
			key := func(c Counter) {
				if len(buf) > base {
					buf = append(buf, buf[start:base]...)
				}
				buf = appendCounter(buf, c)
				ends = append(ends, len(buf))
			}
			switch r.Kind() {
			case local.Log:
				buf = append(buf, "log"...)
				ends = append(ends, len(buf))
			case local.GCRA, local.Leaky:
				key(CounterOf(r, q.Key, 0))
			default:
				w, span := r.Counter()
				id := q.Now / w.Microseconds()
				switch r.Kind() {
				case local.Buckets:
					for j := range span {
						key(CounterOf(r, q.Key, id-span+1+j))
					}
					key(CounterOf(r, q.Key, id+1)) // a late request counts there
				case local.Fixed:
					key(CounterOf(r, q.Key, id))
				default:
					key(CounterOf(r, q.Key, id))
					key(CounterOf(r, q.Key, id-1))
					key(CounterOf(r, q.Key, id+1)) // a late request counts there
				}
			}
		}
	}
	// buf is not written again until the arena is reused, once the call's
	// reply is read.
	all := unsafe.String(unsafe.SliceData(buf), len(buf))
	keys := grow(a.keys, 1+len(ends))
	keys = append(keys, marker)
	from := 0
	for _, e := range ends {
		keys = append(keys, all[from:e])
		from = e
	}
	argv := grow(a.argv, 3+len(keys)+len(nums))[:3]
	for i := range keys {
		argv = append(argv, &keys[i])
	}
	for i := range nums {
		argv = append(argv, &nums[i])
	}
	a.buf, a.ends, a.keys, a.nums, a.argv = buf, ends, keys, nums, argv
	return argv, len(keys)
}

// readTake sets the results of reqs from their script call, whose reply
// is read as an array of integers.
func readTake(cmd *redis.IntSliceCmd, reqs []*TakeRequest) {
	fail := func(st Status, err error) {
		for _, r := range reqs {
			r.Status, r.Err = st, err
		}
	}
	if err := cmdErr(cmd); err != nil {
		st := InDoubt
		if isReply(err) {
			st = Failed
		}
		fail(st, fmt.Errorf("store: redis take of %d requests: %w", len(reqs), err))
		return
	}
	vals := cmd.Val()
	if len(vals) == 0 {
		fail(InDoubt, errors.New("store: redis take: empty reply"))
		return
	}
	switch vals[0] {
	case 2:
		fail(Failed, ErrDeadline)
		return
	case 3:
		fail(InDoubt, errors.New("store: redis take: a later call overwrote this call's outcome"))
		return
	}
	at := 1
	next := func() int64 {
		if at >= len(vals) {
			at++
			return 0
		}
		at++
		return vals[at-1]
	}
	for _, r := range reqs {
		r.Counts = resize(r.Counts, len(r.Rules))
		allowed := next()
		r.Allowed = allowed == 1
		for j := range r.Rules {
			rule := &r.Rules[j]
			w, span := rule.Counter()
			el := r.Now % w.Microseconds() * 1000
			var c local.Counts
			switch rule.Kind() {
			case local.Sliding:
				c = local.Counts{Cur: next(), Prev: next(), Elapsed: el}
				if next() == 1 { // late: decided at the next window's start
					c.Elapsed = 0
				}
			case local.Fixed:
				c = local.Counts{Cur: next(), Elapsed: el}
			case local.Buckets:
				c = local.Counts{Buckets: make([]int64, span), Elapsed: el}
				for k := range c.Buckets {
					c.Buckets[k] = next()
				}
				if next() == 1 { // late: decided at the next bucket's start
					c.Elapsed = 0
				}
			case local.Log:
				c = local.Counts{Cur: next(), Expire: next() * 1000, Reset: next() * 1000}
			default:
				c = local.Counts{Tat: aheadNs(next(), 0)}
			}
			r.Counts[j] = c
		}
		r.Status, r.Err = Applied, nil
		if allowed == 2 {
			r.Status, r.Err = Failed, fmt.Errorf("store: redis take of key %q: %w", r.Key, ErrForeign)
		}
	}
	if at != len(vals) {
		fail(InDoubt, fmt.Errorf("store: redis take script replied %d values, want %d", len(vals), at))
	}
}
