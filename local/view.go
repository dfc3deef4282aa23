package local

import "math"

// maxBuckets is the most buckets a Buckets rule has.
const maxBuckets = 64

// decide1 is decide for a table of one Sliding or Fixed rule: the same
// steps, with no bookkeeping of other rules.
func (t *Table) decide1(e *Entry, n, now int64) (Decision, outcome) {
	r, c := &t.rules[0], &e.c0
	for {
		w := word(c.word.Load())
		if w.rolling() {
			t.waitRoll(e)
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
				rem = min(rem, shareLeft(room-float64(n)))
			}
		}
		if !ok {
			var res reserved
			t.refuse(e, 0, &res, n, now)
			return Decision{}, refused
		}
		nw := w.plus(n)
		if !c.word.CompareAndSwap(uint64(w), uint64(nw)) {
			continue
		}
		e.seen(now) // before the dead check: see Table.tryEvict
		if e.has(flagDead) || (t.syncing && t.closed.Load()) {
			res := reserved{upto: 1}
			res.words[0], res.wins[0] = nw, win
			if o := t.committed(e, &res, n, now); o != admitted {
				return Decision{}, o
			}
		}
		t.count(e).allowed.Add(1)
		if t.syncing {
			t.touch(e)
		}
		return Decision{Allowed: true, Rule: 0, Remaining: rem, ResetAfter: r.resetAfter(prev, cur+n, el)}, admitted
	}
}

// committed finishes a decision that committed what res holds and then
// found e dead or the table closed: it takes the increments back and
// reports retry or closed, or reports admitted when the final flush took
// them. An eviction may have cleared e's mark since (it saw an increment
// and kept e): the decision then stands, unless the table is closed.
func (t *Table) committed(e *Entry, res *reserved, n, now int64) outcome {
	if e.has(flagDead) {
		t.undoAll(e, res, n, now)
		return retry
	}
	if t.syncing && t.closed.Load() && t.closedAfterCommit(e, res, n, now) {
		return closed
	}
	return admitted
}

// denied describes a denied request of cost n on e at now: the reported
// rule is the one that needs the longest wait.
func (t *Table) denied(e *Entry, n, now int64) Decision {
	var v [MaxRules]Counts
	t.views(e, now, n, v[:len(t.rules)])
	d := Summarize(t.rules, v[:len(t.rules)], n, false, 1)
	if !t.share {
		return d
	}
	// The share policy may deny what the plain rule admits: its wait wins
	// when it is longer.
	var rooms [MaxRules]float64
	var shared [MaxRules]bool
	for i := range t.rules {
		r, c := &t.rules[i], &v[i]
		if r.kind == Buckets {
			id, el := WindowOf(now, r.w)
			room, applies := t.bucketShareRoomOf(e, i, c.Buckets, id, el)
			rooms[i], shared[i] = room, applies
			if applies && float64(n) > room+Epsilon {
				// Room grows as buckets leave: at the next boundary at the
				// earliest.
				if retry := max(r.w-el, 1000); retry > d.RetryAfter {
					d.Rule, d.RetryAfter = i, retry
					_, d.ResetAfter = r.bucketLevel(c.Buckets, c.Elapsed) // the plain rule's, as for the other kinds
				}
			}
			continue
		}
		if !r.counted() {
			continue
		}
		id, _ := WindowOf(now, r.w)
		sv, room, applies := t.shareRoomOf(e, i, c.Prev, c.Cur, id, c.Elapsed)
		if !applies {
			continue
		}
		rooms[i], shared[i] = room, true
		if retry := r.shareRetry(sv, room, c.Prev, c.Elapsed, n); retry > d.RetryAfter {
			d.Rule, d.RetryAfter = i, retry
			d.ResetAfter = r.resetAfter(c.Prev, c.Cur, c.Elapsed)
		}
	}
	if i := d.Rule; i >= 0 && shared[i] {
		// What the rule admits: the plain rule's Remaining, at most its
		// share's room, as State reports it.
		rem, _ := t.rules[i].Level(v[i])
		d.Remaining = min(rem, shareLeft(rooms[i]))
	}
	return d
}

// views fills dst with every rule's counts of e at now, without changing
// them, as if rolled over, for a request of cost n.
func (t *Table) views(e *Entry, now, n int64, dst []Counts) {
	for i := range t.rules {
		dst[i] = t.view(e, i, now, n)
	}
}

