package local

import (
	"math/bits"
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
	// ReadPrev is how long after a rollover the sync loop keeps reading
	// the store's counter of the window that became the previous one, to
	// learn other nodes' late increments (ns).
	ReadPrev int64
	// CountDenied makes denied requests consume quota too.
	CountDenied bool
	// Share selects the share policy of the async mode (share.go) over
	// the plain rule. It needs Syncing.
	Share bool
	// Seed, when not zero, seeds the table's random draws (the share
	// policy's dither), so that a run can be repeated.
	Seed uint64
}

// shardKeys is the number of keys per shard the table aims for at
// MaxKeys, up to maxShards shards: a shard's slots grow by copying, which
// blocks the creation of keys in that shard (not decisions on tracked
// keys) for the length of the copy, so small shards keep a flood of new
// keys from stalling decisions. A shard costs 64 bytes until its first key.
const (
	shardKeys = 1 << 10
	maxShards = 4 << 10
)

// minSlots is the number of slots of a shard's first slot array.
const minSlots = 16

// noSlots is every shard's slot array until its first key: one empty
// slot, which makes the first creation grow it.
var noSlots = &slots{e: make([]atomic.Pointer[Entry], 1), h: make([]uint32, 1)}

// shard is one part of the table's map: an open-addressing hash table of
// entries with linear probing, read without locks, written under mu.
type shard struct {
	mu   sync.Mutex
	tab  atomic.Pointer[slots]
	live int // entries in tab; guarded by mu
	used int // slots not empty (entries and tombstones); guarded by mu
	_    [32]byte
}

// slots is a shard's slot array, a power of two long, with at least one
// empty slot. A slot holds nil (empty, ends a probe), tomb (a removed
// entry, skipped) or an entry. A slot array replaced by a larger one is
// never written again.
type slots struct {
	e []atomic.Pointer[Entry]
	h []uint32 // the low half of each entry's hash, for grow; guarded by the shard's mutex
}

// tomb marks a removed entry's slot. Its key is empty, which no user key
// is, so lookups pass over it.
var tomb = new(Entry)

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
	shift  uint    // 64 − log2(len(shards))
	shards []shard

	alloc   func() *Entry // newEntry for this table's rules
	syncOff uintptr       // offset of an entry's sync states from its c0

	maxKeys int64
	keys    atomic.Int64 // entries in the maps plus insertions under way
	entries atomic.Int64 // entries in the maps

	rng *rand.Rand // the share policy's dither; used by Settle only, one at a time

	simple bool  // one Sliding or Fixed rule: the short decision path
	rule0  *Rule // &rules[0]
	// fast selects Allow1's path: 1 for one Sliding or Fixed rule
	// (decide1's), 3 for the same under the share policy, 2 for up to 4
	// Sliding, Fixed or Buckets rules without the share policy (decide's),
	// 4 for the same when they are 2 to 4 Sliding or Fixed rules, 0 for
	// none.
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
}

// NewTable returns an empty table for o.
func NewTable(o Options) *Table {
	t := &Table{
		rules:       append([]Rule(nil), o.Rules...),
		readPrev:    o.ReadPrev,
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
	if len(t.rules) <= 4 && !t.share {
		t.fast = 2
		for i := range t.rules {
			if !t.rules[i].counted() {
				t.fast = 0
			}
		}
	}
	if t.fast == 2 && len(t.rules) > 1 {
		t.fast = 4
		for i := range t.rules {
			if k := t.rules[i].kind; k != Sliding && k != Fixed {
				t.fast = 2
			}
		}
	}
	switch {
	case t.simple && t.share:
		t.fast = 3
	case t.simple:
		t.fast = 1
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
	t.shift = uint(64 - bits.TrailingZeros(uint(n)))
	t.shards = make([]shard, n)
	for i := range t.shards {
		t.shards[i].tab.Store(noSlots)
	}
	t.alloc, t.syncOff = entryAlloc(len(t.rules), t.syncing)
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

// shardOf returns the shard of hash h: its high bits (the slot index
// uses the low ones).
func (t *Table) shardOf(h uint64) *shard {
	return &t.shards[h>>t.shift] // 0 when shift is 64
}

// load returns the entry of key, of hash h, if any. It takes no lock.
func (t *Table) load(h uint64, key string) *Entry {
	e := t.shardOf(h).tab.Load().e
	m := uint64(len(e) - 1)
	for i := h; ; i++ {
		x := e[i&m].Load()
		if x == nil || x.key == key {
			return x
		}
	}
}

// loadOrCreate returns the entry of key, of hash h, creating it with its
// counters in the windows of now. It returns nil when the key is missing
// and the table holds MaxKeys entries, or after Close.
func (t *Table) loadOrCreate(h uint64, key string, now int64) *Entry {
	if e := t.load(h, key); e != nil {
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
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	tab := s.tab.Load()
	e := tab.e
	m := uint64(len(e) - 1)
	free, empty := -1, false // the slot to fill; whether it is empty (not a tombstone)
	for i := h; ; i++ {
		y := e[i&m].Load()
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
		if y.key == key {
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
	if s.used > len(e)/4*3 {
		s.grow(x, h)
		return x
	}
	tab.h[free] = uint32(h)
	e[free].Store(x)
	return x
}

// grow replaces s's slots by an array at most half full after adding x,
// of hash h, and publishes them with x in. It reads the old array's
// hashes, not its entries. Call with s.mu held.
func (s *shard) grow(x *Entry, h uint64) {
	n := minSlots
	for n < 2*s.live {
		n *= 2
	}
	nu := &slots{e: make([]atomic.Pointer[Entry], n), h: make([]uint32, n)}
	m := uint32(n - 1)
	put := func(e *Entry, h uint32) {
		for i := h; ; i++ {
			if nu.e[i&m].Load() == nil {
				nu.h[i&m] = h
				nu.e[i&m].Store(e)
				return
			}
		}
	}
	old := s.tab.Load()
	for i := range old.e {
		if e := old.e[i].Load(); e != nil && e != tomb {
			put(e, old.h[i])
		}
	}
	put(x, uint32(h))
	s.used = s.live
	s.tab.Store(nu)
}

// remove takes e, of hash h, out of its shard, if it is there.
func (t *Table) remove(h uint64, e *Entry) bool {
	s := t.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.tab.Load().e
	m := uint64(len(sl) - 1)
	for i := h; ; i++ {
		switch x := sl[i&m].Load(); x {
		case nil:
			return false
		case e:
			sl[i&m].Store(tomb)
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
		e.x.Store(&entryExt{hist: make([]histSlot, t.hist)})
	}
	for i := range t.rules {
		if t.rules[i].counted() {
			id, _ := WindowOf(now, t.rules[i].w)
			e.ctr(i).win.Store(id)
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
		sl := s.tab.Load().e
		s.mu.Unlock()
		for j := range sl {
			if e := sl[j].Load(); e != nil && e != tomb && !f(e) {
				return
			}
		}
	}
}
