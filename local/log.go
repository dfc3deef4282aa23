package local

import "sort"

// Log rules: the exact count of the last window. A key with log rules
// keeps the instant of every unit of cost admitted within its longest log
// window, oldest first, in a ring as long as the largest log limit (a log
// rule's memory is one 8-byte instant per unit of cost it admits per
// window: Limit × 8 bytes per key). A request of cost n fits rule (L, W)
// when the cost counted after now − W plus n is at most L; when it does
// not, it fits once the oldest counted entries leave: exactly when the
// entry k = counted + n − L (1-based, oldest first) is W old. Decisions
// on log rules take the entry's mutex.

// logRing is the instants of a key's admitted cost. Guarded by the
// entry's mutex.
type logRing struct {
	ts         []int64 // ring storage; cap is the largest log limit
	head, size int
}

func newLogRing(capacity int64) *logRing {
	return &logRing{ts: make([]int64, capacity)}
}

func (l *logRing) at(i int) int64 { return l.ts[(l.head+i)%len(l.ts)] }

// firstAfter returns the index of the oldest entry after since.
func (l *logRing) firstAfter(since int64) int {
	return sort.Search(l.size, func(i int) bool { return l.at(i) > since })
}

// counts returns rule r's counts at now for a request of cost n.
func (l *logRing) counts(r *Rule, now, n int64) Counts {
	first := l.firstAfter(now - r.window)
	c := Counts{Cur: int64(l.size - first)}
	if k := c.Cur + n - r.limit; k > 0 {
		c.Expire = l.at(first+int(k)-1) + r.window - now
	}
	if l.size > first {
		c.Reset = l.at(l.size-1) + r.window - now
	}
	return c
}

// push records n units of cost admitted at now, keeping the entries
// sorted (a decision whose instant is a little behind another's goes
// before it) and dropping the oldest beyond the ring's length.
func (l *logRing) push(now, n int64) {
	for range n {
		if l.size == len(l.ts) {
			l.head = (l.head + 1) % len(l.ts)
			l.size--
		}
		i := l.size
		for i > 0 && l.at(i-1) > now {
			l.ts[(l.head+i)%len(l.ts)] = l.at(i - 1)
			i--
		}
		l.ts[(l.head+i)%len(l.ts)] = now
		l.size++
	}
}

// remove takes back n units of cost pushed at now.
func (l *logRing) remove(now, n int64) {
	for ; n > 0; n-- {
		i := l.size - 1
		for i >= 0 && l.at(i) != now {
			i--
		}
		if i < 0 {
			return
		}
		for ; i < l.size-1; i++ {
			l.ts[(l.head+i)%len(l.ts)] = l.at(i + 1)
		}
		l.size--
	}
}

// prune drops the entries at or before since.
func (l *logRing) prune(since int64) {
	k := l.firstAfter(since)
	l.head = (l.head + k) % len(l.ts)
	l.size -= k
}
