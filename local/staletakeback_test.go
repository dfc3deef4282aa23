package local

import (
	"testing"
	"time"
)

// A take-back (a decision undone after the sync loop took its increment)
// of a window older than the previous one is pushed to that window's
// counter, whatever the counter keeps as stale meanwhile: the store ends
// with exactly what was admitted in every window, nothing dropped. Before,
// a counter kept one older window and discarded the negative increments of
// any other, and the store kept counting the requests taken back.
func TestStaleTakeBacksArePushed(t *testing.T) {
	const w = int64(time.Second)
	rule := NewRule(Spec{Kind: Fixed, Limit: 1000, Window: time.Second})
	start := int64(100 * time.Hour) // a window boundary
	w0 := start / w
	type step func(t *testing.T, h *takeBackHarness)
	allow := func(win, n int64) step {
		return func(t *testing.T, h *takeBackHarness) { h.allow(t, win, n) }
	}
	// takeBack undoes n of a decision in window win that committed before
	// the sync loop's take (the race a later rule's denial meets).
	takeBack := func(win, n int64) step {
		return func(t *testing.T, h *takeBackHarness) { h.takeBack(t, win, n) }
	}
	roll := func(win int64) step {
		return func(t *testing.T, h *takeBackHarness) { h.tb.roll(h.e, 0, w0+win, start+win*w) }
	}
	sync := func(applied bool) step {
		return func(t *testing.T, h *takeBackHarness) { h.sync(t, applied) }
	}
	// send takes what the sync loop pushes and holds it unanswered;
	// answer applies (or refuses) what send took.
	send := func(t *testing.T, h *takeBackHarness) { h.send() }
	answer := func(applied bool) step {
		return func(t *testing.T, h *takeBackHarness) { h.answer(applied) }
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"a newer window's increments replace a stale take-back", []step{
			allow(0, 5), sync(true), takeBack(0, 2), roll(2), allow(2, 3), roll(4),
		}},
		{"a take-back of a window behind the stale one", []step{
			allow(0, 5), sync(true), allow(2, 3), roll(4), takeBack(0, 2),
		}},
		{"a refused take-back comes back behind a newer window", []step{
			allow(0, 5), sync(true), takeBack(0, 2), roll(2), send, allow(2, 3), roll(4), answer(false),
		}},
		{"a refused take-back, refused again", []step{
			allow(0, 5), sync(true), takeBack(0, 2), roll(2), sync(false), allow(2, 3), roll(4), sync(false),
		}},
		{"take-backs of three windows", []step{
			allow(0, 4), sync(true), allow(2, 4), sync(true), allow(4, 4), sync(true), roll(6),
			takeBack(2, 2), takeBack(0, 1), takeBack(4, 3), sync(false),
		}},
		{"a take-back and increments of one window", []step{
			allow(0, 5), sync(true), takeBack(0, 2), allow(0, 1), roll(2), allow(2, 3), roll(4),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := &takeBackHarness{
				tb:       NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true}),
				w:        w,
				w0:       w0,
				admitted: map[int64]int64{},
				store:    map[int64]int64{},
			}
			h.tb.Allow("k", 1, start)
			h.e = h.tb.load(h.tb.hash("k"), "k")
			h.admitted[w0]++
			for _, s := range c.steps {
				s(t, h)
			}
			h.sync(t, true)
			if got := h.tb.Unsynced(h.e); got != 0 {
				t.Fatalf("Unsynced %d after the last sync, want 0", got)
			}
			if d := h.tb.Stats().Dropped; d != 0 {
				t.Fatalf("Dropped %d, want 0", d)
			}
			for win, n := range h.admitted {
				if h.store[win] != n {
					t.Errorf("window %d: store %d, admitted %d", win-w0, h.store[win], n)
				}
			}
			for win, n := range h.store {
				if _, ok := h.admitted[win]; !ok && n != 0 {
					t.Errorf("window %d: store %d, admitted none", win-w0, n)
				}
			}
		})
	}
}

