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
// lock, except for a rollover (once per key and rule per window) and for
// Log rules.
func (t *Table) Allow(key string, n, now int64) (Decision, Status) {
	return t.allow(t.hash(key), key, n, now)
}

// allow is Allow for any table and case.
func (t *Table) allow(h uint64, key string, n, now int64) (Decision, Status) {
	if t.closed.Load() {
		return Decision{}, Closed
	}
	for {
		e := t.loadOrCreate(h, key, now)
		if e == nil {
			if t.closed.Load() {
				return Decision{}, Closed
			}
			return Decision{}, Full
		}
		var d Decision
		var o outcome
		if t.simple {
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

// reserved records what a decision counted, to take it back: per rule the
// pending word its increment was committed as and its window, or that it
// moved a local token bucket's arrival time; and whether it logged.
type reserved struct {
	words [MaxRules]word
	wins  [MaxRules]int64
	tats  [MaxRules]bool
	upto  int // rules [0, upto) counted
	log   bool
}

// decide decides a request of cost n on e at now, for any rules. When it
// admits, the decision describes the tightest rule.
func (t *Table) decide(e *Entry, n, now int64) (Decision, outcome) {
	var res reserved
	var buf [maxBuckets]int64
	d := Decision{Allowed: true, Rule: -1, Remaining: math.MaxInt64}
	for i := range t.rules {
		r := &t.rules[i]
		res.upto = i
		var c Counts
		var o outcome
		shareRem := int64(-1)
		switch {
		case r.kind == Log:
			continue // after the others, under the entry's mutex
		case (r.kind == GCRA || r.kind == Leaky) && !t.syncing:
			c, o = t.reserveTat(e, i, n, now)
			res.tats[i] = o == admitted
		default:
			c, o, shareRem = t.reserveWord(e, i, n, now, &res, buf[:])
		}
		if o != admitted {
			if o == refused {
				t.refuse(e, i, &res, n, now)
			} else {
				t.undoAll(e, &res, n, now)
			}
			return Decision{}, o
		}
		d.fold(r, i, &c, n, shareRem)
	}
	res.upto = len(t.rules)
	if t.logs {
		t.mu(e).Lock()
		i, ok := t.logAdmits(e, n, now, &d)
		if ok {
			x := t.extend(e)
			if x.log == nil {
				x.log = newLogRing(t.logCap)
			}
			x.log.prune(now - t.longestLog())
			x.log.push(now, n)
			res.log = true
		}
		t.mu(e).Unlock()
		if !ok {
			t.refuse(e, i, &res, n, now)
			return Decision{}, refused
		}
	}
	e.seen(now) // before the dead check: see Table.tryEvict
	if e.has(flagDead) {
		t.undoAll(e, &res, n, now)
		return Decision{}, retry
	}
	if t.syncing && t.closed.Load() && t.closedAfterCommit(e, &res, n, now) {
		return Decision{}, closed
	}
	t.count(e).allowed.Add(1)
	if t.syncing {
		t.touch(e)
	}
	return d, admitted
}

// fold adds rule i's counts after an admitted request to d: the tightest
// rule is described, and the longest delay kept. shareRem, when not
// negative, is what the share policy still admits.
func (d *Decision) fold(r *Rule, i int, c *Counts, n, shareRem int64) {
	var rem, reset, delay int64
	switch {
	case r.kind == Buckets && c.Buckets == nil:
		// A running sum (counts): Cur is the window's total after the
		// request, which the current bucket holds some of, so the rule is
		// back to its full limit when that bucket leaves the window.
		rem, reset = max(r.limit-c.Cur, 0), r.span*r.w-c.Elapsed
	case r.kind == Sliding || r.kind == Fixed:
		// remaining, as Allow1 reports it, not level: Allow1 and Allow
		// give the same Remaining.
		rem, reset = r.remaining(r.estimate(c.Prev, c.Cur, c.Elapsed)), r.resetAfter(c.Prev, c.Cur, c.Elapsed)
	default:
		rem, _, reset, delay = r.describe(c, n, true, 1)
	}
	if shareRem >= 0 {
		rem = min(rem, shareRem)
	}
	d.Delay = max(d.Delay, delay)
	if rem < d.Remaining {
		d.Rule, d.Remaining, d.ResetAfter = i, rem, reset
	}
}

// logAdmits checks every Log rule of e for a request of cost n at now,
// folding their counts after the request into d. It returns the first
// rule that denies. Call with e's mutex held.
func (t *Table) logAdmits(e *Entry, n, now int64, d *Decision) (int, bool) {
	for i := range t.rules {
		r := &t.rules[i]
		if r.kind != Log {
			continue
		}
		var c Counts
		if x := t.xOf(e).Load(); x != nil && x.log != nil {
			c = x.log.counts(r, now, n)
		}
		if !r.Admits(c, n) {
			return i, false
		}
		c.Cur += n
		if c.Reset < r.window {
			c.Reset = r.window // the request just logged is the newest
		}
		d.fold(r, i, &c, n, -1)
	}
	return -1, true
}

// longestLog returns the longest window of the Log rules.
func (t *Table) longestLog() int64 {
	w := int64(0)
	for i := range t.rules {
		if t.rules[i].kind == Log {
			w = max(w, t.rules[i].window)
		}
	}
	return w
}

// reserveWord counts n on rule i's pending word if the rule admits it at
// now (Sliding, Fixed, Buckets; GCRA and Leaky in a table that syncs), and
// returns the rule's counts after the request and what the share policy
// still admits (−1 when it does not apply). buf holds a Buckets rule's
// counts.
func (t *Table) reserveWord(e *Entry, i int, n, now int64, res *reserved, buf []int64) (Counts, outcome, int64) {
	r, c := &t.rules[i], e.ctr(i)
	for {
		w := word(c.word.Load())
		if w.rolling() {
			t.waitRoll(e)
			continue
		}
		win := c.win.Load()
		el := int64(0)
		if r.counted() {
			// Most decisions fall in the counter's window: no division.
			if el = now - win*r.w; el < 0 || el >= r.w {
				id, _ := WindowOf(now, r.w)
				if win < id {
					if !t.roll(e, i, id, now) {
						return Counts{}, closed, -1
					}
					continue
				}
				el = 0 // another decision already moved on: its window has begun
			}
		}
		cts, ok, shareRem := t.counts(e, i, w, win, el, now, n, buf)
		if !ok {
			return cts, refused, -1
		}
		nw := w.plus(n)
		if !c.word.CompareAndSwap(uint64(w), uint64(nw)) {
			continue
		}
		res.words[i], res.wins[i] = nw, win
		switch {
		case r.kind == Buckets && cts.Buckets == nil:
			cts.Cur += n
		case r.kind == Buckets:
			cts.Buckets[len(cts.Buckets)-1] += n
		case r.kind == GCRA, r.kind == Leaky:
			cts.Tat = max(cts.Tat, 0) + n*r.t
		default:
			cts.Cur += n
		}
		if shareRem >= 0 {
			shareRem = max(shareRem-n, 0)
		}
		return cts, admitted, shareRem
	}
}

// counts returns rule i's counts as word w (window win, el into it) shows
// them at now, whether a request of cost n fits (under the share policy
// too, for Sliding and Fixed), and what the share policy admits before the
// request (−1 when it does not apply).
func (t *Table) counts(e *Entry, i int, w word, win, el, now, n int64, buf []int64) (Counts, bool, int64) {
	r, c := &t.rules[i], e.ctr(i)
	cur := c.base.Load() + w.count()
	switch r.kind {
	case Buckets:
		if !t.share {
			// The running sum of the closed buckets: Cur is the window's
			// total, Buckets is nil (fold reads it so).
			sum := t.closedSum(e, i).Load() + cur
			return Counts{Cur: sum, Elapsed: el}, sum+n <= r.limit, -1
		}
		b := t.bucketCounts(e, i, win, cur, buf)
		ok := r.bucketSum(b)+n <= r.limit
		if ok && t.share {
			if room, applies := t.bucketShareRoomOf(e, i, b, win, el); applies {
				return Counts{Buckets: b, Elapsed: el}, float64(n) <= room+Epsilon, shareLeft(room)
			}
		}
		return Counts{Buckets: b, Elapsed: el}, ok, -1
	case GCRA, Leaky:
		// The store's arrival time as last read, moved by this node's
		// cost not yet in it.
		ahead := r.syncedAhead(c.prev.Load(), cur, now)
		return Counts{Tat: ahead}, r.gcraAdmits(ahead, n), -1
	}
	prev := c.prev.Load()
	cts := Counts{Prev: prev, Cur: cur, Elapsed: el}
	ok := r.admitsWindow(prev, cur, el, n)
	if ok && t.share {
		if _, room, applies := t.shareRoomOf(e, i, prev, cur, win, el); applies {
			return cts, float64(n) <= room+Epsilon, shareLeft(room)
		}
	}
	return cts, ok, -1
}

// bucketCounts fills buf with rule i's bucket counts, oldest first, for
// window win whose current count is cur, and returns them.
func (t *Table) bucketCounts(e *Entry, i int, win, cur int64, buf []int64) []int64 {
	r := &t.rules[i]
	b := buf[:r.span]
	h := t.xOf(e).Load().hist[t.histOff[i] : t.histOff[i]+int(r.span)]
	for k := range r.span - 1 {
		id := win - r.span + 1 + k
		s := &h[r.bucketSlot(id)]
		if s.id.Load() == id {
			b[k] = s.n.Load()
		} else {
			b[k] = 0
		}
	}
	b[r.span-1] = cur
	return b
}

// reserveTat moves a local token bucket's arrival time by n intervals if
// the rule admits the request at now (GCRA and Leaky in a table that does
// not sync, whose arrival time lives in the counter's base), and returns
// its counts after the request.
func (t *Table) reserveTat(e *Entry, i int, n, now int64) (Counts, outcome) {
	r, c := &t.rules[i], e.ctr(i)
	for {
		tat := c.base.Load()
		ahead := tat - now
		if !r.gcraAdmits(ahead, n) {
			return Counts{Tat: ahead}, refused
		}
		next := max(tat, now) + n*r.t
		if c.base.CompareAndSwap(tat, next) {
			return Counts{Tat: next - now}, admitted
		}
	}
}
