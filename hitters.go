package hybridlimit

import (
	"context"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/hybridlimit/hybridlimit/store"
)

// Who hit the limit: a decision may carry a tag (the user behind an IP
// key, say). For keys at or near their limit, each node keeps a small
// heavy-hitters sketch of their tags (Space-Saving, sketchSize tags per
// key); in ModeAsync and ModeSynchronous the nodes add what they saw to
// the store (a sorted set per key, its top storeTags kept, expiring two
// of the key's longest windows after the last addition), so
// Contributors reports the cluster's view.

const (
	sketchSize    = 16   // tags a node keeps per key
	storeTags     = 32   // tags the store keeps per key
	maxSketchKeys = 4096 // keys a node keeps sketches of at once
)

// Contributor is a tag and the cost it was counted for on a key.
type Contributor struct {
	Tag  string // the tag given to AllowTagged
	Cost int64  // the cost counted for it (an estimate: see Contributors)
}

// sketch is one key's Space-Saving summary: at most sketchSize tags with
// the cost counted for each (an overestimate by at most err), and what is
// not yet in the store.
type sketch struct {
	mu      sync.Mutex
	tags    [sketchSize]string
	cost    [sketchSize]int64
	err     [sketchSize]int64
	pending [sketchSize]int64
	dirty   bool
	last    int64 // ns of the last addition
	longest time.Duration
}

// add counts cost n for tag at now.
func (s *sketch) add(tag string, n, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last, s.dirty = now, true
	low := 0
	for i := range s.tags {
		switch {
		case s.tags[i] == tag && s.cost[i] > 0:
			s.cost[i] = satAdd(s.cost[i], n)
			s.pending[i] = satAdd(s.pending[i], n)
			return
		case s.cost[i] == 0:
			s.tags[i], s.cost[i], s.err[i], s.pending[i] = tag, n, 0, n
			return
		case s.cost[i] < s.cost[low]:
			low = i
		}
	}
	// Full: the tag takes the place of the least counted one, and its count
	// (an overestimate by what the place held).
	s.tags[low], s.err[low] = tag, s.cost[low]
	s.cost[low] = satAdd(s.cost[low], n)
	s.pending[low] = n
}

// satAdd returns a + b for a, b ≥ 0, at most MaxInt64: a key's tags are
// counted for as long as it stays busy.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// top returns the sketch's tags, most counted first.
func (s *sketch) top() []Contributor {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Contributor
	for i := range s.tags {
		if s.cost[i] > 0 {
			out = append(out, Contributor{s.tags[i], s.cost[i]})
		}
	}
	sortContributors(out)
	return out
}

// take returns what is not yet in the store, and forgets it.
func (s *sketch) take() []store.TagCount {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dirty {
		return nil
	}
	var out []store.TagCount
	for i := range s.tags {
		if s.pending[i] > 0 {
			out = append(out, store.TagCount{Tag: s.tags[i], Count: s.pending[i]})
			s.pending[i] = 0
		}
	}
	s.dirty = false
	return out
}

func sortContributors(cs []Contributor) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].Cost != cs[j].Cost {
			return cs[i].Cost > cs[j].Cost
		}
		return cs[i].Tag < cs[j].Tag
	})
}

// hitters holds the sketches of a node.
type hitters struct {
	m  *xsync.MapOf[string, *sketch]
	st store.TagStore // nil in ModeLocal, or when the store keeps no tags
	mu sync.Mutex     // one flush at a time
}

// AllowTagged is AllowN for a request made by tag: when the key is at or
// near its limit (denied, or admitted with at most a quarter of its
// tightest rule left: of its Limit, or of a bucket's Burst), the tag's
// cost is counted towards the key's contributors (see Contributors). An
// empty tag counts nothing; a tag longer than Config.MaxKeyLen counts as
// its first MaxKeyLen bytes (a tag taken from requests cannot grow the
// node's or the store's memory past that). It does not allocate, but for
// the first such decision on a key, and for a tag cut so.
func (l *Limiter) AllowTagged(ctx context.Context, key, tag string, n int64) (Result, error) {
	res, err := l.AllowN(ctx, key, n)
	if err == nil && tag != "" && (!res.Allowed || res.Remaining <= l.capacity(&res)/4) {
		if len(tag) > l.cfg.MaxKeyLen {
			tag = strings.Clone(tag[:l.cfg.MaxKeyLen]) // not a view that keeps the whole tag
		}
		l.noteTag(key, tag, n, res.Tier)
	}
	return res, err
}

