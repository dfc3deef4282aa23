package local

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Options configures a Table.
type Options struct {
	// Rules are the limits every key is held to, 1 to MaxRules.
	Rules []Rule
	// MaxKeys bounds the entries held at once, exactly.
	MaxKeys int
	// Syncing makes the table keep what a sync loop needs: the queue of
	// touched entries and every increment until the store acknowledges it.
	Syncing bool
	// ReadPrev is how long after a window's start the sync loop keeps
	// reading the store's counter of the window before, to learn other
	// nodes' late increments (ns). The first sync after a rollover reads it
	// even later.
	ReadPrev int64
	// CountDenied makes denied requests consume quota too.
	CountDenied bool
	// Share selects the share policy of the async mode (share.go) over
	// the plain rule. It needs Syncing.
	Share bool
	// SyncRate is the sync loop's period (ns), for the share policy: a
	// sync's hand-off of a key to the plain rule lasts two periods past
	// that sync of the key, this one or the measured one, the longer.
	SyncRate int64
	// Seed, when not zero, seeds the table's random draws (the share
	// policy's dither), so that a run can be repeated.
	Seed uint64
}

// shardKeys is the number of keys per shard the table aims for at
// MaxKeys, up to maxShards shards: a shard's slots grow by copying into a
// new array, which the decision that creates the key pays for (and which
// blocks the creation of keys in that shard, not decisions on tracked
// keys), so small shards keep a flood of new keys from stalling
// decisions. At 128 keys a shard's array is at most 4 KB, one page of
// memory to fault in; 1,024 keys per shard (32 KB arrays) gave a flood's
// p99.9 decision about twice as long (docs/performance.md, "A flood of new
// keys"). A shard costs 64 bytes until its first key: 512 KB at the
// default MaxKeys.
const (
	shardKeys = 1 << 7
	maxShards = 32 << 10
)

// minSlots is the number of slots of a shard's first slot array.
const minSlots = 16

// slot is one place of a shard's open-addressing table (linear probing):
// empty (e nil, which ends a probe), a removed entry (e is tomb, skipped)
// or an entry with its key's hash. A lookup compares the hashes before it
// reads an entry, so that the entries of other keys in its probe stay out
// of the cache. h is written before e, under the shard's mutex; a lookup
// that reads a slot being filled may pass over it, and then finds the
// entry under the mutex (Table.create).
type slot struct {
	h atomic.Uint64
	e atomic.Pointer[Entry]
}

const slotSize = unsafe.Sizeof(slot{})

// head is what a lookup reads of a shard: its slot array's first slot and
// the array's length − 1, published together. A lookup reads ver, then
// arr, then ver again, and uses them only if ver did not change and is
// even; a writer makes ver odd, stores arr, then stores the even ver that
// carries the new mask. Heads are 16 bytes, four to a cache line, apart
// from the shards' mutexes, so that the head of a random key's shard is
// more often in the cache; a head is written only when its shard's slot
// array is replaced.
type head struct {
	ver atomic.Uint64 // a version count in the high half, the mask in the low half
	arr atomic.Pointer[slot]
}

// shard is one part of the table's map, written under mu; lookups read its
// head (Table.heads) without locks.
type shard struct {
	mu   sync.Mutex
	tab  []slot // the slot array its head publishes; guarded by mu
	live int    // entries in tab; guarded by mu
	used int    // slots not empty (entries and tombstones); guarded by mu
}

// noSlots is every shard's slot array until its first key: one empty
// slot, which makes the first creation grow it. A slot array replaced by
// a larger one is never written again.
var noSlots = make([]slot, 1)

// tomb marks a removed entry's slot, which keeps the removed key's hash.
// Its key is empty, so a lookup of any other key fails at the length
// compare. A lookup of "" (which the table does not forbid) matches it on
// the hash when the removed key was "": slot.is then rejects it by address.
// Its key's bytes start at tombKey, where no caller's string does, so that
// the check is off the path of a key passed as the string the entry keeps.
var (
	tombKey byte
	tomb    = &Entry{key: unsafe.String(&tombKey, 0)}
)

// lockStripes is the number of mutexes a table keeps for its entries: an
// entry's mutex (Table.mu) is the one its address selects. An entry holds
// none itself, so that a one-rule entry fits a cache line; no code holds
// two entries' mutexes at once, and the table's locks are taken in the
// order entry, then shard.
const lockStripes = 1024

