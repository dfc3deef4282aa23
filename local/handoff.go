package local

// The handoff with the sync loop. Take moves an entry's pending increments
// to in-flight and describes them as Pushes; after the store answers, the
// loop hands the pushes back with Settle (applied, with the store's
// totals) or Release (not applied: push them again later). Between Take
// and Settle or Release the increments still count in every decision, so
// nothing is lost or counted twice, whatever the store does.

// Push is one counter operation the sync loop sends to the store for an
// entry: Delta (signed; 0 only reads) added to the store's counter of rule
// Rule's window Win.
type Push struct {
	Rule  int
	Win   int64
	Delta int64
	kind  pushKind
}

type pushKind uint8

const (
	pushCur   pushKind = iota // the counter's current window when taken
	pushPrev                  // the window before it
	pushStale                 // an older window: increments only, never read back
	pushOld                   // a Buckets rule's closed bucket older than the previous one: a read
)

// Reads reports whether the store's total after the push matters to the
// entry (Settle uses it); stale pushes only deliver increments.
func (p *Push) Reads() bool { return p.kind != pushStale }

// Take appends to dst what the sync loop must send for e at now: for every
// rule its current window (the pending increments, or a read) and, where
// needed, the previous window and an older one. It reports whether e must
// stay queued for the next cycle even without new decisions (it still
// reads a previous window, or holds stale increments).
func (t *Table) Take(e *Entry, now int64, dst []Push) ([]Push, bool) {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	return t.takeLocked(e, now, dst)
}

func (t *Table) takeLocked(e *Entry, now int64, dst []Push) ([]Push, bool) {
	again := false
	for i := range t.rules {
		if t.rules[i].kind == Log {
			continue // decided in the store (the synchronous mode): nothing to push
		}
		c, s := e.ctr(i), t.sync(e, i)
		// Freeze the word as a rollover does, so that no decision reads
		// the count moved to base twice, or not at all.
		w := freeze(c)
		delta := w.count() + s.adj
		s.adj = 0
		s.inflight += delta
		c.base.Add(w.count()) // base = store total + in-flight + adjustments
		c.word.Store(uint64(w.next()))
		win := c.win.Load()
		dst = append(dst, Push{Rule: i, Win: win, Delta: delta, kind: pushCur})
		read, readAgain := t.readsPrev(e, i, win, now)
		again = again || readAgain
		switch {
		case s.prevPending != 0:
			dst = append(dst, Push{Rule: i, Win: win - 1, Delta: s.prevPending, kind: pushPrev})
			s.prevInflight += s.prevPending
			s.prevPending = 0
		case read:
			dst = append(dst, Push{Rule: i, Win: win - 1, kind: pushPrev})
		}
		if st := t.stale(e, i); st != nil {
			if st.n != 0 {
				dst = append(dst, Push{Rule: i, Win: st.win, Delta: st.n, kind: pushStale})
				st.flying += st.n
				st.n = 0
			}
			for _, b := range st.back {
				dst = append(dst, Push{Rule: i, Win: b.win, Delta: b.n, kind: pushStale})
				st.flying += b.n
			}
			st.back = st.back[:0]
		}
		dst = t.takeOld(e, i, win, now, dst)
	}
	return dst, again
}

