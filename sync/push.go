package syncloop

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Sending: the pending increments of a chunk of entries as one batch per
// group, pushed to the store, and each batch's outcome handed back to the
// tables.

// send takes the pending increments of entries (sealing them when final),
// pushes them after the batches in doubt, and hands the outcome back to
// the table.
func (l *Loop) send(ctx context.Context, entries []owned, final bool) result {
	now := l.cfg.Now()
	batches := append([]*batch(nil), l.doubt...)
	l.doubt = l.doubt[:0]
	// A group with a batch in doubt gets no new batch until an answer
	// resolves it: the store applies a group's batches in order, and an
	// error on the old one beside an applied new one would make the old
	// one look applied when sent again.
	// Likewise a group with a batch in a call still under way (a flight).
	held := map[int]bool{}
	for _, b := range batches {
		held[b.sb.Group] = true
	}
	for _, f := range l.flights {
		for _, b := range f.batches {
			held[b.sb.Group] = true
		}
	}
	open := map[int]*batch{}
	for _, o := range entries {
		t, e := o.t, o.e
		g := l.cfg.Store.Group(e.Key())
		if held[g] {
			t.Requeue(e) // its increments wait, counted, for the next cycle
			continue
		}
		b := open[g]
		if b == nil || len(b.pushes) >= maxOps {
			b = l.newBatch(g)
			open[g] = b
			batches = append(batches, b)
		}
		s := span{owned: o, from: len(b.pushes)}
		if final {
			b.pushes = t.TakeFinal(e, now, b.pushes)
		} else {
			b.pushes, s.again = t.Take(e, now, b.pushes)
		}
		s.to = len(b.pushes)
		rules := t.Rules()
		for _, p := range b.pushes[s.from:s.to] {
			b.sb.Ops = append(b.sb.Ops, store.Op{Counter: store.CounterOf(&rules[p.Rule], e.Key(), p.Win), Delta: p.Delta})
		}
		b.spans = append(b.spans, s)
	}
	if len(entries) >= chunk && len(open) > len(entries)/4 {
		l.chunk = wideChunk // batches of under four entries: the store has many groups
	}
	// Entries sealed before have nothing to send.
	kept := batches[:0]
	for _, b := range batches {
		if len(b.sb.Ops) > 0 {
			kept = append(kept, b)
		} else {
			l.recycle(b)
		}
	}
	return l.push(ctx, kept, now)
}

// refused settles the pushes of span s of the applied batch b when the
// store refused some of them (a counter holding a foreign value), and
// reports whether it did: the others are settled, the refused ones handed
// back to their counters like a failed batch's, so that the node's
// decisions keep counting them and they go out again (not in the final
// flush, which counts them in Close's error).
func (l *Loop) refused(b *batch, s span, now int64) bool {
	ref := b.sb.Refused[s.from:s.to]
	if !slices.Contains(ref, true) {
		return false
	}
	var ok, back []local.Push
	var totals []int64
	for k, p := range b.pushes[s.from:s.to] {
		if ref[k] {
			back = append(back, p)
		} else {
			ok = append(ok, p)
			totals = append(totals, b.sb.Totals[s.from+k])
		}
	}
	s.t.Settle(s.e, now, ok, totals)
	s.t.Release(s.e, back)
	if l.flushing {
		// The store will refuse them again: Close counts them unflushed
		// instead of sending them until its context ends.
		l.refusal = b.sb.Err
	} else {
		s.t.Requeue(s.e)
	}
	return true
}

func (l *Loop) newBatch(group int) *batch {
	var b *batch
	if n := len(l.free); n > 0 {
		b, l.free = l.free[n-1], l.free[:n-1]
	} else {
		b = &batch{}
	}
	l.seq++
	b.sb = store.Batch{Prefix: l.cfg.Prefix, Node: l.cfg.Node, Group: group, Seq: l.seq, Ops: b.sb.Ops[:0], Totals: b.sb.Totals}
	b.pushes, b.spans, b.doubt = b.pushes[:0], b.spans[:0], false
	return b
}

