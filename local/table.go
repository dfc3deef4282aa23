// Package local holds one node's in-memory rate-limit counters: a lock-free
// table (github.com/puzpuzpuz/xsync/v3) from user key to Entry, with one
// Counter per rule updated by atomic operations.
//
// A decision loads an entry and commits its increments with a
// compare-and-swap per rule; it takes no lock except at a window rollover,
// once per key and rule per window. The sync loop takes each touched entry's
// pending increments (Entry.Take), pushes them, and writes the merged
// cluster totals back (Entry.Ack) or hands the increments back on failure
// (Entry.Fail), so nothing is lost or counted twice.
//
// Users of hybridlimit never touch this package; it is exported for the
// sync loop and for tests.
package local

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v3"
)

// Table maps user keys to entries. It is safe for concurrent use; the zero
// value is not usable, create one with NewTable.
type Table struct {
	m       *xsync.MapOf[string, *Entry]
	windows []int64 // window size per rule, ns
	longest int64
	maxKeys int
	syncing bool

	qmu   sync.Mutex
	queue []*Entry

	evicted    atomic.Uint64
	dropped    atomic.Uint64
	goneAllow  atomic.Uint64 // decisions of evicted entries
	goneDenied atomic.Uint64
}

// keySeed randomizes key hashes per process.
var keySeed = maphash.MakeSeed()

// hashKey hashes a key for the table with the runtime's AES-based string
// hash (xsync's default hasher goes through the slower generic typehash).
func hashKey(key string, seed uint64) uint64 {
	return maphash.String(keySeed, key) ^ seed
}

// NewTable returns a table for rules with the given window sizes (ns),
// holding at most maxKeys entries. With syncing set, the table keeps what
// the sync loop needs: the touched queue and the increments of the previous
// window that are still to be pushed.
func NewTable(windows []int64, maxKeys int, syncing bool) *Table {
	t := &Table{
		m:       xsync.NewMapOfWithHasher[string, *Entry](hashKey),
		windows: append([]int64(nil), windows...),
		maxKeys: maxKeys,
		syncing: syncing,
	}
	for _, w := range windows {
		t.longest = max(t.longest, w)
	}
	return t
}

// Windows returns the window size of each rule in nanoseconds. The caller
// must not modify the slice.
func (t *Table) Windows() []int64 { return t.windows }

// Load returns the entry of key, if the table has one.
func (t *Table) Load(key string) (*Entry, bool) { return t.m.Load(key) }

// LoadOrCreate returns the entry of key, creating it with its counters in
// the windows of now if it is missing. It returns nil if the key is missing
// and the table already holds maxKeys entries.
func (t *Table) LoadOrCreate(key string, now int64) *Entry {
	if e, ok := t.m.Load(key); ok {
		return e
	}
	if t.m.Size() >= t.maxKeys {
		return nil
	}
	e, _ := t.m.LoadOrCompute(key, func() *Entry { return t.Scratch(key, now) })
	return e
}

// Len returns the number of entries.
func (t *Table) Len() int { return t.m.Size() }

// Range calls f for every entry until f returns false.
func (t *Table) Range(f func(e *Entry) bool) {
	t.m.Range(func(_ string, e *Entry) bool { return f(e) })
}

// Touch puts e in the queue of entries the next sync cycle handles, unless
// it is there already. It costs one atomic load when it is.
func (t *Table) Touch(e *Entry) {
	if e.queued.Load() || !e.queued.CompareAndSwap(false, true) {
		return
	}
	t.qmu.Lock()
	t.queue = append(t.queue, e)
	t.qmu.Unlock()
}

// Drain moves the queued entries into dst (reusing its storage) and marks
// them unqueued, so a decision after this call queues its entry again.
func (t *Table) Drain(dst []*Entry) []*Entry {
	t.qmu.Lock()
	dst = append(dst[:0], t.queue...)
	clear(t.queue)
	t.queue = t.queue[:0]
	t.qmu.Unlock()
	for _, e := range dst {
		e.queued.Store(false)
	}
	return dst
}

// AddDropped records increments discarded because they belonged to windows
// that can no longer influence a decision.
func (t *Table) AddDropped(n int64) {
	if n > 0 {
		t.dropped.Add(uint64(n))
	}
}

// Evict removes the entries that have seen no decision for twice the
// longest window (after that their counters can no longer influence a
// decision) and have nothing left to push. It returns how many it removed.
func (t *Table) Evict(now int64) int {
	n := 0
	idle := 2 * t.longest
	t.m.Range(func(key string, e *Entry) bool {
		if now-e.lastSeen.Load() <= idle {
			return true
		}
		if t.tryEvict(e, now-idle) {
			n++
		}
		return true
	})
	return n
}

func (t *Table) tryEvict(e *Entry, seenBefore int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t.syncing && e.hasUnsynced() {
		return false
	}
	words := make([]uint64, 0, 8)
	for i := range e.C {
		words = append(words, e.C[i].word.Load())
	}
	e.dead.Store(true)
	// A decision that committed after our first look sees dead and retries,
	// or we see its increment here and keep the entry.
	changed := e.lastSeen.Load() > seenBefore
	for i := range e.C {
		changed = changed || e.C[i].word.Load() != words[i]
	}
	if changed {
		e.dead.Store(false)
		return false
	}
	t.m.Compute(e.Key, func(old *Entry, loaded bool) (*Entry, bool) {
		return old, loaded && old == e
	})
	t.evicted.Add(1)
	t.goneAllow.Add(e.allowed.Load())
	t.goneDenied.Add(e.denied.Load())
	return true
}

// hasUnsynced reports whether e holds increments not yet acknowledged by
// the store. Call with e.mu held.
func (e *Entry) hasUnsynced() bool {
	for i := range e.C {
		c := &e.C[i]
		if Word(c.word.Load()).Count() != 0 || c.inflight.Load() != 0 || c.prevPending != 0 || c.prevInflight != 0 {
			return true
		}
	}
	return false
}

// Stats is a snapshot of a table's counters.
type Stats struct {
	Keys     int    // entries in the table
	Evicted  uint64 // entries removed by Evict
	Dropped  uint64 // increments discarded as too old to matter
	Allowed  uint64 // admitted decisions, including those of evicted entries
	Denied   uint64 // denied decisions, including those of evicted entries
	Unsynced int64  // increments not yet acknowledged by the store
}

// Stats walks the table and returns its counters. It costs time linear in
// the number of entries.
func (t *Table) Stats() Stats {
	s := Stats{
		Evicted: t.evicted.Load(),
		Dropped: t.dropped.Load(),
		Allowed: t.goneAllow.Load(),
		Denied:  t.goneDenied.Load(),
	}
	t.m.Range(func(_ string, e *Entry) bool {
		s.Keys++
		s.Allowed += e.allowed.Load()
		s.Denied += e.denied.Load()
		if t.syncing {
			e.mu.Lock()
			for i := range e.C {
				c := &e.C[i]
				s.Unsynced += Word(c.word.Load()).Count() + c.inflight.Load() + c.prevPending + c.prevInflight
			}
			e.mu.Unlock()
		}
		return true
	})
	return s
}

// Scratch returns an entry for key with empty counters in the windows of
// now, without storing it in the table: decisions on it are not tracked.
func (t *Table) Scratch(key string, now int64) *Entry {
	e := newEntry(key, len(t.windows))
	for i, w := range t.windows {
		e.C[i].win.Store(now / w)
		e.C[i].expWin = -1
	}
	e.lastSeen.Store(now)
	return e
}