// takeOld appends to dst, for Buckets rule i of e whose counter is in
// window win at now, reads of the closed buckets of the window older than
// the previous one (whose read is pushPrev) that the node must read:
//
//   - when the counter has just taken up the key (Entry's oldReads), what
//     the other nodes counted there while this node did not read the key.
//     A new entry reads them all. After a rollover past the next bucket,
//     it reads the bucket it left (which it last read while it was
//     current) and the later ones, and any it holds nothing of: the older
//     ones it read after they closed, as the previous bucket. Only the
//     first take after the counter took up the key reads them.
//   - a bucket that ended less than ReadPrev ago: the other nodes push
//     their last increments of a bucket within a sync period of its end,
//     which may be after it stopped being the previous one (a bucket of
//     less than two sync periods).
//
// In steady state a bucket of two sync periods or more is read while it
// is the previous one. Call with e's mutex held.
func (t *Table) takeOld(e *Entry, i int, win, now int64, dst []Push) []Push {
	if t.rules[i].kind != Buckets {
		return dst
	}
	r := &t.rules[i]
	first := win - r.span + 1
	late := max((now-t.readPrev)/r.w, first) // the oldest bucket that ended less than ReadPrev ago
	x := t.ext(e)
	if x == nil || x.oldReads&((oldAll|oldSkip)<<i) == 0 {
		for id := late; id < win-1; id++ {
			dst = append(dst, Push{Rule: i, Win: id, kind: pushOld})
		}
		return dst
	}
	h := x.hist[t.histOff[i] : t.histOff[i]+int(r.span)]
	from := first
	if x.oldReads&(oldAll<<i) == 0 {
		// The newest bucket this node holds: the one it left.
		for id := win - 2; id >= from; id-- {
			if h[r.bucketSlot(id)].id.Load() == id {
				from = id
				break
			}
		}
	}
	x.oldReads &^= (oldAll | oldSkip) << i
	for id := first; id < win-1; id++ {
		if id >= from || id >= late || h[r.bucketSlot(id)].id.Load() != id {
			dst = append(dst, Push{Rule: i, Win: id, kind: pushOld})
		}
	}
	return dst
}

// settleOld writes the store's total n of closed bucket id of rule i into
// e's history, if the bucket is still in the counter's window. This
// node's own increments of the bucket that the store has not applied yet
// (stale ones still to push, or in a batch not answered) are in the
// bucket's history, not in n: the larger of the two, a count that neither
// side exceeds, is kept. Call with e's mutex held.
func (t *Table) settleOld(e *Entry, i int, id, n int64) {
	if !t.inWindow(e, i, id) {
		return
	}
	if st := t.stale(e, i); st != nil {
		n += st.pending(id)
	}
	s := &t.xOf(e).Load().hist[t.histOff[i]+t.rules[i].bucketSlot(id)]
	if s.id.Load() == id && s.n.Load() > n {
		return
	}
	t.histSet(e, i, id, n)
}

// readsPrev reports whether a take of rule i of e at now reads the
// store's total of window win-1, win being the counter's window, and
// whether the take after it may too. After a rollover into the window
// following its last one, a counter reads its previous window at the first
// take, however late, and at every take before ReadPrev into window win:
// the other nodes push their last increments of win-1 within a sync period
// of its end. Call with e's mutex held.
func (t *Table) readsPrev(e *Entry, i int, win, now int64) (read, again bool) {
	first := e.prevReads&(readFirst<<i) != 0
	until := e.prevReads&(readUntil<<i) != 0 && now < win*t.rules[i].w+t.readPrev
	e.prevReads &^= readFirst << i
	if !until {
		e.prevReads &^= readUntil << i
	}
	return first || until, until
}

// Settle writes back what the store answered for pushes of e that it
// applied at about now: totals[k] is the store's counter after pushes[k].
func (t *Table) Settle(e *Entry, now int64, pushes []Push, totals []int64) {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	if t.share && t.shareOf(e, 0) == nil && t.othersShown(e, pushes, totals) {
		t.newShares(e)
	}
	for k := range pushes {
		p := &pushes[k]
		c, s := e.ctr(p.Rule), t.sync(e, p.Rule)
		win := c.win.Load()
		switch {
		case t.rules[p.Rule].kind == GCRA || t.rules[p.Rule].kind == Leaky:
			// An arrival time (µs), which now holds what was pushed.
			s.inflight -= p.Delta
			c.prev.Store(storedTat(totals[k]))
			c.base.Store(s.inflight + s.adj)
		case p.kind == pushOld:
			t.settleOld(e, p.Rule, p.Win, totals[k])
		case p.kind == pushCur && win == p.Win:
			s.inflight -= p.Delta
			c.base.Store(totals[k] + s.inflight + s.adj)
		case p.kind == pushCur && win == p.Win+1, p.kind == pushPrev && win == p.Win+1:
			// The pushed window is the previous one now.
			s.prevInflight -= p.Delta
			c.prev.Store(totals[k] + s.prevPending + s.prevInflight)
			if t.rules[p.Rule].kind == Buckets {
				t.histSet(e, p.Rule, p.Win, c.prev.Load())
			}
		default:
			// A window older than the previous one: delivered.
			t.fly(e, p.Rule, -p.Delta)
			if p.Reads() && t.rules[p.Rule].kind == Buckets {
				// A closed bucket still in the window, which the counter
				// rolled away from while the read was on its way: no
				// later take reads it, so what the store read counts.
				t.settleOld(e, p.Rule, p.Win, totals[k])
			}
		}
	}
	if t.share && t.shareOf(e, 0) != nil {
		t.settleShares(e, now, pushes, totals)
	}
}

