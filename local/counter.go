package local

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// MaxRules is the most rules a Table holds.
const MaxRules = 16

// The pending word packs into one atomic uint64 this node's increments of
// a counter's current window that the sync loop has not taken yet, a flag
// set while a rollover is under way, and a generation that changes at
// every rollover and every take. A decision reads the word first and
// commits its increment with a compare-and-swap on the same word, so an
// increment can never slip into a window, or past a take, that the
// decision did not see; and an increment can later tell, by the
// generation, whether it is still pending (see Table.undo).
const (
	countBits  = 43
	countMask  = 1<<countBits - 1
	rollingBit = 1 << countBits
	genShift   = countBits + 1
	genMask    = 1<<(64-genShift) - 1
	maxPending = countMask >> 1 // saturation point, far above any valid limit
)

// word is a snapshot of a counter's pending word.
type word uint64

func (w word) count() int64  { return int64(uint64(w) & countMask) }
func (w word) rolling() bool { return uint64(w)&rollingBit != 0 }
func (w word) gen() uint64   { return uint64(w) >> genShift }

// plus returns w with n more pending, saturating far above any limit.
func (w word) plus(n int64) word {
	if w.count()+n > maxPending {
		return w&^countMask | maxPending
	}
	return w + word(n)
}

// next returns a word with nothing pending, not rolling, and the next
// generation after w's.
func (w word) next() word { return word((w.gen() + 1) & genMask << genShift) }

// counter is one rule's counts of one key on this node: the part that
// every decision reads, updated with atomic operations. Its zero value is
// window 0 with no counts.
type counter struct {
	word atomic.Uint64 // pending count, rolling flag, generation
	win  atomic.Int64  // id of the current window
	prev atomic.Int64  // best-known total of window win-1
	// base is the part of window win's total that is not in the word: the
	// cluster total as last read from the store plus this node's increments
	// taken by the sync loop and not yet acknowledged (and signed
	// adjustments, see syncState.adj). Always 0 in a table that does not
	// sync.
	base atomic.Int64
}

// syncState is one counter's bookkeeping with the sync loop, in tables
// that sync (32 bytes; whether the sync loop still reads the previous
// window is in Entry.prevReads). It is guarded by the entry's mutex. Between
// settles, base − inflight − adj is the store's total of window win as
// last read (0 before the first read in the window), which the share
// policy uses (see Table.othersShown).
type syncState struct {
	inflight     int64 // increments of win taken, not acknowledged
	adj          int64 // signed increments of win to add to the next take
	prevPending  int64 // increments of win-1 not taken yet
	prevInflight int64 // increments of win-1 taken, not acknowledged
}

// staleCount is a counter's increments of windows older than the
// previous one: those still to push (after a store outage across a
// rollover, or take-backs of increments already pushed), and those a take
// moved into a batch that the store has not answered. It lives in the
// entry's extension, allocated when first needed.
type staleCount struct {
	win int64 // window of n
	n   int64
	// back holds the increments of other windows than win that must not be
	// dropped for a newer window's: take-backs (negative increments, for
	// requests that the store counts and that were not admitted after all),
	// and the increments of those windows since. At most maxBack windows,
	// the oldest discarded first.
	back []staleWin
	// flying is the increments of windows older than the previous one that
	// are in batches the store has not answered: stale pushes, and pushes
	// of windows the counter rolled away from since their take. Settle and
	// Release take them out.
	flying int64
}

// staleWin is the increments n of window win.
type staleWin struct{ win, n int64 }

// maxBack bounds staleCount.back: take-backs of that many windows older
// than the previous one wait for the store at once only when every take
// of a counter fails while its decisions are undone across rollovers.
const maxBack = 8

// pending returns the increments s holds for window id that no take has
// moved into a batch yet.
func (s *staleCount) pending(id int64) int64 {
	n := int64(0)
	if s.win == id {
		n = s.n
	}
	for _, b := range s.back {
		if b.win == id {
			n += b.n
		}
	}
	return n
}

// keepBack adds d increments of window win to s.back. It returns the
// positive increments discarded to make room (the oldest window's);
// discarded take-backs leave the store counting requests that were not
// admitted, which errs on the side of the limit.
func (s *staleCount) keepBack(win, d int64) (dropped int64) {
	for k := range s.back {
		if s.back[k].win == win {
			s.back[k].n += d
			if s.back[k].n == 0 {
				s.back = append(s.back[:k], s.back[k+1:]...)
			}
			return 0
		}
	}
	if len(s.back) == maxBack {
		oldest := 0
		for k := range s.back {
			if s.back[k].win < s.back[oldest].win {
				oldest = k
			}
		}
		dropped = max(s.back[oldest].n, 0)
		s.back = append(s.back[:oldest], s.back[oldest+1:]...)
	}
	s.back = append(s.back, staleWin{win, d})
	return dropped
}

