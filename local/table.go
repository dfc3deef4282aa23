package local

import (
	"math/bits"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v3"
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

// hkey is a table key: the user key with its hash, computed once per
// decision for both the shard and the shard's map.
type hkey struct {
	h uint64
	s string
}

func hkeyHash(k hkey, seed uint64) uint64 { return k.h ^ seed }

// shardKeys is the number of keys per shard the table aims for: a shard's
// map grows by copying itself, which blocks writers of that shard (not
// readers) for the length of the copy, so small shards keep a flood of new
// keys from stalling decisions.
const shardKeys = 16 << 10

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
	shards []*xsync.MapOf[hkey, *Entry]

	maxKeys int64
	keys    atomic.Int64 // entries in the maps plus insertions under way
	entries atomic.Int64 // entries in the maps

	rng *rand.Rand // the share policy's dither; used by Settle only, one at a time

	simple  bool  // one Sliding or Fixed rule: the short decision path
	histOff []int // per rule: its first slot in Entry.hist (Buckets)
	hist    int   // Entry.hist's length
	logCap  int64 // the largest Log limit: the ring's length; 0 without Log rules
	logs    bool  // some rule is a Log

	closed    atomic.Bool
	flushed   chan struct{} // closed when the final flush has ended
	flushOnce sync.Once

	qmu   sync.Mutex
	queue []*Entry

	evicted    atomic.Uint64
	dropped    atomic.Uint64
	goneAllow  atomic.Uint64 // decisions of evicted entries
	goneDenied atomic.Uint64
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
			t.hist += int(r.span)
		case Log:
			t.logs, t.logCap = true, max(t.logCap, r.limit)
		}
	}
	t.simple = len(t.rules) == 1 && (t.rules[0].kind == Sliding || t.rules[0].kind == Fixed)
	seed := o.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	t.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t.seed = uintptr(rand.Uint64())
	n := 1
	for n < 256 && int64(n)*shardKeys < t.maxKeys {
		n *= 2
	}
	t.shift = uint(64 - bits.TrailingZeros(uint(n)))
	t.shards = make([]*xsync.MapOf[hkey, *Entry], n)
	for i := range t.shards {
		t.shards[i] = xsync.NewMapOfWithHasher[hkey, *Entry](hkeyHash, xsync.WithGrowOnly())
	}
	return t
}

// Rules returns the table's rules. The caller must not modify the slice.
func (t *Table) Rules() []Rule { return t.rules }

func (t *Table) hash(key string) hkey {
	return hkey{hashString(key, t.seed), key}
}

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

func (t *Table) shard(k hkey) *xsync.MapOf[hkey, *Entry] {
	if t.shift == 64 {
		return t.shards[0]
	}
	return t.shards[k.h>>t.shift]
}

// load returns the entry of key k, if any.
func (t *Table) load(k hkey) (*Entry, bool) { return t.shard(k).Load(k) }

// loadOrCreate returns the entry of k, creating it with its counters in
// the windows of now. It returns nil when the key is missing and the
// table holds MaxKeys entries, or after Close.
func (t *Table) loadOrCreate(k hkey, now int64) *Entry {
	m := t.shard(k)
	if e, ok := m.Load(k); ok {
		return e
	}
	if t.keys.Add(1) > t.maxKeys {
		t.keys.Add(-1)
		return nil
	}
	created := false
	e, loaded := m.LoadOrTryCompute(k, func() (*Entry, bool) {
		if t.closed.Load() {
			return nil, true // checked under the bucket lock: see Close
		}
		created = true
		return t.scratch(k.s, now), false
	})
	if created {
		t.entries.Add(1)
	} else {
		t.keys.Add(-1)
	}
	if !loaded && !created {
		return nil
	}
	return e
}

// scratch returns an entry for key with empty counters in the windows of
// now, not stored in the table.
func (t *Table) scratch(key string, now int64) *Entry {
	e := newEntry(key, len(t.rules), t.syncing, t.hist)
	for i := range t.rules {
		if t.rules[i].counted() {
			id, _ := WindowOf(now, t.rules[i].w)
			e.c[i].win.Store(id)
		}
	}
	e.lastSeen.Store(now)
	return e
}

// Len returns the number of entries; it never exceeds MaxKeys.
func (t *Table) Len() int { return int(t.entries.Load()) }