// capacity returns what res's rule admits when untouched, which its
// Remaining counts down from: its Limit, or a bucket's Burst.
func (l *Limiter) capacity(res *Result) int64 {
	t := l.def
	if res.Tier != "" {
		t = l.byName[res.Tier]
	}
	if t == nil || res.Rule < 0 || res.Rule >= len(t.cfg) {
		return res.Limit
	}
	return t.cfg[res.Rule].maxCost()
}

// noteTag counts cost n of tag towards key's contributors.
func (l *Limiter) noteTag(key, tag string, n int64, tierName string) {
	now := l.clock.now()
	s, ok := l.hit.m.Load(key)
	if !ok {
		if l.hit.m.Size() >= maxSketchKeys {
			l.sweepSketches(now)
			if l.hit.m.Size() >= maxSketchKeys {
				return
			}
		}
		longest := l.def.longest
		if t := l.byName[tierName]; t != nil {
			longest = t.longest
		}
		s, _ = l.hit.m.LoadOrCompute(key, func() *sketch { return &sketch{longest: longest} })
	}
	s.add(tag, n, now)
}

// sweepSketches forgets the sketches of keys not seen for two of their
// longest windows, whose contributors are gone from the store too (once
// flushed there; in ModeLocal, without a store, at once).
func (l *Limiter) sweepSketches(now int64) {
	local := l.hit.st == nil
	l.hit.m.Range(func(k string, s *sketch) bool {
		s.mu.Lock()
		old := now-s.last > int64(2*s.longest) && (!s.dirty || local)
		s.mu.Unlock()
		if old {
			l.hit.m.Delete(k)
		}
		return true
	})
}

// flushTags adds what the sketches saw since the last flush to the store.
func (l *Limiter) flushTags(ctx context.Context) error {
	if l.hit.st == nil {
		return nil
	}
	l.hit.mu.Lock()
	defer l.hit.mu.Unlock()
	var first error
	l.hit.m.Range(func(k string, s *sketch) bool {
		tags := s.take()
		if len(tags) == 0 {
			return true
		}
		if err := l.hit.st.AddTags(ctx, l.cfg.Prefix, k, tags, storeTags, 2*s.longest); err != nil {
			if first == nil {
				first = err
			}
			s.mu.Lock()
			for _, tc := range tags { // keep them for the next flush
				for i := range s.tags {
					if s.tags[i] == tc.Tag {
						s.pending[i] = satAdd(s.pending[i], tc.Count)
						s.dirty = true
					}
				}
			}
			s.mu.Unlock()
		}
		return ctx.Err() == nil
	})
	l.sweepSketches(l.clock.now())
	return first
}

// Contributors returns the tags counted towards key's contributors (see
// AllowTagged), most first: in ModeAsync and ModeSynchronous the
// cluster's, as the store holds them (this node's additions of the last
// sync period may not be there yet), in ModeLocal this node's. Counts are
// approximate: each node keeps its 16 most counted tags per key, and the
// store its 32.
func (l *Limiter) Contributors(ctx context.Context, key string) ([]Contributor, error) {
	if l.closed.Load() {
		return nil, ErrClosed
	}
	if err := l.checkPolicyKey("Contributors", key); err != nil {
		return nil, err
	}
	if l.hit.st == nil {
		if s, ok := l.hit.m.Load(key); ok {
			return s.top(), nil
		}
		return nil, nil
	}
	tcs, err := l.hit.st.Tags(ctx, l.cfg.Prefix, key, storeTags)
	if err != nil {
		return nil, err
	}
	out := make([]Contributor, len(tcs))
	for i, tc := range tcs {
		out[i] = Contributor{tc.Tag, tc.Count}
	}
	sortContributors(out)
	return out, nil
}
