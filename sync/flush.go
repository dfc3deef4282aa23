package syncloop

import (
	"context"
	"fmt"
	"time"
)

// The final flush: Close's push of every entry, again until the store has
// it all or the context ends.

// all returns every entry of every table.
func (l *Loop) all() []owned {
	var dst []owned
	for _, t := range l.cfg.Tables {
		for _, e := range t.Entries(nil) {
			dst = append(dst, owned{t, e})
		}
	}
	return dst
}

// sendAll sends entries in chunks, the batches in doubt first.
func (l *Loop) sendAll(ctx context.Context, entries []owned, final bool) result {
	var res result
	for from := 0; from < len(entries) || (from == 0 && len(l.doubt) > 0); {
		n := l.chunk // send may widen the chunks after this one
		res.add(l.send(ctx, entries[min(from, len(entries)):min(from+n, len(entries))], final))
		from += n
	}
	return res
}

// Flush is Close's final push: it closes the tables, takes every entry's
// pending increments, sealing the entry, and pushes them, with the
// batches still in doubt, again and again until every batch is applied or
// ctx ends. It returns nil when every increment reached the store, and
// otherwise an error counting those that did not (or whose fate is
// unknown).
func (l *Loop) Flush(ctx context.Context) error {
	defer func() {
		for _, t := range l.cfg.Tables {
			t.FlushDone()
		}
		l.stopFirstClock()
	}()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushing = true
	for _, t := range l.cfg.Tables {
		t.Close()
	}
	// Nothing is pushed before the store's clock is known (FirstClock):
	// each pass waits for it, unless no increment waits for the store.
	canPush := func() bool {
		if l.clockKnown.Load() {
			return true
		}
		if n, _ := l.unsynced(); n == 0 && len(l.doubt) == 0 {
			return true // nothing to push
		}
		return l.FirstClock(ctx) == nil
	}
	first := true
	wait := 10 * time.Millisecond
	for {
		if first && canPush() {
			l.noteFailing(l.sendAll(ctx, l.all(), true))
			first = false
		}
		// What failed went back to its entries, which are queued again.
		l.noteFailing(l.landDone())
		if !first && !l.touched() && len(l.doubt) == 0 && len(l.flights) == 0 {
			if l.refusal != nil {
				return l.unflushed(l.refusal)
			}
			return nil
		}
		t := time.NewTimer(wait) // wall time, like ctx: Close waits in real time
		select {
		case <-ctx.Done():
			t.Stop()
			if n, _ := l.unsynced(); n == 0 && l.refusal == nil {
				// What is left in doubt only reads counters (pushes of
				// zero): the store lacks nothing.
				return nil
			}
			return l.unflushed(ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
		// Final takes again: an entry that a decision racing with Close
		// created or touched after the first pass is sealed now, so that
		// what this pass pushes is what the decisions report admitted.
		if !first && canPush() {
			res, _ := l.sendTouched(ctx, true)
			l.noteFailing(res)
		}
	}
}

// unflushed returns Flush's error: the increments taken but not applied.
// Every increment the store has not acknowledged is still in its entry's
// count (in flight, when a batch in doubt carries it; pending, when it
// was handed back after a failure), so each entry is counted once, from
// the table: counting the batches in doubt as well counted their
// increments twice.
func (l *Loop) unflushed(cause error) error {
	n, keys := l.unsynced()
	last := cause
	if b := l.stats.lastError.Load(); b != nil {
		last = fmt.Errorf("%w; last store error: %w", cause, b.err)
	}
	return fmt.Errorf("hybridlimit: Close: %d increments (per rule) of %d keys may not have reached the store: %w", n, keys, last)
}

// unsynced returns the increments the store has not acknowledged, and the
// number of keys holding them.
func (l *Loop) unsynced() (n, keys int64) {
	for _, o := range l.all() {
		if u := o.t.Unsynced(o.e); u > 0 {
			n += u
			keys++
		}
	}
	return n, keys
}