// rangeEntries calls f for every entry until f returns false.
func (t *Table) rangeEntries(f func(e *Entry) bool) {
	for _, m := range t.shards {
		ok := true
		m.Range(func(_ hkey, e *Entry) bool {
			ok = f(e)
			return ok
		})
		if !ok {
			return
		}
	}
}

// touch queues e for the next sync cycle, unless it is queued already. It
// costs one atomic load when it is.
func (t *Table) touch(e *Entry) {
	if e.has(flagQueued) {
		return
	}
	for {
		old := e.flags.Load()
		if old&flagQueued != 0 {
			return
		}
		if e.flags.CompareAndSwap(old, old|flagQueued) {
			break
		}
	}
	t.qmu.Lock()
	t.queue = append(t.queue, e)
	t.qmu.Unlock()
}

// Touched moves the entries queued since the last call into dst (reusing
// its storage) and unqueues them, so that a decision after this call
// queues its entry again.
func (t *Table) Touched(dst []*Entry) []*Entry {
	t.qmu.Lock()
	dst = append(dst[:0], t.queue...)
	clear(t.queue)
	if cap(t.queue) > 4096 && len(t.queue) < cap(t.queue)/4 {
		t.queue = nil // do not pin the storage of an unusually large cycle
	} else {
		t.queue = t.queue[:0]
	}
	t.qmu.Unlock()
	for _, e := range dst {
		e.set(flagQueued, false)
	}
	return dst
}

// Requeue queues e for the next sync cycle again.
func (t *Table) Requeue(e *Entry) { t.touch(e) }

func (t *Table) addDropped(n int64) {
	if n > 0 {
		t.dropped.Add(uint64(n))
	}
}

// Evict removes the entries that have seen no decision for twice the
// longest window (their counters can no longer influence a decision) and
// hold nothing the store has not acknowledged, and returns how many it
// removed.
func (t *Table) Evict(now int64) int {
	n := 0
	idle := 2 * t.longest
	t.rangeEntries(func(e *Entry) bool {
		if now-e.lastSeen.Load() > idle && t.tryEvict(e, now-idle) {
			n++
		}
		return true
	})
	return n
}

func (t *Table) tryEvict(e *Entry, seenBefore int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if (t.syncing && e.hasUnsynced()) || e.has(flagSealed) {
		return false
	}
	var words [MaxRules]uint64
	for i := range e.c {
		words[i] = e.c[i].word.Load()
	}
	e.set(flagDead, true)
	// A decision that committed after our first look sees the flag and
	// retries on a fresh entry, or we see its increment here and keep e.
	changed := e.lastSeen.Load() > seenBefore
	for i := range e.c {
		changed = changed || e.c[i].word.Load() != words[i]
	}
	if changed {
		e.set(flagDead, false)
		return false
	}
	k := t.hash(e.key)
	t.shard(k).Compute(k, func(old *Entry, loaded bool) (*Entry, bool) {
		return old, loaded && old == e
	})
	t.entries.Add(-1)
	t.keys.Add(-1)
	t.evicted.Add(1)
	t.goneAllow.Add(e.allowed.Load())
	t.goneDenied.Add(e.denied.Load())
	return true
}

// Stats is a snapshot of a table's counters.
type Stats struct {
	Keys     int    // entries in the table
	Evicted  uint64 // entries removed by Evict
	Dropped  uint64 // increments discarded unpushed, as too old to matter
	Allowed  uint64 // admitted decisions, including those of evicted entries
	Denied   uint64 // denied decisions, including those of evicted entries
	Unsynced int64  // increments the store has not acknowledged
}

// Stats walks the table and returns its counters, in time linear in the
// number of entries.
func (t *Table) Stats() Stats {
	s := Stats{
		Evicted: t.evicted.Load(),
		Dropped: t.dropped.Load(),
		Allowed: t.goneAllow.Load(),
		Denied:  t.goneDenied.Load(),
	}
	t.rangeEntries(func(e *Entry) bool {
		s.Keys++
		s.Allowed += e.allowed.Load()
		s.Denied += e.denied.Load()
		if t.syncing {
			e.mu.Lock()
			for i := range e.c {
				s.Unsynced += word(e.c[i].word.Load()).count() + e.s[i].unsynced()
			}
			e.mu.Unlock()
		}
		return true
	})
	return s
}
