package local

import (
	"sync"
	"sync/atomic"
)

// The pending word packs, into one atomic uint64, this node's unsynced
// increments for the counter's current window together with an epoch that
// changes at every window rollover, and a flag set while a rollover is under
// way. A decision reads the word first and commits its increment with a
// compare-and-swap on the same word, so an increment can never slip into a
// window other than the one the decision looked at.
const (
	countBits   = 43
	countMask   = 1<<countBits - 1
	rollingBit  = 1 << countBits
	epochShift  = countBits + 1
	epochMask   = 1<<19 - 1
	maxPending  = countMask >> 1 // saturation point, far above any valid limit
	epochUnit   = uint64(1) << epochShift
	wordNoEpoch = uint64(countMask | rollingBit)
)

// Word is a snapshot of a Counter's pending word, as returned by
// Counter.Load. It is only meaningful for the Counter it came from.
type Word uint64

// Count returns this node's unsynced increments recorded in w.
func (w Word) Count() int64 { return int64(uint64(w) & countMask) }

// Rolling reports whether a window rollover was under way when w was read.
func (w Word) Rolling() bool { return uint64(w)&rollingBit != 0 }

func (w Word) epoch() uint64 { return uint64(w) >> epochShift }

// Counter holds one rule's state for one key on this node. Fields read on
// the decision path are atomics; the rest is guarded by the owning Entry's
// mutex. A Counter is only used inside an Entry; its zero value is a
// counter at window 0 with no counts.
type Counter struct {
	word     atomic.Uint64 // pending count, epoch, rolling flag
	win      atomic.Int64  // id of the current window
	cur      atomic.Int64  // cluster total of win as last read from the store
	inflight atomic.Int64  // increments of win taken by the sync loop, push not yet acknowledged
	prev     atomic.Int64  // best-known total of window win-1

	// Guarded by Entry.mu.
	prevPending   int64 // this node's increments of win-1 not yet taken by the sync loop
	prevInflight  int64 // increments of win-1 taken by the sync loop, not yet acknowledged
	prevReadUntil int64 // read the store's win-1 counter in sync cycles before this instant (ns)
	expWin        int64 // highest window whose store expiry this node has set, -1 for none
}

// Load returns the pending word. Call it before Window, Prev and Synced so
// that a later CompareAndAdd detects any rollover in between.
func (c *Counter) Load() Word { return Word(c.word.Load()) }

// Window returns the id of the counter's current window.
func (c *Counter) Window() int64 { return c.win.Load() }

// Prev returns the best-known total of the window before the current one.
func (c *Counter) Prev() int64 { return c.prev.Load() }

// Synced returns the part of the current window's total that is known from
// the store or already on its way there: the cluster total read at the last
// sync plus the increments being pushed now.
func (c *Counter) Synced() int64 { return c.cur.Load() + c.inflight.Load() }

// CompareAndAdd adds n to the pending count if the word is still w. It
// reports false, changing nothing, if any other increment or a rollover
// happened since w was loaded. A count that would pass the saturation point
// (far above any valid limit) is clamped there.
func (c *Counter) CompareAndAdd(w Word, n int64) bool {
	next := uint64(w) + uint64(n)
	if w.Count()+n > maxPending {
		next = uint64(w)&^countMask | maxPending
	}
	return c.word.CompareAndSwap(uint64(w), next)
}

// Entry is the state of one user key on this node: a Counter per rule, the
// time of the last decision, and bookkeeping for the sync loop and the
// evictor. Entries are created by Table; they are safe for concurrent use.
//
// The fields a decision reads come first, and the counters of up to 8 rules
// are allocated with the entry (see newEntry), so that a decision on a cold
// key touches as few cache lines as possible.
type Entry struct {
	// C holds one Counter per rule, in rule order.
	C []Counter

	lastSeen atomic.Int64 // ns of the last decision
	allowed  atomic.Uint64
	dead     atomic.Bool // evicted: decisions must retry with a fresh entry
	queued   atomic.Bool // in the table's touched queue
	mu       sync.Mutex
	denied   atomic.Uint64

	// Key is the user key. It never changes.
	Key string

	sk *storeKeys // the key's store keys, built on first use (guarded by mu)
}