// settleShares feeds every rule's sync to the share policy. Call with
// e's mutex held.
func (t *Table) settleShares(e *Entry, now int64, pushes []Push, totals []int64) {
	for k := range pushes {
		p := &pushes[k]
		if p.kind != pushCur || e.ctr(p.Rule).win.Load() != p.Win {
			continue // a rule rolled over since the take: its next sync counts
		}
		var prev, ownPrev int64
		prevRead := false
		ownSpan, first := p.Delta, p.Win-t.rules[p.Rule].span+1
		for j := k + 1; j < len(pushes) && pushes[j].Rule == p.Rule; j++ {
			q := &pushes[j]
			if q.kind == pushPrev {
				prev, ownPrev, prevRead = totals[j], q.Delta, true
			}
			if q.Win >= first && q.Win < p.Win {
				ownSpan += q.Delta // a Buckets rule's closed bucket in its window
			}
		}
		t.settleShare(e, p.Rule, now, p.Win, totals[k], prev, prevRead, p.Delta, ownPrev, ownSpan)
	}
}

// histSet sets the closed bucket id of rule i to n. Call with e's mutex held.
func (t *Table) histSet(e *Entry, i int, id, n int64) {
	s := &t.xOf(e).Load().hist[t.histOff[i]+t.rules[i].bucketSlot(id)]
	sum := t.closedSum(e, i)
	if old := s.id.Load(); t.inWindow(e, i, old) {
		sum.Add(-s.n.Load())
	}
	s.id.Store(id)
	s.n.Store(n)
	if t.inWindow(e, i, id) {
		sum.Add(n)
	}
}

// Release hands back to e the increments of pushes that the store did not
// apply, to be pushed by a later take.
func (t *Table) Release(e *Entry, pushes []Push) {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	dropped := int64(0)
	for k := range pushes {
		p := &pushes[k]
		c, s := e.ctr(p.Rule), t.sync(e, p.Rule)
		win := c.win.Load()
		switch {
		case p.kind == pushOld:
			t.ext(e).oldReads |= oldAll << p.Rule // the read failed: the next take reads again
		case p.kind == pushCur && win == p.Win:
			s.inflight -= p.Delta
			s.adj += p.Delta
		case p.kind == pushCur && win == p.Win+1, p.kind == pushPrev && win == p.Win+1:
			s.prevInflight -= p.Delta
			s.prevPending += p.Delta
			if p.kind == pushPrev {
				e.prevReads |= readFirst << p.Rule // the read failed: the next take reads again
			}
		default:
			t.fly(e, p.Rule, -p.Delta)
			dropped += t.stash(e, p.Rule, p.Win, p.Delta)
			if p.Reads() && t.rules[p.Rule].kind == Buckets && t.inWindow(e, p.Rule, p.Win) {
				// A closed bucket that no later take reads as the previous
				// one: the next take reads it with all the older ones (the
				// counter may have rolled past several buckets since, and
				// the newest one it holds tells nothing of this one).
				t.ext(e).oldReads |= oldAll << p.Rule
			}
		}
	}
	t.addDropped(dropped)
}

// Close makes every later decision return Closed. Decisions under way
// that counted a request before the final flush took it are pushed by the
// flush; those that count after it take their increments back (they wait
// for FlushDone).
func (t *Table) Close() { t.closed.Store(true) }