// stale returns rule i's stale increments of e, nil when there have never
// been any. Call with e's mutex held.
func (t *Table) stale(e *Entry, i int) *staleCount {
	if x := t.ext(e); x != nil && x.stale != nil {
		return &x.stale[i]
	}
	return nil
}

// stash keeps d increments of window win of rule i of e, older than the
// previous one, to be pushed by a later take. It returns the increments
// discarded to make room: a counter keeps the positive increments of one
// such window, the most recent, and beside it take-backs of others (see
// staleCount.back). Call with e's mutex held.
func (t *Table) stash(e *Entry, i int, win, d int64) (dropped int64) {
	if d == 0 {
		return 0
	}
	s := t.staleOf(e, i)
	switch {
	case s.n == 0 || s.win == win:
		s.win, s.n = win, s.n+d
	case win > s.win:
		if s.n > 0 {
			dropped = s.n
		} else {
			dropped = s.keepBack(s.win, s.n)
		}
		s.win, s.n = win, d
	case d < 0 || s.pending(win) != 0:
		dropped = s.keepBack(win, d)
	default:
		dropped = d
	}
	return dropped
}

// staleOf returns rule i's stale increments of e, creating them if
// missing. Call with e's mutex held.
func (t *Table) staleOf(e *Entry, i int) *staleCount {
	if s := t.stale(e, i); s != nil {
		return s
	}
	x := t.extend(e)
	x.stale = make([]staleCount, len(t.rules))
	return &x.stale[i]
}

// fly records d increments of rule i of e, of a window older than the
// previous one, in batches the store has not answered. Call with e's
// mutex held.
func (t *Table) fly(e *Entry, i int, d int64) {
	if d != 0 {
		t.staleOf(e, i).flying += d
	}
}

// unsynced returns the increments rule i of e holds in its sync state that
// the store has not acknowledged. Call with e's mutex held.
func (t *Table) unsynced(e *Entry, i int) int64 {
	s := t.sync(e, i)
	n := s.inflight + s.adj + s.prevPending + s.prevInflight
	if st := t.stale(e, i); st != nil {
		n += st.n + st.flying
		for _, b := range st.back {
			n += b.n
		}
	}
	return n
}

// Entry flags.
const (
	flagDead   = 1 << iota // evicted: decisions must retry with a fresh entry
	flagQueued             // in the table's touched queue
	flagSealed             // taken by the final flush of Close
	flagShared             // holds the share policy's states (Table.shareOf)
)

// Entry is one user key's state on this node: a counter per rule, the
// time of the last decision, and bookkeeping for the sync loop and the
// evictor. Its fields are unexported: the sync loop holds entries only as
// handles between Table calls.
//
// Everything a decision of one rule reads or writes is in its 64 bytes,
// one cache line (the runtime's allocator places objects of 64 bytes at
// multiples of 64): the key (compared by the table's lookup), lastSeen,
// the flags and rule 0's counter. The counters of rules 1… follow c0 in
// the same allocation, then, where the table's rules need it, the pointer
// to the extension, and in a table that syncs, the link of the table's
// touched queue and one syncState per rule (see entryAlloc and Entry.ctr,
// Table.xOf, Table.link, Table.sync): with one rule, 64 bytes, or 112 in a
// table that syncs. An entry's mutex is one of the table's (Table.mu).
type Entry struct {
	key      string
	lastSeen atomic.Int64 // ns of the last decision
	flags    atomic.Uint32
	// prevReads tells, in a table that syncs, which rules' takes still read
	// the store's total of the previous window (Table.readsPrev): bit i,
	// rule i's first take since it rolled over into the next window; bit
	// 16+i, its takes until ReadPrev into the window. Guarded by the
	// entry's mutex.
	prevReads uint32
	c0        counter
}

// The prevReads bits of rule i.
const (
	readFirst = 1
	readUntil = 1 << 16
)

// The oldReads bits of rule i.
const (
	oldAll  = 1
	oldSkip = 1 << 16
)

// prevReads holds two bits per rule.
var _ [16 - MaxRules]struct{}

