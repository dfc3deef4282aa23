package local

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEntryIsOneCacheLine checks that a one-rule entry is 64 bytes, with
// every field a one-rule decision reads in them, and that a table of one
// rule that does not sync allocates its entries at multiples of 64 bytes:
// a decision on a key out of the cache then misses one line for its entry.
func TestEntryIsOneCacheLine(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is sized for 64-bit platforms")
	}
	var e Entry
	require.Equal(t, uintptr(64), unsafe.Sizeof(e))
	for name, end := range map[string]uintptr{
		"key":      unsafe.Offsetof(e.key) + unsafe.Sizeof(e.key),
		"lastSeen": unsafe.Offsetof(e.lastSeen) + unsafe.Sizeof(e.lastSeen),
		"flags":    unsafe.Offsetof(e.flags) + unsafe.Sizeof(e.flags),
		"c0":       unsafe.Offsetof(e.c0) + unsafe.Sizeof(e.c0),
	} {
		assert.LessOrEqual(t, end, uintptr(64), name)
	}
	for _, kind := range []Kind{Sliding, Fixed, GCRA} {
		tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: kind, Limit: 10, Window: time.Second})}, MaxKeys: 1000})
		require.Zero(t, tb.xOff, "%v: no extension", kind)
		for i := range 1000 {
			e := tb.alloc()
			require.Zero(t, uintptr(unsafe.Pointer(e))%64, "%v: entry %d at %p", kind, i, e)
		}
	}
}

// TestSyncingEntrySize checks that a one-rule entry of a table that syncs
// is 112 bytes, the allocator's 112-byte size class: 48 bytes more than in
// a table that does not (extension pointer, queue link, sync state).
func TestSyncingEntrySize(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is sized for 64-bit platforms")
	}
	assert.Equal(t, uintptr(112), unsafe.Sizeof(entryCS[[0]counter, [1]syncState]{}))
	assert.Equal(t, uintptr(32), syncStateSize)
	// A rule's share state, allocated once another node pushes the key:
	// one rule's fills the allocator's 128-byte size class.
	assert.Equal(t, uintptr(128), shareStateSize)
}

// TestEntryLayouts writes every part of entries of every layout (rules,
// syncing, extension) through the offsets the table uses. Under -race the
// pointer checks (checkptr) fail any offset that leaves the allocation.
func TestEntryLayouts(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 5, 8, 9, MaxRules} {
		for _, syncing := range []bool{false, true} {
			for _, ext := range []bool{false, true} {
				alloc, xOff, syncOff := entryAlloc(n, syncing, ext)
				tb := &Table{xOff: xOff, syncOff: syncOff, syncing: syncing}
				name := fmt.Sprintf("rules=%d/syncing=%v/ext=%v", n, syncing, ext)
				require.Equal(t, syncing || ext, xOff != 0, name)
				e := alloc()
				for i := range n {
					e.ctr(i).base.Store(int64(i + 1))
				}
				if xOff != 0 {
					require.Nil(t, tb.ext(e), name)
					tb.extend(e).stale = make([]staleCount, n)
					require.NotNil(t, tb.ext(e), name)
				} else {
					require.Nil(t, tb.ext(e), name)
				}
				if syncing {
					*tb.link(e) = e
					for i := range n {
						tb.sync(e, i).prevInflight = int64(i + 1)
					}
					assert.Equal(t, e, *tb.link(e), name)
				}
				for i := range n {
					assert.Equal(t, int64(i+1), e.ctr(i).base.Load(), "%s: rule %d's counter", name, i)
					if syncing {
						assert.Equal(t, int64(i+1), tb.sync(e, i).prevInflight, "%s: rule %d's sync state", name, i)
					}
				}
			}
		}
	}
}

// TestFindComparesHashes puts keys at chosen hashes: a lookup passes over
// the slots of other hashes without reading their entries, and over
// entries of its hash whose key differs.
func TestFindComparesHashes(t *testing.T) {
	tb := newTestTable(t, false, 100)
	const h = 7
	a := tb.create(h, "a", 0)
	b := tb.create(h, "b", 0)
	c := tb.create(h+1, "c", 0) // probes past a and b
	require.NotNil(t, a)
	require.NotNil(t, b)
	require.NotNil(t, c)
	assert.NotSame(t, a, b)
	assert.Same(t, a, tb.find(h, "a"))
	assert.Same(t, b, tb.find(h, "b"))
	assert.Same(t, c, tb.find(h+1, "c"))
	assert.Nil(t, tb.find(h, "c"), "c under another hash")
	// The shard's array has minSlots slots: hash h+minSlots starts its
	// probe at a's slot, which holds its key under another hash.
	require.Len(t, tb.shards[0].tab, minSlots)
	assert.Nil(t, tb.find(h+minSlots, "a"), "a's key under another hash: the hashes differ")
	assert.Same(t, a, tb.create(h, "a", 0), "create finds the entry too")
	require.True(t, tb.remove(h, a))
	assert.Nil(t, tb.find(h, "a"))
	assert.Same(t, b, tb.find(h, "b"), "past a's tombstone")
	assert.Same(t, c, tb.find(h+1, "c"))
}

// TestFindWhileGrowing looks up keys while another goroutine creates keys
// in the same 8 shards, growing each one's slot array 4 times (16 slots to
// 256): a key created before a lookup starts is always found.
func TestFindWhileGrowing(t *testing.T) {
	const keys = 8 * shardKeys
	tb := NewTable(Options{Rules: []Rule{NewRule(Spec{Kind: Sliding, Limit: 10, Window: time.Second})}, MaxKeys: keys})
	require.Len(t, tb.shards, 8)
	name := func(i int) string { return fmt.Sprintf("key-%d", i) }
	var created atomic.Int64
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; created.Load() < keys; j++ {
				n := int(created.Load())
				if n == 0 {
					continue
				}
				i := (j*7919 + g) % n
				if tb.load(tb.hash(name(i)), name(i)) == nil {
					t.Errorf("key %d of %d created: not found", i, n)
					return
				}
			}
		}()
	}
	for i := range keys {
		require.NotNil(t, tb.loadOrCreate(tb.hash(name(i)), name(i), 0))
		created.Store(int64(i + 1))
	}
	wg.Wait()
	assert.Equal(t, keys, tb.Len())
	for i := range tb.shards {
		assert.GreaterOrEqual(t, len(tb.shards[i].tab), 8*minSlots, "shard %d grew", i)
	}
}

// TestStripesSpreadEntries checks that consecutive one-rule entries select
// different decision counters and different mutexes.
func TestStripesSpreadEntries(t *testing.T) {
	tb := newTestTable(t, false, 100)
	counts, locks := map[*decisionCount]bool{}, map[*sync.Mutex]bool{}
	for range countStripes {
		e := tb.alloc()
		counts[tb.count(e)] = true
		locks[tb.mu(e)] = true
	}
	assert.Greater(t, len(counts), countStripes/2, "decision counters")
	assert.Greater(t, len(locks), countStripes/2, "mutexes")
}
