package local

import "sync/atomic"

// Rollovers: a counter moving to a new window, and the closed buckets of
// Buckets rules it leaves behind.

// histAdd adds d to the closed bucket id of rule i, if it is kept. Call
// with e's mutex held.
func (t *Table) histAdd(e *Entry, i int, id, d int64) {
	s := &t.xOf(e).Load().hist[t.histOff[i]+t.rules[i].bucketSlot(id)]
	if s.id.Load() == id {
		s.n.Add(d)
		if t.inWindow(e, i, id) {
			t.closedSum(e, i).Add(d)
		}
	}
}

// closedSum returns the running sum of rule i's closed buckets in its
// counter's current window (Buckets). It changes under e's mutex only.
func (t *Table) closedSum(e *Entry, i int) *atomic.Int64 {
	return &t.xOf(e).Load().hist[t.histOff[i]+int(t.rules[i].span)].n
}

// inWindow reports whether the closed bucket id of rule i is in its
// counter's current window. Call with e's mutex held.
func (t *Table) inWindow(e *Entry, i int, id int64) bool {
	win := e.ctr(i).win.Load()
	return win-t.rules[i].span < id && id < win
}

// resum recomputes rule i's running sum of closed buckets from its slots.
// Call with e's mutex held.
func (t *Table) resum(e *Entry, i int) {
	r := &t.rules[i]
	h := t.xOf(e).Load().hist[t.histOff[i] : t.histOff[i]+int(r.span)]
	win := e.ctr(i).win.Load()
	sum := int64(0)
	for id := win - r.span + 1; id < win; id++ {
		if s := &h[r.bucketSlot(id)]; s.id.Load() == id {
			sum += s.n.Load()
		}
	}
	t.closedSum(e, i).Store(sum)
}

// roll moves rule i of e to window id if it is behind it, and reports
// false, changing nothing, if e was sealed by the final flush.
func (t *Table) roll(e *Entry, i int, id, now int64) bool {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	if e.has(flagSealed) {
		return false
	}
	t.rollLocked(e, i, id, now)
	return true
}

// rollLocked moves rule i of e to window id if it is behind. Call with
// e's mutex held.
func (t *Table) rollLocked(e *Entry, i int, id, now int64) {
	c := e.ctr(i)
	old := c.win.Load()
	if old >= id {
		return
	}
	w := freeze(c)
	p := w.count()
	total := c.base.Load() + p
	if id == old+1 {
		c.prev.Store(total)
	} else {
		c.prev.Store(0)
	}
	buckets := t.rules[i].kind == Buckets
	if buckets {
		x := t.xOf(e).Load()
		s := &x.hist[t.histOff[i]+t.rules[i].bucketSlot(old)]
		s.id.Store(old)
		s.n.Store(total)
		if x.oldReads&((oldAll|oldSkip)<<i) != 0 {
			// The reads of the older buckets are still to come: which
			// buckets this node read is no longer told by what it holds.
			x.oldReads |= oldAll << i
		}
	}
	if t.syncing {
		s := t.sync(e, i)
		// What this node still owes the window that stops being the
		// previous one is pushed later, as stale.
		// What batches the store has not answered carry for it stays
		// counted until they are answered (Settle, Release).
		dropped := t.stash(e, i, old-1, s.prevPending)
		t.fly(e, i, s.prevInflight)
		if id == old+1 {
			s.prevPending, s.prevInflight = p+s.adj, s.inflight
			if buckets && e.prevReads&(readFirst<<i) != 0 {
				// Bucket old-1 was never read as the previous one: read it
				// as an older one.
				t.xOf(e).Load().oldReads |= oldSkip << i
			}
			e.prevReads |= (readFirst | readUntil) << i
		} else {
			dropped += t.stash(e, i, old, p+s.adj)
			t.fly(e, i, s.inflight)
			s.prevPending, s.prevInflight = 0, 0
			if t.rules[i].weighsPrev() {
				// This node had nothing in the previous window, but the
				// other nodes may have: read it, and for a Buckets rule
				// the older buckets of its window too.
				e.prevReads |= (readFirst | readUntil) << i
				if buckets {
					t.xOf(e).Load().oldReads |= oldSkip << i
				}
			} else {
				e.prevReads &^= (readFirst | readUntil) << i
			}
		}
		s.inflight, s.adj = 0, 0
		t.addDropped(dropped)
	}
	c.base.Store(0)
	c.win.Store(id)
	if buckets {
		t.resum(e, i) // before the word: a decision that reads it reads the sum of its window
	}
	c.word.Store(uint64(w.next()))
}

// freeze sets the rolling flag on c's word and returns the word before:
// decisions that see the flag wait on the entry's mutex, which the caller
// holds, until it stores the next word.
func freeze(c *counter) word {
	for {
		w := word(c.word.Load())
		if c.word.CompareAndSwap(uint64(w), uint64(w|rollingBit)) {
			return w
		}
	}
}
