package main

import (
	"hash/fnv"
	"strings"
)

// source is the request stream of one configuration, in time order: the
// generated traffic, or a trace (-trace).
type source interface {
	// next returns the next request, or false at the end of the run or on
	// an error.
	next() (request, bool)
	// err is why next returned false early, nil at the end of the run.
	err() error
	close() error
}

// newSource returns the requests of a run of o: a fresh stream each call,
// so every configuration of a sweep sees the same requests.
func newSource(o *options) (source, error) {
	if o.Trace != "" {
		return newTraceSource(o)
	}
	return newTraffic(o), nil
}

// runKeys returns the user keys of a run of o, by key index.
func runKeys(o *options) []string {
	if o.trace != nil {
		return o.trace.names
	}
	return keyNames(o.Keys)
}

// Ways of spreading requests over the nodes (-spread).
const (
	spreadRR   = "rr"   // round robin over the nodes present
	spreadHash = "hash" // a hash of the key over the nodes present
)

var spreads = []string{spreadRR, spreadHash}

func validSpread(s string) bool { return s == spreadRR || s == spreadHash }

func spreadNames() string { return strings.Join(spreads, ", ") }

// keyHashes returns the FNV-1a hash of every key, for -spread hash.
func keyHashes(names []string) []uint32 {
	out := make([]uint32, len(names))
	for i, k := range names {
		h := fnv.New32a()
		_, _ = h.Write([]byte(k))
		out[i] = h.Sum32()
	}
	return out
}

// spreader picks the node of each request: with -pattern sticky a share
// proportional to 1/(rank+1); with -spread hash a hash of the key; else
// round robin. It returns a rank among n nodes present.
type spreader struct {
	sticky bool
	hashes []uint32 // nil: round robin
	rr     int
}

func newSpreader(o *options, names []string) *spreader {
	s := &spreader{sticky: o.Pattern == "sticky"}
	if o.Spread == spreadHash {
		s.hashes = keyHashes(names)
	}
	return s
}

func (s *spreader) pick(q request, n int) int {
	switch {
	case s.sticky:
		return stickyNode(q.draw, n)
	case s.hashes != nil:
		return int(s.hashes[q.key] % uint32(n))
	}
	s.rr++
	return s.rr % n
}