// TakeFinal is the final flush's take: it takes an entry's pending
// increments like Take and seals the entry, so that no rollover changes it
// afterwards. Call it after Close, for every entry and then for every
// entry touched since (what a failed push handed back, and entries that
// decisions racing with Close created or touched), until nothing is left;
// then FlushDone. A decision that committed after Close learns at
// FlushDone whether a take moved its increment (it was pushed: admitted)
// or not (taken back: Closed), so the flush and the decisions agree
// whichever take comes last. It sends no reads (pushes of zero): a closing
// table has no use for the store's totals.
func (t *Table) TakeFinal(e *Entry, now int64, dst []Push) []Push {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	from := len(dst)
	dst, _ = t.takeLocked(e, now, dst)
	e.set(flagSealed, true)
	kept := dst[:from]
	for _, p := range dst[from:] {
		if p.Delta != 0 {
			kept = append(kept, p)
		}
	}
	return kept
}

// Entries appends every entry of the table to dst.
func (t *Table) Entries(dst []*Entry) []*Entry {
	t.rangeEntries(func(e *Entry) bool {
		dst = append(dst, e)
		return true
	})
	return dst
}

// FlushDone reports the end of the final flush: decisions that counted a
// request after Close and waited for it now learn whether it was taken.
func (t *Table) FlushDone() { t.flushOnce.Do(func() { close(t.flushed) }) }

// Observe records the store's counts of key after a decision made in the
// store (the synchronous mode): counts[i] are rule i's totals at now, for
// the windows holding now. The local view then serves State and the
// decisions made while the store fails. The decision is counted in the
// table's statistics when record is set. Observe does nothing for an
// untracked key when the table is full, and then reports false (the
// caller counts the decision).
func (t *Table) Observe(key string, now int64, counts []Counts, allowed, record bool) bool {
	e := t.loadOrCreate(t.hash(key), key, now)
	if e == nil {
		return false
	}
	t.mu(e).Lock()
	if !e.has(flagSealed) {
		for i := range t.rules {
			t.observeLocked(e, i, now, &counts[i])
		}
	}
	t.mu(e).Unlock()
	if record {
		e.seen(now)
		if allowed {
			t.count(e).allowed.Add(1)
		} else {
			t.count(e).denied.Add(1)
		}
	}
	return true
}

// observeLocked records the store's counts c of rule i at now. Call with
// e's mutex held.
func (t *Table) observeLocked(e *Entry, i int, now int64, c *Counts) {
	r, ct := &t.rules[i], e.ctr(i)
	var s *syncState
	if t.syncing {
		s = t.sync(e, i)
	}
	switch r.kind {
	case Log:
		if s != nil {
			x := t.extend(e)
			if x.obs == nil {
				x.obs = make([]observed, len(t.rules))
			}
			x.obs[i] = observed{*c, now}
		}
		return
	case GCRA, Leaky:
		ct.prev.Store(now + min(max(c.Tat, -now), MaxAhead))
		if s != nil {
			ct.base.Store(s.inflight + s.adj)
		}
		return
	}
	id, _ := WindowOf(now, r.w)
	t.rollLocked(e, i, id, now)
	if ct.win.Load() != id {
		return
	}
	var cur, prev int64
	if r.kind == Buckets {
		b := c.Buckets
		cur = b[len(b)-1]
		for k := range len(b) - 1 {
			t.histSet(e, i, id-int64(len(b))+1+int64(k), b[k])
		}
		if len(b) > 1 {
			prev = b[len(b)-2]
		}
	} else {
		cur, prev = c.Cur, c.Prev
	}
	if s != nil {
		cur += s.inflight + s.adj
		prev += s.prevPending + s.prevInflight
	}
	ct.base.Store(cur)
	ct.prev.Store(prev)
}

// Unsynced returns the increments e holds that the store has not
// acknowledged.
func (t *Table) Unsynced(e *Entry) int64 {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	n := int64(0)
	for i := range t.rules {
		n += word(e.ctr(i).word.Load()).count()
		if t.syncing {
			n += t.unsynced(e, i)
		}
	}
	return n
}

// LastSeen returns the instant (ns) of the entry's last decision.
func (e *Entry) LastSeen() int64 { return e.lastSeen.Load() }