// storeKeys caches the store keys of an entry.
type storeKeys struct {
	base string    // "<prefix>:{<encoded key>}:"
	wins []winKeys // per rule: the synchronous mode's current and previous window keys
}

type winKeys struct {
	win       int64
	cur, prev string
}

// newEntry allocates an entry for key with n counters, in one allocation
// when n ≤ 8.
func newEntry(key string, n int) *Entry {
	var e *Entry
	switch {
	case n == 1:
		x := &struct {
			Entry
			c [1]Counter
		}{}
		e = &x.Entry
		e.C = x.c[:]
	case n == 2:
		x := &struct {
			Entry
			c [2]Counter
		}{}
		e = &x.Entry
		e.C = x.c[:]
	case n <= 4:
		x := &struct {
			Entry
			c [4]Counter
		}{}
		e = &x.Entry
		e.C = x.c[:n]
	case n <= 8:
		x := &struct {
			Entry
			c [8]Counter
		}{}
		e = &x.Entry
		e.C = x.c[:n]
	default:
		e = &Entry{C: make([]Counter, n)}
	}
	e.Key = key
	return e
}

// Seen records a decision at now.
func (e *Entry) Seen(now int64) {
	if e.lastSeen.Load() < now {
		e.lastSeen.Store(now)
	}
}

// LastSeen returns the instant (ns) of the entry's last decision.
func (e *Entry) LastSeen() int64 { return e.lastSeen.Load() }

// Dead reports whether the entry was evicted. A decision that committed
// increments to a dead entry must undo them and retry with a fresh one.
func (e *Entry) Dead() bool { return e.dead.Load() }

// Count records the outcome of one decision in the entry's statistics.
func (e *Entry) Count(allowed bool) {
	if allowed {
		e.allowed.Add(1)
	} else {
		e.denied.Add(1)
	}
}

// Roll moves counter i to window win if it is behind it. prevReadUntil is
// the instant until which the sync loop keeps reading the store's counter of
// the window that becomes the previous one. It returns the increments that
// had to be discarded because they belong to windows older than the new
// previous one and were never pushed (only possible when the store has been
// unreachable for longer than a window).
func (e *Entry) Roll(i int, win, prevReadUntil int64, syncing bool) (dropped int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := &e.C[i]
	old := c.win.Load()
	if old >= win {
		return 0
	}
	// Freeze the pending count: decisions that see the rolling flag wait on mu.
	var w uint64
	for {
		w = c.word.Load()
		if c.word.CompareAndSwap(w, w&^countMask|rollingBit) {
			break
		}
	}
	p := Word(w).Count()
	total := c.cur.Load() + c.inflight.Load() + p
	if win == old+1 {
		c.prev.Store(total)
		if syncing {
			dropped = c.prevPending
			c.prevPending = p
			c.prevReadUntil = prevReadUntil
		}
	} else {
		c.prev.Store(0)
		if syncing {
			dropped = c.prevPending + p
			c.prevPending = 0
			c.prevReadUntil = 0
		}
	}
	c.cur.Store(0)
	c.inflight.Store(0)
	c.win.Store(win)
	c.word.Store((Word(w).epoch() + 1) & epochMask << epochShift)
	return dropped
}

// WaitRoll blocks until a rollover under way on the entry has finished.
func (e *Entry) WaitRoll() {
	e.mu.Lock()
	//lint:ignore SA2001 an empty critical section is the point: it waits for Roll.
	e.mu.Unlock()
}

// Undo takes back n that a decision added to counter i when the pending word
// was w, after a later rule denied the request or the entry turned out to be
// dead. If the counter rolled over since, the increment now lives in the
// previous window and is taken back there.
func (e *Entry) Undo(i int, w Word, n int64) {
	c := &e.C[i]
	for {
		cur := Word(c.word.Load())
		if cur.Rolling() {
			e.WaitRoll()
			continue
		}
		if cur.epoch() != w.epoch() {
			break
		}
		// If the sync loop already took the increment, the part it took is
		// pushed anyway: an over-count, never an under-count.
		if c.word.CompareAndSwap(uint64(cur), uint64(cur)-uint64(min(n, cur.Count()))) {
			return
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.word.Load()>>epochShift == (w.epoch()+1)&epochMask {
		c.prev.Add(-n)
		c.prevPending = max(c.prevPending-n, 0)
	}
}
