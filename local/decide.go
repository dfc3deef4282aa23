package local

import (
	"math"
	"sync/atomic"
)

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

// Allow1 is the common case of Allow alone, written out so that it
// returns what a decision needs in registers: a table of one to four
// Sliding, Fixed or Buckets rules without the share policy, a tracked key
// found at its first slot, every counter in its window, admitted at the
// first compare-and-swap of each (or one such rule under the share
// policy). When rule is not negative, the request
// was admitted and counted, and rule, the tightest rule, has remaining and
// resetAfter (ns) after it. Otherwise nothing was counted: call Allow,
// which decides from the start.
func (t *Table) Allow1(key string, n, now int64) (rule int, remaining, resetAfter int64) {
	if t.fast == 0 || t.closed.Load() {
		return -1, 0, 0
	}
	h := t.hash(key)
	sl := t.shardOf(h).tab.Load().e
	e := sl[h&uint64(len(sl)-1)].Load()
	if e == nil || e.key != key {
		return -1, 0, 0
	}
	if t.fast != 1 {
		if t.fast == 2 {
			return t.allowWindows(e, n, now)
		}
		return t.allowShare(e, n, now)
	}
	r, c := t.rule0, &e.c0
	w := word(c.word.Load())
	win := c.win.Load()
	el := now - win*r.w
	if w.rolling() || uint64(el) >= uint64(r.w) {
		return -1, 0, 0
	}
	prev, cur := c.prev.Load(), c.base.Load()+w.count()
	est := r.estimate(prev, cur, el)
	if !r.admits(est, n) {
		return -1, 0, 0
	}
	if !c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))) {
		return -1, 0, 0
	}
	if e.has(flagDead) || (t.syncing && t.closed.Load()) {
		res := reserved{upto: 1}
		res.words[0], res.wins[0] = w.plus(n), win
		if t.committed(e, &res, n, now) != admitted {
			return -1, 0, 0 // taken back: Allow retries on a fresh entry, or finds the table closed
		}
	}
	e.seen(now)
	t.count(e).allowed.Add(1)
	if t.syncing {
		t.touch(e)
	}
	return 0, r.remaining(est + float64(n)), r.resetAfter(prev, cur+n, el)
}

// allowShare is Allow1 for one Sliding or Fixed rule under the share
// policy: decide1's steps, as Allow1 takes them.
func (t *Table) allowShare(e *Entry, n, now int64) (rule int, remaining, resetAfter int64) {
	r, c := t.rule0, &e.c0
	w := word(c.word.Load())
	win := c.win.Load()
	el := now - win*r.w
	if w.rolling() || uint64(el) >= uint64(r.w) {
		return -1, 0, 0
	}
	prev, cur := c.prev.Load(), c.base.Load()+w.count()
	est := r.estimate(prev, cur, el)
	if !r.admits(est, n) {
		return -1, 0, 0
	}
	remaining = r.remaining(est + float64(n))
	if _, room, applies := t.shareRoomOf(e, 0, prev, cur, win, el); applies {
		if float64(n) > room+Epsilon {
			return -1, 0, 0
		}
		remaining = min(remaining, int64(max(room-float64(n), 0)))
	}
	if !c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))) {
		return -1, 0, 0
	}
	if e.has(flagDead) || t.closed.Load() {
		res := reserved{upto: 1}
		res.words[0], res.wins[0] = w.plus(n), win
		if t.committed(e, &res, n, now) != admitted {
			return -1, 0, 0
		}
	}
	e.seen(now)
	t.count(e).allowed.Add(1)
	t.touch(e)
	return 0, remaining, r.resetAfter(prev, cur+n, el)
}