// recycle keeps b's storage for a later batch, unless it grew unusually.
func (l *Loop) recycle(b *batch) {
	clear(b.spans)
	clear(b.sb.Ops)
	if cap(b.sb.Ops) > 4*maxOps || len(l.free) >= 64 {
		return
	}
	l.free = append(l.free, b)
}

// flight is one store call of push: batches, sent at the cycle's instant
// now (ns), with ops operations. A call made apart (fly) closes done once
// it returned err after latency.
type flight struct {
	batches []*batch
	now     int64
	ops     int
	latency time.Duration
	err     error
	gone    bool // the caller gave up on the call early (see call)
	done    chan struct{}
}

// push sends batches and hands the outcome of each to the table. With a
// store that routes its keys to servers (store.Router, a Redis Cluster),
// each server's batches go in a call of their own, and push waits for
// them until one Rate has passed or, when the first call to return took
// more than half a Rate (a large cycle), until twice its latency: a call
// it stopped waiting for (a hung master's, until the StoreTimeout) stays
// a flight, whose groups get no new batch (send) until a later cycle
// lands its outcome (landDone), while the other servers' keys go on
// syncing every Rate. It always waits for the first call, and in a
// CycleAll for every call.
func (l *Loop) push(ctx context.Context, batches []*batch, now int64) result {
	if len(batches) == 0 {
		return result{}
	}
	var res result
	if routes := l.routes(batches); len(routes) < 2 {
		f := newFlight(batches, now)
		l.call(ctx, f)
		res = l.land(f)
	} else {
		res = l.fly(ctx, routes, now)
	}
	if res.first == nil {
		res.first = ctx.Err()
	}
	return res
}

// fly sends each route's batches in a call of its own, waits for them as
// push says, lands those that returned and keeps the others as flights.
func (l *Loop) fly(ctx context.Context, routes [][]*batch, now int64) result {
	fs := make([]*flight, len(routes))
	returned := make(chan struct{}, len(routes))
	for i, bs := range routes {
		f := newFlight(bs, now)
		f.done = make(chan struct{})
		fs[i] = f
		go func() {
			l.call(ctx, f)
			close(f.done)
			returned <- struct{}{}
		}()
	}
	start := l.cfg.Clock.Now()
	wait := l.cfg.Clock.Timer(l.cfg.Rate)
	defer func() { wait.Stop() }()
	timeout := wait.C
	for n := 0; n < len(fs) && (timeout != nil || n == 0 || l.whole); {
		select {
		case <-returned:
			n++
			// The others' calls, as large, may take as long as the
			// first: a server is hung only past twice its latency.
			if d := l.cfg.Clock.Since(start); n == 1 && 2*d > l.cfg.Rate {
				wait.Stop()
				wait = l.cfg.Clock.Timer(d)
				timeout = wait.C
			}
		case <-timeout:
			timeout = nil
		}
	}
	var res result
	for _, f := range fs {
		if landed(f) {
			res.add(l.land(f))
		} else {
			l.flights = append(l.flights, f)
		}
	}
	return res
}

// routes returns batches split by the server of their groups, in the
// order of their first batch, when the store routes keys (store.Router);
// otherwise, all of them together.
func (l *Loop) routes(batches []*batch) [][]*batch {
	r, ok := l.cfg.Store.(store.Router)
	if !ok {
		return [][]*batch{batches}
	}
	var out [][]*batch
	idx := map[int]int{}
	for _, b := range batches {
		id := r.Route(b.sb.Prefix, b.sb.Ops[0].Key) // one group, one server
		k, ok := idx[id]
		if !ok {
			k = len(out)
			idx[id] = k
			out = append(out, nil)
		}
		out[k] = append(out[k], b)
	}
	return out
}

func newFlight(batches []*batch, now int64) *flight {
	f := &flight{batches: batches, now: now}
	for _, b := range batches {
		f.ops += len(b.sb.Ops)
	}
	return f
}