// takeBackHarness drives one entry of a syncing table and a model of the
// store's counters, by window.
type takeBackHarness struct {
	tb       *Table
	e        *Entry
	w, w0    int64
	admitted map[int64]int64 // window → increments admitted and not taken back
	store    map[int64]int64 // window → the store's counter
	held     []Push          // taken by send, not answered yet
}

func (h *takeBackHarness) allow(t *testing.T, win, n int64) {
	t.Helper()
	if d, st := h.tb.Allow("k", n, (h.w0+win)*h.w); st != Decided || !d.Allowed {
		t.Fatalf("window %d: %d not admitted", win, n)
	}
	h.admitted[h.w0+win] += n
}

// takeBack undoes n of a decision of window win admitted earlier (allow)
// and since moved on from its pending word, by a take or a rollover: the
// undo of an earlier rule's increment that a later rule's denial meets.
func (h *takeBackHarness) takeBack(t *testing.T, win, n int64) {
	t.Helper()
	c := h.e.ctr(0)
	stale := word(c.word.Load()).next() // a generation the counter is not at
	h.tb.undo(h.e, 0, stale, h.w0+win, n)
	h.admitted[h.w0+win] -= n
}

func (h *takeBackHarness) send() {
	now := h.e.ctr(0).win.Load() * h.w
	h.held, _ = h.tb.Take(h.e, now, nil)
}

func (h *takeBackHarness) answer(applied bool) {
	pushes := h.held
	h.held = nil
	if !applied {
		h.tb.Release(h.e, pushes)
		return
	}
	totals := make([]int64, len(pushes))
	for k, p := range pushes {
		h.store[p.Win] += p.Delta
		totals[k] = h.store[p.Win]
	}
	h.tb.Settle(h.e, h.e.ctr(0).win.Load()*h.w, pushes, totals)
}

func (h *takeBackHarness) sync(t *testing.T, applied bool) {
	t.Helper()
	h.send()
	h.answer(applied)
}

// A counter keeps take-backs of maxBack+1 windows older than the previous
// one (its stale window and maxBack more) while every take fails; those of older windows are discarded, and
// the store keeps counting those requests (the documented bound, on the
// side of the limit).
func TestStaleTakeBacksBeyondTheBound(t *testing.T) {
	const w = int64(time.Second)
	rule := NewRule(Spec{Kind: Fixed, Limit: 1000, Window: time.Second})
	start := int64(100 * time.Hour)
	w0 := start / w
	h := &takeBackHarness{
		tb: NewTable(Options{Rules: []Rule{rule}, MaxKeys: 10, Syncing: true}),
		w:  w, w0: w0, admitted: map[int64]int64{}, store: map[int64]int64{},
	}
	h.tb.Allow("k", 1, start)
	h.e = h.tb.load(h.tb.hash("k"), "k")
	h.admitted[w0]++
	const windows = maxBack + 3
	for k := range int64(windows) {
		h.allow(t, 2*k, 2)
		h.sync(t, true)
	}
	h.tb.roll(h.e, 0, w0+2*windows, start+2*windows*w)
	for k := range int64(windows) {
		h.takeBack(t, 2*k, 1)
		h.sync(t, false)
	}
	h.sync(t, true)
	require := func(cond bool, f string, args ...any) {
		t.Helper()
		if !cond {
			t.Fatalf(f, args...)
		}
	}
	require(h.tb.Unsynced(h.e) == 0, "Unsynced %d, want 0", h.tb.Unsynced(h.e))
	require(h.tb.Stats().Dropped == 0, "Dropped %d, want 0", h.tb.Stats().Dropped)
	for k := range int64(windows) {
		win := w0 + 2*k
		want := h.admitted[win]
		if k < windows-maxBack-1 {
			want++ // discarded: still counted
		}
		require(h.store[win] == want, "window %d: store %d, want %d", 2*k, h.store[win], want)
	}
}
