package local

import (
	"math"
	"sync/atomic"
	"unsafe"
)

// Allow1's fast paths: the common decisions, taken without building a
// Decision, that Allow takes again from the start when they cannot decide.

// Allow1 is the common case of Allow alone, written out so that it
// returns what a decision needs in registers: a table of one to four
// Sliding, Fixed or Buckets rules without the share policy (under it, one
// Sliding or Fixed rule, or two to four), a tracked key, every counter in its
// window, admitted at the first compare-and-swap of each. When rule is not
// negative, the request was admitted and counted, and rule, the tightest
// rule, has remaining and resetAfter (ns) after it. Otherwise nothing was
// counted: call Allow, which decides from the start.
func (t *Table) Allow1(key string, n, now int64) (rule int, remaining, resetAfter int64) {
	if t.fast == 0 || t.closed.Load() {
		return -1, 0, 0
	}
	// find's first probe, written out; find goes on from the start.
	h := t.hash(key)
	hd := t.headOf(h)
	v := hd.ver.Load()
	arr := hd.arr.Load()
	var e *Entry
	if hd.ver.Load() == v && v&verOdd == 0 {
		s := slotAt(arr, h&uint64(uint32(v)))
		if e = s.e.Load(); e == nil {
			return -1, 0, 0
		}
		if !s.is(e, h, key) {
			e = t.find(h, key)
		}
	} else {
		e = t.find(h, key)
	}
	if e == nil {
		return -1, 0, 0
	}
	if t.fast != 1 {
		switch t.fast {
		case 4:
			return allowRules[noShares](t, e, n, now)
		case 5:
			return allowRules[withShares](t, e, n, now)
		case 2:
			return t.allowWindows(e, n, now)
		}
		return t.allowShare(e, n, now)
	}
	r, c := t.rule0, &e.c0
	w, win, el, prev, cur, ok := r.read(c, now)
	if !ok {
		return -1, 0, 0
	}
	est := r.estimate(prev, cur, el)
	if !r.admits(est, n) {
		return -1, 0, 0
	}
	if !c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))) {
		return -1, 0, 0
	}
	e.seen(now) // before the dead check: see Table.tryEvict
	if (e.has(flagDead) || (t.syncing && t.closed.Load())) && !t.kept1(e, w.plus(n), win, n, now) {
		return -1, 0, 0
	}
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
	w, win, el, prev, cur, ok := r.read(c, now)
	if !ok {
		return -1, 0, 0
	}
	est := r.estimate(prev, cur, el)
	if !r.admits(est, n) {
		return -1, 0, 0
	}
	remaining = r.remaining(est + float64(n))
	if _, room, applies := t.shareRoomOf(e, 0, prev, cur, win, el); applies {
		if float64(n) > room+Epsilon {
			return -1, 0, 0
		}
		remaining = min(remaining, shareLeft(room-float64(n)))
	}
	if !c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))) {
		return -1, 0, 0
	}
	e.seen(now) // before the dead check: see Table.tryEvict
	if (e.has(flagDead) || (t.syncing && t.closed.Load())) && !t.kept1(e, w.plus(n), win, n, now) {
		return -1, 0, 0
	}
	t.count(e).allowed.Add(1)
	if t.syncing {
		t.touch(e)
	}
	return 0, remaining, r.resetAfter(prev, cur+n, el)
}

// read reads counter c for a decision at now: its word, its window, the
// time elapsed in that window, and the previous and current windows'
// counts. ok is false while a rollover is under way or due.
func (r *Rule) read(c *counter, now int64) (w word, win, el, prev, cur int64, ok bool) {
	w = word(c.word.Load())
	win = c.win.Load()
	el = now - win*r.w
	if w.rolling() || uint64(el) >= uint64(r.w) {
		return w, win, el, 0, 0, false
	}
	return w, win, el, c.prev.Load(), c.base.Load() + w.count(), true
}

// kept1 is for a one-rule decision of cost n that stored word w in window
// win on an entry evicted, or a table closed, meanwhile: it reports
// whether the decision stands (committed) or was taken back (Allow then
// retries on a fresh entry, or finds the table closed).
func (t *Table) kept1(e *Entry, w word, win, n, now int64) bool {
	res := reserved{upto: 1}
	res.words[0], res.wins[0] = w, win
	return t.committed(e, &res, n, now) == admitted
}