// view reads rule i of e at now without changing it, as if rolled over,
// for a request of cost n.
func (t *Table) view(e *Entry, i int, now, n int64) Counts {
	r, c := &t.rules[i], e.ctr(i)
	switch r.kind {
	case Log:
		t.mu(e).Lock()
		defer t.mu(e).Unlock()
		x := t.ext(e)
		if x != nil && x.obs != nil && x.obs[i].at != 0 {
			// The synchronous mode: the store keeps the log; what its last
			// decision saw, aged.
			o, age := x.obs[i].c, now-x.obs[i].at
			o.Expire, o.Reset = max(o.Expire-age, 0), max(o.Reset-age, 0)
			if o.Reset == 0 {
				o.Cur = 0
			}
			return o
		}
		if x == nil || x.log == nil {
			return Counts{}
		}
		return x.log.counts(r, now, n)
	case GCRA, Leaky:
		if !t.syncing {
			return Counts{Tat: c.base.Load() - now}
		}
		w := word(c.word.Load())
		return Counts{Tat: r.syncedAhead(c.prev.Load(), c.base.Load()+w.count(), now)}
	}
	id, el := WindowOf(now, r.w)
	w := word(c.word.Load())
	win := c.win.Load()
	cur := c.base.Load() + w.count()
	if r.kind == Buckets {
		b := make([]int64, r.span)
		if win > id {
			win, el = id, 0
		}
		if win == id {
			return Counts{Buckets: t.bucketCounts(e, i, win, cur, b), Elapsed: el}
		}
		// Rolled over since: the buckets still in the window, the current
		// one empty.
		full := t.bucketCounts(e, i, win, cur, make([]int64, r.span))
		for k := range r.span {
			if src := k + (id - win); src < r.span {
				b[k] = full[src]
			}
		}
		b[r.span-1] = 0
		if id-win < r.span {
			b[r.span-1-(id-win)] = cur
		}
		return Counts{Buckets: b, Elapsed: el}
	}
	prev := c.prev.Load()
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
// request. Under the share policy it decides as Allow does, share
// included (admission, Remaining and RetryAfter). It creates no entry.
func (t *Table) Peek(key string, n, now int64) Decision {
	var v [MaxRules]Counts
	e := t.viewEntry(key, now, n, v[:len(t.rules)])
	allowed := true
	for i := range t.rules {
		allowed = allowed && t.rules[i].Admits(v[i], n)
	}
	if t.share && e != nil {
		if !allowed {
			return t.denied(e, n, now) // the share's wait when longer
		}
		return t.peekShare(e, v[:len(t.rules)], n, now)
	}
	if !allowed {
		return Summarize(t.rules, v[:len(t.rules)], n, false, 1)
	}
	// Remaining before the request: describe it with a zero cost.
	return Summarize(t.rules, v[:len(t.rules)], 0, true, 1)
}

// peekShare is Peek's answer under the share policy for a request of cost
// n that every rule admits at counts v of e: denied, as Allow denies it,
// when some rule's share has no room for it, else admitted with each
// rule's Remaining at most what its share still admits, the tightest
// described as decide's fold does.
func (t *Table) peekShare(e *Entry, v []Counts, n, now int64) Decision {
	d := Decision{Allowed: true, Rule: -1, Remaining: math.MaxInt64}
	for i := range t.rules {
		rem, _, reset, delay := t.rules[i].describe(&v[i], 0, true, 1)
		if room, applies := t.shareRoomAt(e, i, &v[i], now); applies {
			if float64(n) > room+Epsilon {
				return t.denied(e, n, now)
			}
			rem = min(rem, shareLeft(room))
		}
		d.Delay = max(d.Delay, delay)
		if rem < d.Remaining {
			d.Rule, d.Remaining, d.ResetAfter = i, rem, reset
		}
	}
	return d
}

// shareRoomAt returns the share policy's room for rule i of e at counts c
// (read at now), and whether the policy applies to the rule: only Sliding,
// Fixed and Buckets rules have shares.
func (t *Table) shareRoomAt(e *Entry, i int, c *Counts, now int64) (float64, bool) {
	r := &t.rules[i]
	if !r.counted() {
		return 0, false
	}
	id, el := WindowOf(now, r.w)
	if r.kind == Buckets {
		return t.bucketShareRoomOf(e, i, c.Buckets, id, el)
	}
	_, room, applies := t.shareRoomOf(e, i, c.Prev, c.Cur, id, c.Elapsed)
	return room, applies
}

// Level is one rule's state for a key at an instant.
type Level struct {
	// Remaining is the cost the rule still admits.
	Remaining int64
	// ResetAfter is how long until the rule's counts are back to zero
	// (ns), if nothing is admitted meanwhile.
	ResetAfter int64
}

// Levels fills dst (one element per rule) with key's level of each rule
// at now, as this node sees it. Under the share policy a rule's Remaining
// is at most what its share still admits, as Peek and Allow decide: the
// least Remaining of the rules is the largest cost Peek admits at now.
// ResetAfter is the plain rule's, as Allow and Peek report it. It creates
// no entry.
func (t *Table) Levels(key string, now int64, dst []Level) {
	var v [MaxRules]Counts
	e := t.viewEntry(key, now, 1, v[:len(t.rules)])
	for i := range t.rules {
		rem, reset := t.rules[i].Level(v[i])
		if t.share && e != nil {
			if room, applies := t.shareRoomAt(e, i, &v[i], now); applies {
				rem = min(rem, shareLeft(room))
			}
		}
		dst[i] = Level{Remaining: rem, ResetAfter: reset}
	}
}

// Tracked reports whether the table holds key.
func (t *Table) Tracked(key string) bool { return t.load(t.hash(key), key) != nil }

// View fills dst (one element per rule) with key's counts at now as this
// node sees them, for a request of cost n, and reports whether the key is
// tracked (untracked keys read as empty).
func (t *Table) View(key string, now, n int64, dst []Counts) bool {
	return t.viewEntry(key, now, n, dst) != nil
}

// viewEntry is View, returning key's entry, or nil when the table does not
// hold key.
func (t *Table) viewEntry(key string, now, n int64, dst []Counts) *Entry {
	e := t.load(t.hash(key), key)
	if e != nil {
		t.views(e, now, n, dst)
	} else {
		t.empty(now, dst)
	}
	return e
}

// empty fills dst (one element per rule) with the counts of a key the
// table does not hold, at now.
func (t *Table) empty(now int64, dst []Counts) {
	for i := range t.rules {
		r := &t.rules[i]
		switch r.kind {
		case Buckets:
			_, el := WindowOf(now, r.w)
			dst[i] = Counts{Buckets: make([]int64, r.span), Elapsed: el}
		case GCRA, Leaky:
			dst[i] = Counts{Tat: math.MinInt64 / 2}
		case Log:
			dst[i] = Counts{}
		default:
			_, el := WindowOf(now, r.w)
			dst[i] = Counts{Elapsed: el}
		}
	}
}