// entryExt is the part of an entry that only some rules need.
type entryExt struct {
	// hist holds, per Buckets rule, its closed buckets and then the sum of
	// those in the current window (see Table.histOff, Table.closedSum);
	// set at creation.
	hist []histSlot
	log  *logRing   // Log rules' instants, created on the first admission; guarded by mu
	obs  []observed // per rule, the synchronous mode's view of Log rules; guarded by mu
	// stale holds, per rule, increments of a window older than the
	// previous one still to push (see Table.stash); guarded by mu.
	stale []staleCount
	// oldReads tells, in a table that syncs, which Buckets rules' next
	// take reads the store's totals of closed buckets of the window older
	// than the previous one (Table.takeOld): bit i (oldAll) for rule i,
	// all of them (a new entry); bit 16+i (oldSkip), those this node has
	// not read since they closed (a rollover past the next bucket).
	// Guarded by mu.
	oldReads uint32
	// share points to the first of the share policy's states, one per
	// rule in one array, once a sync has shown another node's increments
	// (see Table.shareOf); set under mu, read by decisions.
	share atomic.Pointer[shareState]
}

// observed is a Log rule's counts as the store last decided them (the
// synchronous mode), and when.
type observed struct {
	c  Counts
	at int64
}

// histSlot is one closed bucket of a Buckets rule: its id and total,
// written at rollovers and by the sync loop under the entry's mutex, read
// by decisions. A slot holds bucket id modulo span (Rule.bucketSlot).
type histSlot struct {
	id atomic.Int64
	n  atomic.Int64
}

// Key returns the entry's user key.
func (e *Entry) Key() string { return e.key }

func (e *Entry) has(f uint32) bool { return e.flags.Load()&f != 0 }

// set sets or clears flag f.
func (e *Entry) set(f uint32, on bool) {
	for {
		old := e.flags.Load()
		nu := old &^ f
		if on {
			nu = old | f
		}
		if old == nu || e.flags.CompareAndSwap(old, nu) {
			return
		}
	}
}

// seen records a decision at now.
func (e *Entry) seen(now int64) {
	if e.lastSeen.Load() < now {
		e.lastSeen.Store(now)
	}
}

// mu returns e's mutex, which guards rollovers, takes, acknowledgements,
// eviction and the log of e: one of the table's, chosen by e's address
// (entries are not moved), shared with the entries whose addresses select
// the same. No code holds two entries' mutexes at once.
func (t *Table) mu(e *Entry) *sync.Mutex {
	return &t.locks[uintptr(unsafe.Pointer(e))/entryAlign%lockStripes]
}

// entryAlign is the alignment of entries of one rule in a table that does
// not sync (their size), which Table.mu and Table.count divide addresses
// by so that neighbours select different stripes.
const entryAlign = unsafe.Sizeof(Entry{})

// waitRoll blocks until a rollover under way on e has finished.
func (t *Table) waitRoll(e *Entry) {
	mu := t.mu(e)
	mu.Lock()
	//lint:ignore SA2001 an empty critical section is the point: it waits for the rollover.
	mu.Unlock()
}

// Sizes of the parts of an entry.
const (
	counterSize   = unsafe.Sizeof(counter{})
	syncStateSize = unsafe.Sizeof(syncState{})
)

// entryC is an entry with the counters of rules 1… after it.
type entryC[C any] struct {
	Entry
	//lint:ignore U1000 read and written through offsets from c0 (Entry.ctr)
	c C
}

// entryCX is an entry with the counters of rules 1… and the pointer to
// its extension after it.
type entryCX[C any] struct {
	Entry
	//lint:ignore U1000 read and written through offsets from c0 (Entry.ctr)
	c C
	x atomic.Pointer[entryExt]
}

// entryCS is an entry with the counters of rules 1…, the pointer to its
// extension, the queue's link and the sync states after it.
type entryCS[C, S any] struct {
	Entry
	//lint:ignore U1000 read and written through offsets from c0 (Entry.ctr)
	c C
	x atomic.Pointer[entryExt]
	//lint:ignore U1000 read and written through offsets from c0 (Table.link)
	q *Entry
	s S
}

// offC0 returns the offset of p from e's c0.
func offC0(e *Entry, p unsafe.Pointer) uintptr {
	return uintptr(p) - uintptr(unsafe.Pointer(&e.c0))
}

// allocC returns the allocator of entryC[C].
func allocC[C any]() func() *Entry {
	return func() *Entry { return &new(entryC[C]).Entry }
}

// allocCX returns the allocator of entryCX[C] and the offset of its
// extension pointer from c0.
func allocCX[C any]() (func() *Entry, uintptr) {
	var x entryCX[C]
	return func() *Entry { return &new(entryCX[C]).Entry }, offC0(&x.Entry, unsafe.Pointer(&x.x))
}