// Table maps user keys to entries and makes every decision on them. It is
// safe for concurrent use. Create one with NewTable.
type Table struct {
	rules       []Rule
	longest     int64
	readPrev    int64
	syncing     bool
	countDenied bool
	share       bool

	seed   uintptr // the hash's seed
	smask  uint64  // len(shards) − 1
	heads  []head  // per shard, what lookups read
	shards []shard

	alloc   func() *Entry // newEntry for this table's rules
	syncOff uintptr       // offset of an entry's sync states from its c0
	xOff    uintptr       // offset of an entry's extension pointer from its c0; 0 when it has none

	maxKeys int64
	keys    atomic.Int64 // entries in the maps plus insertions under way
	entries atomic.Int64 // entries in the maps

	rng      *rand.Rand // the share policy's dither; used by Settle only, one at a time
	syncRate int64      // Options.SyncRate

	simple bool  // one Sliding or Fixed rule: the short decision path
	rule0  *Rule // &rules[0]
	// fast selects Allow1's path: 1 for one Sliding or Fixed rule
	// (decide1's), 3 for the same under the share policy, 4 for 2 to 4
	// Sliding or Fixed rules (allowRules), 5 for the same under the share
	// policy, 2 for other sets of up to 4 Sliding, Fixed or Buckets rules
	// without the share policy (decide's), 0 for none.
	fast    int
	histOff []int // per rule: its first slot in Entry.hist (Buckets), followed by its sum slot
	hist    int   // Entry.hist's length
	logCap  int64 // the largest Log limit: the ring's length; 0 without Log rules
	logs    bool  // some rule is a Log

	closed    atomic.Bool
	flushed   chan struct{} // closed when the final flush has ended
	flushOnce sync.Once

	queue  atomic.Pointer[Entry] // the touched queue's head (queue.go)
	qmu    sync.Mutex            // guards taking
	taking *Entry                // the list Detach took, which Touched hands out

	evicted   atomic.Uint64
	dropped   atomic.Uint64
	decisions [countStripes]decisionCount

	locks [lockStripes]sync.Mutex // the entries' mutexes (Table.mu)
}

// NewTable returns an empty table for o.
func NewTable(o Options) *Table {
	t := &Table{
		rules:       append([]Rule(nil), o.Rules...),
		readPrev:    o.ReadPrev,
		syncRate:    o.SyncRate,
		syncing:     o.Syncing,
		countDenied: o.CountDenied,
		share:       o.Share && o.Syncing,
		maxKeys:     int64(o.MaxKeys),
		flushed:     make(chan struct{}),
	}
	for i := range t.rules {
		r := &t.rules[i]
		t.longest = max(t.longest, r.window)
		t.histOff = append(t.histOff, t.hist)
		switch r.kind {
		case Buckets:
			t.hist += int(r.span) + 1
		case Log:
			t.logs, t.logCap = true, max(t.logCap, r.limit)
		}
	}
	if len(t.rules) > 0 {
		t.rule0 = &t.rules[0]
	}
	t.simple = len(t.rules) == 1 && (t.rules[0].kind == Sliding || t.rules[0].kind == Fixed)
	windows, counted := true, true // every rule Sliding or Fixed; every rule counted
	for i := range t.rules {
		k := t.rules[i].kind
		windows = windows && (k == Sliding || k == Fixed)
		counted = counted && t.rules[i].counted()
	}
	switch {
	case t.simple && t.share:
		t.fast = 3
	case t.simple:
		t.fast = 1
	case len(t.rules) > 4:
	case windows && len(t.rules) > 1 && t.share:
		t.fast = 5
	case windows && len(t.rules) > 1:
		t.fast = 4
	case counted && !t.share:
		t.fast = 2
	}
	seed := o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t.seed = uintptr(rand.Uint64())
	n := 1
	for n < maxShards && int64(n)*shardKeys < t.maxKeys {
		n *= 2
	}
	t.smask = uint64(n - 1)
	t.heads = make([]head, n)
	t.shards = make([]shard, n)
	for i := range t.shards {
		t.shards[i].tab = noSlots
		t.heads[i].arr.Store(&noSlots[0])
	}
	t.alloc, t.xOff, t.syncOff = entryAlloc(len(t.rules), t.syncing, t.syncing || t.hist > 0 || t.logs)
	return t
}