// allowWindows is Allow1 for several rules, or Buckets: each rule is checked and
// counted in turn, as decide does; when one cannot be, the rules before it
// are taken back.
func (t *Table) allowWindows(e *Entry, n, now int64) (rule int, remaining, resetAfter int64) {
	var words [4]word
	var wins [4]int64
	remaining = math.MaxInt64
	for i := range t.rules {
		var nw word
		var win, rem, reset int64
		var ok bool
		if r := &t.rules[i]; r.kind == Buckets {
			nw, win, rem, reset, ok = r.takeBuckets(e.ctr(i), t.closedSum(e, i), n, now)
		} else {
			nw, win, rem, reset, ok = r.take(e.ctr(i), n, now)
		}
		if !ok {
			for j := range i {
				t.undo(e, j, words[j&3], wins[j&3], n)
			}
			return -1, 0, 0
		}
		words[i&3], wins[i&3] = nw, win
		if rem < remaining { // as decide's fold: the first of the least remaining
			rule, remaining, resetAfter = i, rem, reset
		}
	}
	if e.has(flagDead) || (t.syncing && t.closed.Load()) {
		res := reserved{upto: len(t.rules)}
		copy(res.words[:], words[:])
		copy(res.wins[:], wins[:])
		if t.committed(e, &res, n, now) != admitted {
			return -1, 0, 0
		}
	}
	e.seen(now)
	t.count(e).allowed.Add(1)
	if t.syncing {
		t.touch(e)
	}
	return rule, remaining, resetAfter
}

// take counts a request of cost n at now on c, a Sliding or Fixed rule's
// counter, if it is in its window and the rule admits the request, with
// one compare-and-swap, and returns the word committed, its window, and
// what the rule still admits after the request and when it resets (as
// decide's fold computes them). It reports false, counting nothing,
// otherwise.
func (r *Rule) take(c *counter, n, now int64) (nw word, win, remaining, resetAfter int64, ok bool) {
	w := word(c.word.Load())
	win = c.win.Load()
	el := now - win*r.w
	if w.rolling() || uint64(el) >= uint64(r.w) {
		return 0, 0, 0, 0, false
	}
	prev, cur := c.prev.Load(), c.base.Load()+w.count()
	if !r.admitsWindow(prev, cur, el, n) {
		return 0, 0, 0, 0, false
	}
	nw = w.plus(n)
	if !c.word.CompareAndSwap(uint64(w), uint64(nw)) {
		return 0, 0, 0, 0, false
	}
	return nw, win, r.remaining(r.estimate(prev, cur+n, el)), r.resetAfter(prev, cur+n, el), true
}

