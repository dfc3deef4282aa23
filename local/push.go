package local

// Push is what the sync loop sends to the store for one rule of one entry
// in one cycle, as taken by Entry.Take. It is handed back to Entry.Ack with
// the store's totals, or to Entry.Fail when the store did not answer.
type Push struct {
	Rule  int
	Win   int64  // the counter's current window when taken
	epoch uint64 // the counter's epoch when taken

	// Delta is added to the store's counter of window Win (0: read only).
	Delta int64
	// ExpireCur asks the store to set the expiry of window Win's counter.
	ExpireCur bool

	// Prev asks for the store's counter of window Win-1: PrevDelta is added
	// to it (0: read only).
	Prev      bool
	PrevDelta int64
	// ExpirePrev asks the store to set the expiry of window Win-1's counter.
	ExpirePrev bool

	oldExpWin int64
}

// Take moves the pending increments of every counter of e to in-flight and
// appends one Push per counter to dst. now decides whether the previous
// window still needs reading. It reports whether e must stay queued for a
// later cycle (its previous windows are still being read).
func (e *Entry) Take(now int64, dst []Push) ([]Push, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	again := false
	for i := range e.C {
		c := &e.C[i]
		var w uint64
		for {
			w = c.word.Load()
			if c.word.CompareAndSwap(w, w&^countMask) {
				break
			}
		}
		p := Push{Rule: i, Win: c.win.Load(), epoch: Word(w).epoch(), Delta: Word(w).Count(), oldExpWin: c.expWin}
		c.inflight.Add(p.Delta)
		if c.prevPending != 0 {
			p.Prev, p.PrevDelta = true, c.prevPending
			c.prevInflight += c.prevPending
			c.prevPending = 0
			if c.expWin < p.Win-1 {
				p.ExpirePrev = true
				c.expWin = p.Win - 1
			}
		}
		if now < c.prevReadUntil {
			p.Prev = true
			again = true
		}
		if p.Delta != 0 && c.expWin < p.Win {
			p.ExpireCur = true
			c.expWin = p.Win
		}
		dst = append(dst, p)
	}
	return dst, again
}

// Ack writes back the store's totals after the pushes of e succeeded:
// curTotal[i] is the store's counter of window pushes[i].Win after the push,
// prevTotal[i] that of window Win-1 (when pushes[i].Prev).
func (e *Entry) Ack(pushes []Push, curTotal, prevTotal []int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k, p := range pushes {
		c := &e.C[p.Rule]
		switch Word(c.word.Load()).epoch() {
		case p.epoch:
			c.cur.Store(curTotal[k])
			c.inflight.Add(-p.Delta)
			if p.Prev {
				c.prevInflight -= p.PrevDelta
				c.prev.Store(prevTotal[k] + c.prevPending + c.prevInflight)
			}
		case (p.epoch + 1) & epochMask:
			// Rolled over since Take: window Win is now the previous one.
			c.prev.Store(curTotal[k] + c.prevPending)
			c.prevInflight = 0
		default:
			c.prevInflight = 0
		}
	}
}

// Fail hands the increments of pushes back to e after the store did not
// take them, to be pushed in a later cycle. It returns the increments that
// no longer matter because their window is older than the previous one.
func (e *Entry) Fail(pushes []Push) (dropped int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range pushes {
		c := &e.C[p.Rule]
		c.expWin = p.oldExpWin
		switch Word(c.word.Load()).epoch() {
		case p.epoch:
			c.word.Add(uint64(p.Delta)) // mu held: no rollover can interleave
			c.inflight.Add(-p.Delta)
			c.prevPending += p.PrevDelta
			c.prevInflight -= p.PrevDelta
		case (p.epoch + 1) & epochMask:
			c.prevPending += p.Delta
			dropped += p.PrevDelta
			c.prevInflight = 0
		default:
			dropped += p.Delta + p.PrevDelta
			c.prevInflight = 0
		}
	}
	return dropped
}

// StoreBase returns the store key prefix cached on e, computing it with
// build the first time.
func (e *Entry) StoreBase(build func(key string) string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.storeKeys(build).base
}

// storeKeys returns e's store key cache, creating it. Call with e.mu held.
func (e *Entry) storeKeys(build func(key string) string) *storeKeys {
	if e.sk == nil {
		e.sk = &storeKeys{base: build(e.Key)}
	}
	return e.sk
}

// StoreKeys returns the store keys of counter i's windows win and win-1,
// cached on e until the window changes; base builds e's key prefix and key
// one window's key from it.
func (e *Entry) StoreKeys(i int, win int64, base func(key string) string, key func(base string, win int64) string) (cur, prev string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	sk := e.storeKeys(base)
	if sk.wins == nil {
		sk.wins = make([]winKeys, len(e.C))
	}
	k := &sk.wins[i]
	if k.cur == "" || k.win != win {
		if k.cur != "" && k.win == win-1 {
			k.prev = k.cur
		} else {
			k.prev = key(sk.base, win-1)
		}
		k.cur, k.win = key(sk.base, win), win
	}
	return k.cur, k.prev
}

// Observe records the store's counts for counter i after a decision made in
// the store (the synchronous mode): cur for window win, prev for win-1. The
// local view then serves decisions while the store fails.
func (e *Entry) Observe(i int, win, cur, prev int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := &e.C[i]
	if c.win.Load() != win {
		return
	}
	c.cur.Store(cur)
	c.prev.Store(prev + c.prevPending + c.prevInflight)
}
