package local

import "math"

// Status says how a decision ended, besides its Decision.
type Status uint8

const (
	// Decided: the Decision holds the outcome (and, when admitted, the
	// request was counted).
	Decided Status = iota
	// Full: the key is not tracked and the table holds MaxKeys entries;
	// nothing was decided or counted.
	Full
	// Closed: the table was closed; nothing was counted.
	Closed
)

// outcome is how decide ended.
type outcome uint8

const (
	admitted outcome = iota // counted on every rule
	refused                 // a rule denies it; nothing is left reserved (unless CountDenied)
	retry                   // the entry was evicted under the decision
	closed                  // the table was closed and nothing was counted
)

// Allow decides a request of cost n (1 to the smallest limit) for key at
// now and, when every rule admits it, counts it on every rule. It takes no
// lock, except for a rollover, once per key and rule per window.
func (t *Table) Allow(key string, n, now int64) (Decision, Status) {
	if t.closed.Load() {
		return Decision{}, Closed
	}
	k := t.hash(key)
	for {
		e := t.loadOrCreate(k, now)
		if e == nil {
			if t.closed.Load() {
				return Decision{}, Closed
			}
			return Decision{}, Full
		}
		var d Decision
		var o outcome
		if len(t.rules) == 1 {
			d, o = t.decide1(e, n, now)
		} else {
			d, o = t.decide(e, n, now)
		}
		switch o {
		case admitted:
			return d, Decided
		case refused:
			return t.denied(e, n, now), Decided
		case closed:
			return Decision{}, Closed
		}
	}
}

// decide decides a request of cost n on e at now. When it admits, the
// decision describes the tightest rule.
func (t *Table) decide(e *Entry, n, now int64) (Decision, outcome) {
	var words [MaxRules]word // the words each rule's increment was committed as
	var wins [MaxRules]int64 // and the windows it was committed to
	d := Decision{Allowed: true, Rule: -1, Remaining: math.MaxInt64}
	for i := range t.rules {
		r, c := &t.rules[i], &e.c[i]
		for {
			w := word(c.word.Load())
			if w.rolling() {
				e.waitRoll()
				continue
			}
			win := c.win.Load()
			// Most decisions fall in the counter's window: no division.
			el := now - win*r.w
			if el < 0 || el >= r.w {
				id, _ := WindowOf(now, r.w)
				if win < id {
					if !t.roll(e, i, id, now) {
						t.undoAll(e, &words, &wins, i, n)
						return Decision{}, closed
					}
					continue
				}
				el = 0 // another decision already moved on: its window has begun
			}
			prev, cur := c.prev.Load(), c.base.Load()+w.count()
			est := r.estimate(prev, cur, el)
			rem := r.remaining(est + float64(n))
			ok := r.admits(est, n)
			if ok && t.share {
				if _, room, applies := t.shareRoomOf(e, i, prev, cur, win, el); applies {
					ok = float64(n) <= room+Epsilon
					rem = min(rem, int64(max(room-float64(n), 0)))
				}
			}
			if !ok {
				t.refuse(e, i, &words, &wins, n, now)
				return Decision{}, refused
			}
			nw := w.plus(n)
			if c.word.CompareAndSwap(uint64(w), uint64(nw)) {
				words[i], wins[i] = nw, win
				if rem < d.Remaining {
					d.Rule, d.Remaining = i, rem
					d.ResetAfter = r.resetAfter(prev, cur+n, el)
				}
				break
			}
		}
	}
	if e.has(flagDead) {
		t.undoAll(e, &words, &wins, len(t.rules), n)
		return Decision{}, retry
	}
	if t.syncing && t.closed.Load() && t.closedAfterCommit(e, &words, &wins, n) {
		return Decision{}, closed
	}
	e.seen(now)
	e.allowed.Add(1)
	if t.syncing {
		t.touch(e)
	}
	return d, admitted
}

