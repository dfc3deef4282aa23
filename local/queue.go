package local

// The sync queue: the entries decided on since the sync loop last took them.

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

// Touched returns the entries queued since the last call and unqueues
// them, so that a decision after this call queues its entry again. The
// table keeps dst's storage (which the caller must have cleared) for the
// next queue: the two alternate, and nothing is copied.
func (t *Table) Touched(dst []*Entry) []*Entry {
	t.qmu.Lock()
	q := t.queue
	t.queue = dst[:0]
	t.qmu.Unlock()
	for _, e := range q {
		e.set(flagQueued, false)
	}
	return q
}

// Requeue queues e for the next sync cycle again.
func (t *Table) Requeue(e *Entry) { t.touch(e) }
