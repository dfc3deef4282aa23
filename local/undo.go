package local

// Taking a decision back: a refused request's reservations, CountDenied's
// charges, and a commit that the table's closing overtook.

// refuse finishes a decision that rule denied after rules [0, denied)
// counted it: it takes those back, or with CountDenied charges the others
// too.
func (t *Table) refuse(e *Entry, denied int, res *reserved, n, now int64) {
	if t.countDenied {
		for i := range t.rules {
			switch {
			case i < res.upto && t.rules[i].kind != Log:
				// already counted
			case t.rules[i].kind == Log:
				if !res.log && i == t.firstLog() {
					t.logCharge(e, n, now)
				}
			default:
				t.charge(e, i, n, now)
			}
		}
	} else {
		t.undoAll(e, res, n, now)
	}
	e.seen(now)
	t.count(e).denied.Add(1)
	if t.syncing {
		// A node that only denies still needs the cluster's counts of the
		// key, to learn when others' admissions slide out.
		t.touch(e)
	}
}

func (t *Table) firstLog() int {
	for i := range t.rules {
		if t.rules[i].kind == Log {
			return i
		}
	}
	return -1
}

// logCharge logs n at now unconditionally (CountDenied).
func (t *Table) logCharge(e *Entry, n, now int64) {
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	x := t.extend(e)
	if x.log == nil {
		x.log = newLogRing(t.logCap)
	}
	x.log.prune(now - t.longestLog())
	x.log.push(now, n)
}

// charge adds n to rule i of e unconditionally (CountDenied).
func (t *Table) charge(e *Entry, i int, n, now int64) {
	r, c := &t.rules[i], e.ctr(i)
	if (r.kind == GCRA || r.kind == Leaky) && !t.syncing {
		for {
			tat := c.base.Load()
			if c.base.CompareAndSwap(tat, r.chargedTat(tat, n, now)) {
				return
			}
		}
	}
	id := int64(0)
	if r.counted() {
		id, _ = WindowOf(now, r.w)
	}
	for {
		w := word(c.word.Load())
		switch {
		case w.rolling():
			t.waitRoll(e)
		case r.counted() && c.win.Load() < id:
			if !t.roll(e, i, id, now) {
				return
			}
		case c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))):
			return
		}
	}
}

// undoAll takes back what res counted.
func (t *Table) undoAll(e *Entry, res *reserved, n, now int64) {
	for i := range res.upto {
		switch {
		case t.rules[i].kind == Log:
		case res.tats[i]:
			e.ctr(i).base.Add(-n * t.rules[i].t)
		default:
			t.undo(e, i, res.words[i], res.wins[i], n)
		}
	}
	if res.log {
		t.mu(e).Lock()
		t.xOf(e).Load().log.remove(now, n)
		t.mu(e).Unlock()
	}
}

// undo takes back n that a decision counted on rule i of e, committing the
// pending word as w in window win. It is exact whatever happened since: if
// the word's generation is unchanged the increment is still pending and is
// subtracted there; otherwise a take or a rollover moved it, and it is
// taken back where it went.
func (t *Table) undo(e *Entry, i int, w word, win, n int64) {
	c := e.ctr(i)
	for {
		cur := word(c.word.Load())
		if cur.rolling() {
			t.waitRoll(e)
			continue
		}
		if cur.gen() != w.gen() {
			break
		}
		if c.word.CompareAndSwap(uint64(cur), uint64(cur-word(min(n, cur.count())))) {
			return
		}
	}
	t.mu(e).Lock()
	defer t.mu(e).Unlock()
	switch c.win.Load() {
	case win: // taken by the sync loop (only it moves the word in a window): push −n next
		if t.syncing {
			t.sync(e, i).adj -= n
			c.base.Add(-n)
		}
	case win + 1: // rolled over: the increment now counts in the previous window
		c.prev.Add(-n)
		if t.rules[i].kind == Buckets {
			t.histAdd(e, i, win, -n)
		}
		if t.syncing {
			t.sync(e, i).prevPending -= n
		}
	default: // rolled over twice or more: the increment is stale, or pushed
		if t.rules[i].kind == Buckets {
			t.histAdd(e, i, win, -n)
		}
		if t.syncing {
			t.stash(e, i, win, -n)
		}
	}
	if t.syncing {
		// The sync loop must push the adjustment even when no decision
		// queues e again: e may be evicted, its decisions retrying on a
		// fresh entry.
		t.touch(e)
	}
}

// closedAfterCommit handles a decision that committed its increments and
// then found the table closed: it reports true, with the increments taken
// back, when the final flush did not take them (they would never reach the
// store), and false when they were taken and are pushed by the flush. It
// waits for the final flush to end.
func (t *Table) closedAfterCommit(e *Entry, res *reserved, n, now int64) bool {
	<-t.flushed
	t.mu(e).Lock()
	if e.has(flagSealed) {
		// The final take took every counter at once and no rollover can
		// follow it: either every generation moved or none did.
		for i := range t.rules {
			if t.rules[i].kind == Log {
				continue
			}
			if word(e.ctr(i).word.Load()).gen() != res.words[i].gen() {
				t.mu(e).Unlock()
				return false
			}
			break
		}
	}
	t.mu(e).Unlock()
	t.undoAll(e, res, n, now)
	return true
}