// landed reports whether f's call has returned.
func landed(f *flight) bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// call makes f's store call. It touches nothing of the loop's but f.
func (l *Loop) call(ctx context.Context, f *flight) {
	sbs := make([]*store.Batch, len(f.batches))
	for i, b := range f.batches {
		sbs[i] = &b.sb
	}
	// A large call gets time in proportion: 10µs per operation on top of
	// Timeout (100k counters: +1s).
	cctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout+time.Duration(f.ops)*10*time.Microsecond)
	start, wall := l.cfg.Clock.Now(), time.Now()
	f.err = l.cfg.Store.Push(cctx, sbs)
	if f.err == nil {
		f.err = cctx.Err()
	}
	cancel()
	f.latency = l.cfg.Clock.Now().Sub(start)
	// The caller's context ended (Limiter.Sync's, Close's, or the loop
	// stopping) before the store had half of Timeout to answer, what the
	// synchronous mode gives it too: a failure may be the caller's alone.
	// Past that, a store that has not answered is failing, whatever the
	// caller's deadline.
	f.gone = ctx.Err() != nil && time.Since(wall) < l.cfg.Timeout/2 // contexts run on wall time
}

// waitFlights waits until every call under way (a flight) has returned,
// or ctx ends.
func (l *Loop) waitFlights(ctx context.Context) {
	for _, f := range l.flights {
		select {
		case <-f.done:
		case <-ctx.Done():
			return
		}
	}
}

// landDone lands the flights whose calls have returned, in the order sent.
func (l *Loop) landDone() result {
	var res result
	kept := l.flights[:0]
	for _, f := range l.flights {
		if landed(f) {
			res.add(l.land(f))
		} else {
			kept = append(kept, f)
		}
	}
	clear(l.flights[len(kept):])
	l.flights = kept
	return res
}

// land hands the outcome of f's returned call to the tables.
func (l *Loop) land(f *flight) result {
	batches, now, ops, err, latency := f.batches, f.now, f.ops, f.err, f.latency
	for _, b := range batches {
		if b.sb.Status == store.NotSent { // a store that only returned an error
			b.sb.Status, b.sb.Err = store.InDoubt, err
			if err == nil {
				b.sb.Err = errors.New("syncloop: the store set no status")
			}
		}
	}
	l.stats.calls.Add(1)
	// A call whose caller gave up early (see call) may have failed for that
	// alone: its failures (gone, not failed) mark no group failing and are
	// not reported as the store's; they go out again as any failure does.
	var res result
	for _, b := range batches {
		switch b.sb.Status {
		case store.Applied:
			res.applied++
			l.stats.ops.Add(uint64(len(b.sb.Ops)))
			for _, s := range b.spans {
				if len(b.sb.Refused) > 0 && l.refused(b, s, now) {
					continue
				}
				s.t.Settle(s.e, now, b.pushes[s.from:s.to], b.sb.Totals[s.from:s.to])
				if !l.flushing && (s.again || now-s.e.LastSeen() < int64(l.cfg.Recent)) {
					s.t.Requeue(s.e)
				}
			}
			if b.sb.Err != nil {
				// A foreign value in a counter: the rest was applied.
				l.report(b.sb.Err)
				if res.first == nil {
					res.first = b.sb.Err
				}
			}
			l.recycle(b)
		case store.InDoubt:
			b.doubt = true
			fallthrough
		default:
			if f.gone {
				res.gone++
			} else {
				res.failed++
			}
			if res.first == nil {
				res.first = b.sb.Err
			}
			if l.cycleFailed != nil && !f.gone {
				l.cycleFailed[b.sb.Group] = true
			}
			if b.doubt {
				// Once in doubt, only an answer resolves it: send it
				// again, unchanged, before any later batch of its group.
				l.doubt = append(l.doubt, b)
				continue
			}
			for _, s := range b.spans {
				s.t.Release(s.e, b.pushes[s.from:s.to])
				s.t.Requeue(s.e)
			}
			l.recycle(b)
		}
	}
	l.stats.doubt.Store(int64(len(l.doubt)))
	if res.failed+res.gone > 0 {
		if res.first == nil {
			res.first = errors.New("store: batch not applied")
		}
		if res.failed > 0 {
			l.report(res.first)
		}
	} else {
		l.stats.latency.Store(int64(latency))
	}
	if l.cfg.OnSync != nil {
		var err error
		if res.failed+res.gone > 0 {
			err = res.first
		}
		l.cfg.OnSync(latency, ops, err)
	}
	return res
}