// Rules returns the table's rules. The caller must not modify the slice.
func (t *Table) Rules() []Rule { return t.rules }

func (t *Table) hash(key string) uint64 { return hashString(key, t.seed) }

// hashString hashes s with the runtime's string hash (AES-based where the
// CPU has it), called directly: hash/maphash adds some 40 instructions of
// wrappers per call. On 32-bit platforms the hash is spread to 64 bits.
func hashString(s string, seed uintptr) uint64 {
	h := uint64(runtimeMemhash(unsafe.Pointer(unsafe.StringData(s)), seed, uintptr(len(s))))
	if unsafe.Sizeof(uintptr(0)) == 4 {
		h *= 0x9e3779b97f4a7c15
	}
	return h
}

//go:noescape
//go:linkname runtimeMemhash runtime.memhash
func runtimeMemhash(p unsafe.Pointer, h, s uintptr) uintptr

// shardBits is where a hash's bits that select its shard start; the
// slot index in the shard uses its low bits.
const shardBits = 40

// shardOf returns the index of the shard of hash h.
func (t *Table) shardOf(h uint64) uint64 {
	return h >> shardBits & t.smask
}

// headOf returns the head of the shard of hash h.
func (t *Table) headOf(h uint64) *head {
	// &t.heads[t.shardOf(h)] without the bounds check: smask keeps the
	// index in range.
	return (*head)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(t.heads)), t.shardOf(h)*uint64(unsafe.Sizeof(head{}))))
}

// slotAt returns slot i of the slot array that starts at arr, i not above
// its mask.
func slotAt(arr *slot, i uint64) *slot {
	return (*slot)(unsafe.Add(unsafe.Pointer(arr), i*uint64(slotSize)))
}

// is reports whether e is the entry of key, of hash h, which slot s holds
// with its hash: the hashes first, then the keys, whose bytes it does not
// read when both are the same string (the caller's, kept by the entry). A
// tombstone is no key's entry.
func (s *slot) is(e *Entry, h uint64, key string) bool {
	return s.h.Load() == h && len(e.key) == len(key) &&
		(unsafe.StringData(e.key) == unsafe.StringData(key) || e.key == key && e != tomb)
}

// find returns the entry of key, of hash h, if any. It takes no lock
// unless its shard's slot array is being replaced. It finds every entry
// published before it started.
func (t *Table) find(h uint64, key string) *Entry {
	hd := t.headOf(h)
	v := hd.ver.Load()
	arr := hd.arr.Load()
	if hd.ver.Load() != v || v&verOdd != 0 {
		return t.findLocked(t.shardOf(h), h, key) // a writer is replacing the array
	}
	m := uint64(uint32(v))
	for i := h; ; i++ {
		s := slotAt(arr, i&m)
		x := s.e.Load()
		if x == nil {
			return nil
		}
		if s.is(x, h, key) {
			return x
		}
	}
}

// findLocked is find in shard i's slot array as its mutex orders it, once
// the writer that holds it is done.
func (t *Table) findLocked(i, h uint64, key string) *Entry {
	s := &t.shards[i]
	s.mu.Lock()
	tab := s.tab
	s.mu.Unlock()
	m := uint64(len(tab) - 1)
	for i := h; ; i++ {
		x := tab[i&m].e.Load()
		if x == nil {
			return nil
		}
		if tab[i&m].is(x, h, key) {
			return x
		}
	}
}

// The head's version word: the mask in the low half, and a count in the
// high half whose lowest bit is set while a writer replaces the array.
const (
	verMask = 1<<32 - 1
	verOdd  = 1 << 32
)

// publish makes tab s's slot array, for the lookups of shard i. Call with
// s.mu held.
func (t *Table) publish(i uint64, s *shard, tab []slot) {
	hd := &t.heads[i]
	v := hd.ver.Load()&^verMask + verOdd
	hd.ver.Store(v)
	s.tab = tab
	hd.arr.Store(&tab[0])
	hd.ver.Store(v + verOdd | uint64(len(tab)-1))
}

// load returns the entry of key, of hash h, if any. It takes no lock.
func (t *Table) load(h uint64, key string) *Entry {
	return t.find(h, key)
}

// loadOrCreate returns the entry of key, of hash h, creating it with its
// counters in the windows of now. It returns nil when the key is missing
// and the table holds MaxKeys entries, or after Close.
func (t *Table) loadOrCreate(h uint64, key string, now int64) *Entry {
	if e := t.find(h, key); e != nil {
		return e
	}
	return t.create(h, key, now)
}

