// Package local holds one node's rate-limit counters and makes every
// decision on them: a lock-free table from user key to Entry (sharded
// open-addressing hash tables read without locks, table.go), one counter
// per rule updated by atomic operations, the window arithmetic
// (window.go), and the handoff with the sync loop (handoff.go) through
// which increments reach the store.
//
// A decision loads an entry and counts its cost with one compare-and-swap
// per rule; it takes a lock only at a window rollover, once per key and
// rule per window. All of a counter's state changes here: the sync loop
// only carries Pushes to the store and hands back what the store said.
//
// Users of hybridlimit never import this package; the root package and
// the sync loop do.
package local
