package local

// The sync queue: the entries decided on since the sync loop last took
// them, as a list linked through the entries themselves (Table.link), so
// that it costs no memory per key. A decision pushes its entry on the
// list's head with one compare-and-swap, once per key per cycle (the
// entry's flagQueued says whether it is in a list). The sync loop detaches
// the whole list at the start of a cycle and walks it in chunks: an entry
// leaves the queue (its flag is cleared) when Touched hands it out, so an
// entry is never in two lists, and its link is only written by the one
// that set its flag (pushing it) or by Touched (handing it out).

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
	l := t.link(e)
	for {
		h := t.queue.Load()
		*l = h
		if t.queue.CompareAndSwap(h, e) {
			return
		}
	}
}

// Detach starts a sync cycle: the entries queued so far become the list
// that Touched hands out; those queued from now on (by decisions, or by
// Requeue) wait for the next Detach. It reports whether the list holds
// any entry. A list that Touched has not emptied yet is kept, and the
// entries queued since wait.
func (t *Table) Detach() bool {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	if t.taking == nil {
		t.taking = t.queue.Swap(nil)
	}
	return t.taking != nil
}

// Touched appends to dst up to max entries (at least one) of the list
// Detach took, and unqueues them, so that a decision after this call
// queues its entry again. It appends nothing once the list is empty.
func (t *Table) Touched(dst []*Entry, max int) []*Entry {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	for n := 0; t.taking != nil && (n == 0 || n < max); n++ {
		e := t.taking
		l := t.link(e)
		t.taking, *l = *l, nil
		e.set(flagQueued, false) // after the link is read: a decision may push e again now
		dst = append(dst, e)
	}
	return dst
}

// Requeue queues e for the next sync cycle again.
func (t *Table) Requeue(e *Entry) { t.touch(e) }