// decide1 is decide for a table of one rule: the same steps, with no
// bookkeeping of earlier rules to take back.
func (t *Table) decide1(e *Entry, n, now int64) (Decision, outcome) {
	r, c := &t.rules[0], &e.c[0]
	for {
		w := word(c.word.Load())
		if w.rolling() {
			e.waitRoll()
			continue
		}
		win := c.win.Load()
		el := now - win*r.w
		if el < 0 || el >= r.w {
			id, _ := WindowOf(now, r.w)
			if win < id {
				if !t.roll(e, 0, id, now) {
					return Decision{}, closed
				}
				continue
			}
			el = 0
		}
		prev, cur := c.prev.Load(), c.base.Load()+w.count()
		est := r.estimate(prev, cur, el)
		rem := r.remaining(est + float64(n))
		ok := r.admits(est, n)
		if ok && t.share {
			if _, room, applies := t.shareRoomOf(e, 0, prev, cur, win, el); applies {
				ok = float64(n) <= room+Epsilon
				rem = min(rem, int64(max(room-float64(n), 0)))
			}
		}
		if !ok {
			var words [MaxRules]word
			var wins [MaxRules]int64
			t.refuse(e, 0, &words, &wins, n, now)
			return Decision{}, refused
		}
		nw := w.plus(n)
		if !c.word.CompareAndSwap(uint64(w), uint64(nw)) {
			continue
		}
		if e.has(flagDead) || (t.syncing && t.closed.Load()) {
			words, wins := [MaxRules]word{nw}, [MaxRules]int64{win}
			if e.has(flagDead) {
				t.undoAll(e, &words, &wins, 1, n)
				return Decision{}, retry
			}
			if t.closedAfterCommit(e, &words, &wins, n) {
				return Decision{}, closed
			}
		}
		e.seen(now)
		e.allowed.Add(1)
		if t.syncing {
			t.touch(e)
		}
		return Decision{Allowed: true, Rule: 0, Remaining: rem, ResetAfter: r.resetAfter(prev, cur+n, el)}, admitted
	}
}

// refuse finishes a decision that rule denied after rules [0, denied)
// counted it: it takes those back, or with CountDenied charges the
// remaining rules too.
func (t *Table) refuse(e *Entry, denied int, words *[MaxRules]word, wins *[MaxRules]int64, n, now int64) {
	if t.countDenied {
		for i := denied; i < len(t.rules); i++ {
			t.charge(e, i, n, now)
		}
	} else {
		t.undoAll(e, words, wins, denied, n)
	}
	e.seen(now)
	e.denied.Add(1)
	if t.syncing {
		// A node that only denies still needs the cluster's counts of the
		// key, to learn when others' admissions slide out.
		t.touch(e)
	}
}

// charge adds n to rule i of e unconditionally (CountDenied).
func (t *Table) charge(e *Entry, i int, n, now int64) {
	r, c := &t.rules[i], &e.c[i]
	id, _ := WindowOf(now, r.w)
	for {
		w := word(c.word.Load())
		switch {
		case w.rolling():
			e.waitRoll()
		case c.win.Load() < id:
			if !t.roll(e, i, id, now) {
				return
			}
		case c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))):
			return
		}
	}
}

// undoAll takes back the n that rules [0, upto) counted.
func (t *Table) undoAll(e *Entry, words *[MaxRules]word, wins *[MaxRules]int64, upto int, n int64) {
	for i := range upto {
		t.undo(e, i, words[i], wins[i], n)
	}
}