// takeBuckets is take for a Buckets rule, whose closed buckets in the
// counter's window sum to sum.
func (r *Rule) takeBuckets(c *counter, sum *atomic.Int64, n, now int64) (nw word, win, remaining, resetAfter int64, ok bool) {
	w := word(c.word.Load())
	win = c.win.Load()
	el := now - win*r.w
	if w.rolling() || uint64(el) >= uint64(r.w) {
		return 0, 0, 0, 0, false
	}
	total := sum.Load() + c.base.Load() + w.count() + n
	nw = w.plus(n)
	if total > r.limit || !c.word.CompareAndSwap(uint64(w), uint64(nw)) {
		return 0, 0, 0, 0, false
	}
	// As fold for a running sum: the current bucket holds some of the
	// total, so the rule resets when it leaves the window.
	return nw, win, max(r.limit-total, 0), r.span*r.w - el, true
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
		e.mu.Lock()
		i, ok := t.logAdmits(e, n, now, &d)
		if ok {
			x := e.ext()
			if x.log == nil {
				x.log = newLogRing(t.logCap)
			}
			x.log.prune(now - t.longestLog())
			x.log.push(now, n)
			res.log = true
		}
		e.mu.Unlock()
		if !ok {
			t.refuse(e, i, &res, n, now)
			return Decision{}, refused
		}
	}
	if e.has(flagDead) {
		t.undoAll(e, &res, n, now)
		return Decision{}, retry
	}
	if t.syncing && t.closed.Load() && t.closedAfterCommit(e, &res, n, now) {
		return Decision{}, closed
	}
	e.seen(now)
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
	if r.kind == Buckets && c.Buckets == nil {
		// A running sum (counts): Cur is the window's total after the
		// request, which the current bucket holds some of, so the rule is
		// back to its full limit when that bucket leaves the window.
		rem, reset = max(r.limit-c.Cur, 0), r.span*r.w-c.Elapsed
	} else {
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
// rule that denies. Call with e.mu held.
func (t *Table) logAdmits(e *Entry, n, now int64, d *Decision) (int, bool) {
	for i := range t.rules {
		r := &t.rules[i]
		if r.kind != Log {
			continue
		}
		var c Counts
		if x := e.x.Load(); x != nil && x.log != nil {
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
			e.waitRoll()
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
			if room, applies := t.bucketShareRoomOf(e, i, b, win); applies {
				return Counts{Buckets: b, Elapsed: el}, float64(n) <= room+Epsilon, int64(max(room, 0))
			}
		}
		return Counts{Buckets: b, Elapsed: el}, ok, -1
	case GCRA, Leaky:
		// The store's arrival time as last read, moved by this node's
		// cost not yet in it.
		ahead := max(c.prev.Load(), now) + cur*r.t - now
		return Counts{Tat: ahead}, r.gcraAdmits(ahead, n), -1
	}
	prev := c.prev.Load()
	cts := Counts{Prev: prev, Cur: cur, Elapsed: el}
	ok := r.admitsWindow(prev, cur, el, n)
	if ok && t.share {
		if _, room, applies := t.shareRoomOf(e, i, prev, cur, win, el); applies {
			return cts, float64(n) <= room+Epsilon, int64(max(room, 0))
		}
	}
	return cts, ok, -1
}

// bucketCounts fills buf with rule i's bucket counts, oldest first, for
// window win whose current count is cur, and returns them.
func (t *Table) bucketCounts(e *Entry, i int, win, cur int64, buf []int64) []int64 {
	r := &t.rules[i]
	b := buf[:r.span]
	h := e.x.Load().hist[t.histOff[i] : t.histOff[i]+int(r.span)]
	for k := range r.span - 1 {
		id := win - r.span + 1 + k
		s := &h[id%r.span]
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
	e.mu.Lock()
	defer e.mu.Unlock()
	x := e.ext()
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
			if c.base.CompareAndSwap(tat, max(tat, now)+n*r.t) {
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
			e.waitRoll()
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
		e.mu.Lock()
		e.x.Load().log.remove(now, n)
		e.mu.Unlock()
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
	}
}

// histAdd adds d to the closed bucket id of rule i, if it is kept. Call
// with e.mu held.
func (t *Table) histAdd(e *Entry, i int, id, d int64) {
	s := &e.x.Load().hist[t.histOff[i]+int(id%t.rules[i].span)]
	if s.id.Load() == id {
		s.n.Add(d)
		if t.inWindow(e, i, id) {
			t.closedSum(e, i).Add(d)
		}
	}
}

// closedSum returns the running sum of rule i's closed buckets in its
// counter's current window (Buckets). It changes under e.mu only.
func (t *Table) closedSum(e *Entry, i int) *atomic.Int64 {
	return &e.x.Load().hist[t.histOff[i]+int(t.rules[i].span)].n
}

// inWindow reports whether the closed bucket id of rule i is in its
// counter's current window. Call with e.mu held.
func (t *Table) inWindow(e *Entry, i int, id int64) bool {
	win := e.ctr(i).win.Load()
	return win-t.rules[i].span < id && id < win
}

// resum recomputes rule i's running sum of closed buckets from its slots.
// Call with e.mu held.
func (t *Table) resum(e *Entry, i int) {
	r := &t.rules[i]
	h := e.x.Load().hist[t.histOff[i] : t.histOff[i]+int(r.span)]
	win := e.ctr(i).win.Load()
	sum := int64(0)
	for id := win - r.span + 1; id < win; id++ {
		if s := &h[id%r.span]; s.id.Load() == id {
			sum += s.n.Load()
		}
	}
	t.closedSum(e, i).Store(sum)
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
		s := &e.x.Load().hist[t.histOff[i]+int(old%t.rules[i].span)]
		s.id.Store(old)
		s.n.Store(total)
	}
	if t.syncing {
		s := t.sync(e, i)
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

// closedAfterCommit handles a decision that committed its increments and
// then found the table closed: it reports true, with the increments taken
// back, when the final flush did not take them (they would never reach the
// store), and false when they were taken and are pushed by the flush. It
// waits for the final flush to end.
func (t *Table) closedAfterCommit(e *Entry, res *reserved, n, now int64) bool {
	<-t.flushed
	e.mu.Lock()
	if e.has(flagSealed) {
		// The final take took every counter at once and no rollover can
		// follow it: either every generation moved or none did.
		for i := range t.rules {
			if t.rules[i].kind == Log {
				continue
			}
			if word(e.ctr(i).word.Load()).gen() != res.words[i].gen() {
				e.mu.Unlock()
				return false
			}
			break
		}
	}
	e.mu.Unlock()
	t.undoAll(e, res, n, now)
	return true
}