// allowRules is Allow1 for two to four Sliding or Fixed rules: decide's
// steps for each rule in turn, written out, with the share policy's room
// once the entry has its states (allowShare's check). Each
// rule reads its words, computes the previous window's weighted part once
// for its estimates before and after the request, and commits with one
// compare-and-swap on the word it read; the tightest rule is found as
// decide's fold finds it (the first of the least remaining). When a rule
// cannot be counted, the rules before it are taken back.
func allowRules[P noShares | withShares](t *Table, e *Entry, n, now int64) (rule int, remaining, resetAfter int64) {
	var words [4]word // as read: undo needs the generation, which plus keeps
	var wins [4]int64
	remaining = math.MaxInt64
	fn := float64(n)
	nr := len(t.rules)
	var p P
	shared := unsafe.Sizeof(p) != 0 && e.flags.Load()&flagShared != 0 // a constant false for noShares
	r, c := t.rule0, &e.c0
	for i := 0; ; {
		w := word(c.word.Load())
		win := c.win.Load()
		el := now - win*r.w
		if w.rolling() || uint64(el) >= uint64(r.w) {
			return t.undoRules(e, i, &words, &wins, n)
		}
		words[i&3], wins[i&3] = w, win
		prev, cur := c.prev.Load(), c.base.Load()+w.count()
		part := r.prevPart(prev, el) // est = part + cur, as estimate
		if !(part+float64(cur)+fn <= r.limitE) {
			return t.undoRules(e, i, &words, &wins, n)
		}
		var shareRem int64 // what the share policy admits after the request
		if shared && !t.shareFits(e, i, prev, cur, win, el, fn, &shareRem) {
			return t.undoRules(e, i, &words, &wins, n)
		}
		if !c.word.CompareAndSwap(uint64(w), uint64(w.plus(n))) {
			return t.undoRules(e, i, &words, &wins, n)
		}
		cur += n
		rem := r.remainingAdmitted(part + float64(cur))
		if shared {
			rem = min(rem, shareRem)
		}
		if rem < remaining {
			rule, remaining, resetAfter = i, rem, r.full-el
			if cur <= 0 {
				resetAfter = r.resetAfter(prev, cur, el)
			}
		}
		if i++; i == nr {
			break
		}
		// The next rule, which follows r in t.rules, and its counter, which
		// follows c in the entry: pointers moved on, without indexing.
		r, c = (*Rule)(unsafe.Add(unsafe.Pointer(r), ruleSize)), (*counter)(unsafe.Add(unsafe.Pointer(c), counterSize))
	}
	e.seen(now) // before the dead check: see Table.tryEvict
	if e.has(flagDead) || (t.syncing && t.closed.Load()) {
		res := reserved{upto: nr}
		copy(res.words[:], words[:])
		copy(res.wins[:], wins[:])
		if t.committed(e, &res, n, now) != admitted {
			return -1, 0, 0
		}
	}
	t.count(e).allowed.Add(1)
	if t.syncing {
		t.touch(e)
	}
	return rule, remaining, resetAfter
}

// noShares and withShares instantiate allowRules for a table without
// and with the share policy: their sizes differ, so the compiler builds
// each apart, and without the policy the share checks fold away.
type (
	noShares   struct{}
	withShares struct{ _ byte }
)

// shareFits reports whether the share policy admits a request of cost fn
// on rule i of e (allowShare's check), and sets *rem to what it admits
// after the request (math.MaxInt64 when it does not apply).
func (t *Table) shareFits(e *Entry, i int, prev, cur, win, el int64, fn float64, rem *int64) bool {
	*rem = math.MaxInt64
	if _, room, applies := t.shareRoomOf(e, i, prev, cur, win, el); applies {
		if fn > room+Epsilon {
			return false
		}
		*rem = shareLeft(room - fn)
	}
	return true
}

// ruleSize is the distance between consecutive rules in Table.rules.
const ruleSize = unsafe.Sizeof(Rule{})

// undoRules takes back what allowRules counted on rules [0, upto) and
// returns its answer for a decision it leaves to Allow.
func (t *Table) undoRules(e *Entry, upto int, words *[4]word, wins *[4]int64, n int64) (int, int64, int64) {
	for j := range upto {
		t.undo(e, j, words[j&3], wins[j&3], n)
	}
	return -1, 0, 0
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
	e.seen(now) // before the dead check: see Table.tryEvict
	if e.has(flagDead) || (t.syncing && t.closed.Load()) {
		res := reserved{upto: len(t.rules)}
		copy(res.words[:], words[:])
		copy(res.wins[:], wins[:])
		if t.committed(e, &res, n, now) != admitted {
			return -1, 0, 0
		}
	}
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