// undo takes back n that a decision counted on rule i of e, committing the
// pending word as w in window win. It is exact whatever happened since: if
// the word's generation is unchanged the increment is still pending and is
// subtracted there; otherwise a take or a rollover moved it, and it is
// taken back where it went.
func (t *Table) undo(e *Entry, i int, w word, win, n int64) {
	c := &e.c[i]
	for {
		cur := word(c.word.Load())
		if cur.rolling() {
			e.waitRoll()
			continue
		}
		if cur.gen() != w.gen() {
			break
		}
		if c.word.CompareAndSwap(uint64(cur), uint64(cur-word(min(n, cur.count())))) {
			return
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch c.win.Load() {
	case win: // taken by the sync loop (only it moves the word in a window): push −n next
		if t.syncing {
			e.s[i].adj -= n
			c.base.Add(-n)
		}
	case win + 1: // rolled over: the increment now counts in the previous window
		c.prev.Add(-n)
		if t.syncing {
			e.s[i].prevPending -= n
		}
	}
}

// roll moves rule i of e to window id if it is behind it, and reports
// false, changing nothing, if e was sealed by the final flush.
func (t *Table) roll(e *Entry, i int, id, now int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.has(flagSealed) {
		return false
	}
	t.rollLocked(e, i, id, now)
	return true
}

// rollLocked moves rule i of e to window id if it is behind. Call with
// e.mu held.
func (t *Table) rollLocked(e *Entry, i int, id, now int64) {
	c := &e.c[i]
	old := c.win.Load()
	if old >= id {
		return
	}
	w := freeze(c)
	p := w.count()
	if id == old+1 {
		c.prev.Store(c.base.Load() + p)
	} else {
		c.prev.Store(0)
	}
	if t.syncing {
		s := &e.s[i]
		// What this node still owes the window that stops being the
		// previous one is pushed later, as stale.
		dropped := s.stash(old-1, s.prevPending)
		if id == old+1 {
			s.prevPending, s.prevInflight = p+s.adj, s.inflight
			s.prevReadUntil = now + t.readPrev
		} else {
			dropped += s.stash(old, p+s.adj)
			s.prevPending, s.prevInflight, s.prevReadUntil = 0, 0, 0
		}
		s.inflight, s.adj = 0, 0
		t.addDropped(dropped)
	}
	c.base.Store(0)
	c.win.Store(id)
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

// closedAfterCommit handles a decision that committed its increments and
// then found the table closed: it reports true, with the increments taken
// back, when the final flush did not take them (they would never reach the
// store), and false when they were taken and are pushed by the flush. It
// waits for the final flush to end.
func (t *Table) closedAfterCommit(e *Entry, words *[MaxRules]word, wins *[MaxRules]int64, n int64) bool {
	<-t.flushed
	e.mu.Lock()
	if e.has(flagSealed) {
		// The final take took every rule at once and no rollover can
		// follow it: either every generation moved or none did.
		moved := word(e.c[0].word.Load()).gen() != words[0].gen()
		if moved {
			e.mu.Unlock()
			return false
		}
	}
	e.mu.Unlock()
	t.undoAll(e, words, wins, len(t.rules), n)
	return true
}

// denied describes a denied request of cost n on e at now: the reported
// rule is the one that needs the longest wait.
func (t *Table) denied(e *Entry, n, now int64) Decision {
	var v [MaxRules]Counts
	for i := range t.rules {
		v[i] = t.view(e, i, now)
	}
	d := Summarize(t.rules, v[:len(t.rules)], n, false, 1)
	if !t.share {
		return d
	}
	// The share policy may deny what the plain rule admits: its wait wins
	// when it is longer.
	for i := range t.rules {
		r, c := &t.rules[i], &v[i]
		id, _ := WindowOf(now, r.w)
		sv, room, applies := t.shareRoomOf(e, i, c.Prev, c.Cur, id, c.Elapsed)
		if !applies {
			continue
		}
		if retry := r.shareRetry(sv, room, c.Prev, c.Elapsed, n); retry > d.RetryAfter {
			d.Rule, d.RetryAfter, d.Remaining = i, retry, int64(max(room, 0))
			d.ResetAfter = r.resetAfter(c.Prev, c.Cur, c.Elapsed)
		}
	}
	return d
}

// view reads rule i of e at now without changing it, as if rolled over.
func (t *Table) view(e *Entry, i int, now int64) Counts {
	r, c := &t.rules[i], &e.c[i]
	id, el := WindowOf(now, r.w)
	w := word(c.word.Load())
	win := c.win.Load()
	prev, cur := c.prev.Load(), c.base.Load()+w.count()
	switch {
	case win == id-1:
		prev, cur = cur, 0
	case win < id-1:
		prev, cur = 0, 0
	case win > id:
		el = 0
	}
	return Counts{Prev: prev, Cur: cur, Elapsed: el}
}

// Peek reports whether a request of cost n for key would be admitted at
// now, without counting anything; Remaining is what is left before the
// request. It creates no entry.
func (t *Table) Peek(key string, n, now int64) Decision {
	var v [MaxRules]Counts
	t.View(key, now, v[:len(t.rules)])
	allowed := true
	for i := range t.rules {
		r := &t.rules[i]
		allowed = allowed && r.Admits(v[i].Prev, v[i].Cur, v[i].Elapsed, n)
	}
	if allowed {
		// Remaining before the request: describe it with a zero cost.
		return Summarize(t.rules, v[:len(t.rules)], 0, true, 1)
	}
	return Summarize(t.rules, v[:len(t.rules)], n, false, 1)
}

// View fills dst (one element per rule) with key's counts at now as this
// node sees them, and reports whether the key is tracked (untracked keys
// read as empty).
func (t *Table) View(key string, now int64, dst []Counts) bool {
	e, ok := t.load(t.hash(key))
	for i := range t.rules {
		if ok {
			dst[i] = t.view(e, i, now)
		} else {
			_, el := WindowOf(now, t.rules[i].w)
			dst[i] = Counts{Elapsed: el}
		}
	}
	return ok
}