func (t *Table) create(h uint64, key string, now int64) *Entry {
	// Allocate before taking the shard's mutex: an allocation may have to
	// help the GC, and others wait for the mutex meanwhile. The entry is
	// dropped if the key turns out to exist.
	var x *Entry
	if t.keys.Load() < t.maxKeys {
		x = t.scratch(key, now)
	}
	si := t.shardOf(h)
	s := &t.shards[si]
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab
	m := uint64(len(tab) - 1)
	free, empty := -1, false // the slot to fill; whether it is empty (not a tombstone)
	for i := h; ; i++ {
		y := tab[i&m].e.Load()
		if y == nil {
			if free < 0 {
				free, empty = int(i&m), true
			}
			break
		}
		if y == tomb {
			if free < 0 {
				free = int(i & m)
			}
			continue
		}
		if tab[i&m].is(y, h, key) {
			return y
		}
	}
	// Checked under the shard's mutex, which Entries takes: see Close.
	if t.closed.Load() {
		return nil
	}
	if t.keys.Add(1) > t.maxKeys {
		t.keys.Add(-1)
		return nil
	}
	if x == nil {
		x = t.scratch(key, now)
	}
	s.live++
	t.entries.Add(1)
	if empty {
		s.used++
	}
	if s.used > len(tab)/4*3 {
		t.publish(si, s, s.grown(x, h))
		return x
	}
	tab[free].h.Store(h)
	tab[free].e.Store(x)
	return x
}

// grown returns a copy of s's slots, without tombstones, at most half full
// after adding x, of hash h, with x in. It reads the old array's hashes,
// not its entries. Call with s.mu held.
func (s *shard) grown(x *Entry, h uint64) []slot {
	n := minSlots
	for n < 2*s.live {
		n *= 2
	}
	nu := make([]slot, n)
	m := uint64(n - 1)
	put := func(e *Entry, h uint64) {
		for i := h; ; i++ {
			if nu[i&m].e.Load() == nil {
				nu[i&m].h.Store(h)
				nu[i&m].e.Store(e)
				return
			}
		}
	}
	for i := range s.tab {
		if e := s.tab[i].e.Load(); e != nil && e != tomb {
			put(e, s.tab[i].h.Load())
		}
	}
	put(x, h)
	s.used = s.live
	return nu
}

// remove takes e, of hash h, out of its shard, if it is there.
func (t *Table) remove(h uint64, e *Entry) bool {
	s := &t.shards[t.shardOf(h)]
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab
	m := uint64(len(tab) - 1)
	for i := h; ; i++ {
		switch x := tab[i&m].e.Load(); x {
		case nil:
			return false
		case e:
			tab[i&m].e.Store(tomb)
			s.live--
			return true
		}
	}
}

// scratch returns an entry for key with empty counters in the windows of
// now, not stored in the table.
func (t *Table) scratch(key string, now int64) *Entry {
	e := t.alloc()
	e.key = key
	if t.hist > 0 {
		t.xOf(e).Store(&entryExt{hist: make([]histSlot, t.hist)})
	}
	for i := range t.rules {
		if t.rules[i].counted() {
			id, _ := WindowOf(now, t.rules[i].w)
			e.ctr(i).win.Store(id)
			if t.syncing && t.rules[i].weighsPrev() {
				// The first take reads the previous window's total: the
				// other nodes may have counted in it; for a Buckets rule,
				// every closed bucket of its window.
				e.prevReads |= (readFirst | readUntil) << i
				if t.rules[i].kind == Buckets {
					t.xOf(e).Load().oldReads |= oldAll << i
				}
			}
		}
	}
	e.lastSeen.Store(now)
	return e
}

// Len returns the number of entries; it never exceeds MaxKeys.
func (t *Table) Len() int { return int(t.entries.Load()) }

// rangeEntries calls f for every entry until f returns false. It sees
// every entry created before it reached the entry's shard.
func (t *Table) rangeEntries(f func(e *Entry) bool) {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock() // orders the creations before it
		tab := s.tab
		s.mu.Unlock()
		for j := range tab {
			if e := tab[j].e.Load(); e != nil && e != tomb && !f(e) {
				return
			}
		}
	}
}