// allocCS returns the allocator of entryCS[C, S] and the offsets of its
// extension pointer and its first sync state from c0.
func allocCS[C, S any]() (func() *Entry, uintptr, uintptr) {
	var x entryCS[C, S]
	return func() *Entry { return &new(entryCS[C, S]).Entry },
		offC0(&x.Entry, unsafe.Pointer(&x.x)), offC0(&x.Entry, unsafe.Pointer(&x.s))
}

// entryAlloc returns the allocator of entries of n rules (1 to MaxRules),
// with the pointer to their extension when ext (and always when syncing),
// and their queue link and sync states when syncing; and the offsets of
// the extension pointer (0 without one) and of the first sync state from
// c0. The link is the pointer right before the sync states.
func entryAlloc(n int, syncing, ext bool) (alloc func() *Entry, xOff, syncOff uintptr) {
	switch {
	case !syncing && !ext && n == 1:
		return func() *Entry { return new(Entry) }, 0, 0
	case !syncing && !ext && n == 2:
		return allocC[[1]counter](), 0, 0
	case !syncing && !ext && n <= 4:
		return allocC[[3]counter](), 0, 0
	case !syncing && !ext && n <= 8:
		return allocC[[7]counter](), 0, 0
	case !syncing && !ext:
		return allocC[[MaxRules - 1]counter](), 0, 0
	case !syncing && n == 1:
		alloc, xOff = allocCX[[0]counter]()
	case !syncing && n == 2:
		alloc, xOff = allocCX[[1]counter]()
	case !syncing && n <= 4:
		alloc, xOff = allocCX[[3]counter]()
	case !syncing && n <= 8:
		alloc, xOff = allocCX[[7]counter]()
	case !syncing:
		alloc, xOff = allocCX[[MaxRules - 1]counter]()
	case n == 1:
		return allocCS[[0]counter, [1]syncState]()
	case n == 2:
		return allocCS[[1]counter, [2]syncState]()
	case n <= 4:
		return allocCS[[3]counter, [4]syncState]()
	case n <= 8:
		return allocCS[[7]counter, [8]syncState]()
	default:
		return allocCS[[MaxRules - 1]counter, [MaxRules]syncState]()
	}
	return alloc, xOff, 0
}

// ctr returns rule i's counter of e.
func (e *Entry) ctr(i int) *counter {
	return (*counter)(unsafe.Add(unsafe.Pointer(&e.c0), uintptr(i)*counterSize))
}

// sync returns rule i's sync state of e, in a table that syncs.
func (t *Table) sync(e *Entry, i int) *syncState {
	return (*syncState)(unsafe.Add(unsafe.Pointer(&e.c0), t.syncOff+uintptr(i)*syncStateSize))
}

// link returns e's link in the table's touched queue, in a table that
// syncs: the next entry queued, guarded as queue.go says.
func (t *Table) link(e *Entry) **Entry {
	return (**Entry)(unsafe.Add(unsafe.Pointer(&e.c0), t.syncOff-unsafe.Sizeof((*Entry)(nil))))
}

// xOf returns the pointer to e's extension, in a table whose entries have
// one (Table.xOff is not 0: a table that syncs, or has Buckets or Log
// rules).
func (t *Table) xOf(e *Entry) *atomic.Pointer[entryExt] {
	return (*atomic.Pointer[entryExt])(unsafe.Add(unsafe.Pointer(&e.c0), t.xOff))
}

// ext returns e's extension, or nil when it has none (or cannot have one).
func (t *Table) ext(e *Entry) *entryExt {
	if t.xOff == 0 {
		return nil
	}
	return t.xOf(e).Load()
}

// extend returns e's extension, creating it (without hist) if missing. Call
// with e's mutex held, in a table whose entries have one.
func (t *Table) extend(e *Entry) *entryExt {
	p := t.xOf(e)
	x := p.Load()
	if x == nil {
		x = new(entryExt)
		p.Store(x)
	}
	return x
}

// hasUnsynced reports whether e holds increments the store has not
// acknowledged. Call with e's mutex held.
func (t *Table) hasUnsynced(e *Entry) bool {
	for i := range t.rules {
		if word(e.ctr(i).word.Load()).count() != 0 {
			return true
		}
		if t.syncing {
			if s := t.sync(e, i); s.inflight != 0 || s.adj != 0 || s.prevPending != 0 || s.prevInflight != 0 {
				return true
			}
			if st := t.stale(e, i); st != nil && (st.n != 0 || st.flying != 0 || len(st.back) != 0) {
				return true
			}
		}
	}
	return false
}
