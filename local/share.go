package local

import (
	"math"
	"sync/atomic"
	"unsafe"
)

// The share policy of the async mode. A node that decides on the cluster
// total of its last sync plus its own unsynced count is blind to what the
// other nodes admitted since: with N nodes each τ behind, the cluster
// overshoots by about ((N−1)/N)·τ/W. Under the share policy a node spends
// only its share of the quota it believes is free:
//
//	known = the cluster's count as of this node's last sync (prev·weight + cur)
//	own   = this node's admissions since that sync (the previous window's
//	        part weighted like the previous window)
//	lag   = the other nodes' admissions that were not yet in the store when
//	        this node synced: their rate × half this node's sync period
//	        (Fixed and Buckets rules: their busiest rate of the last
//	        peakWindows windows when higher, as a window's quota is spent
//	        in a burst at its start)
//	free  = limit − known − lag
//	admit iff own + n ≤ share·free + dither
//
// where share is this node's part of the key's recent increments (a
// running average over about 16 syncs) and dither, drawn at each sync in
// [0, 1), lets a small share still admit its fraction on average. Between
// syncs the node spends at most its share of what slides out of the window;
// the nodes' shares add up to one, so the cluster spends what is free.
// When no sync has happened for a window or more (a store outage), known
// falls to zero and the rule becomes own ≤ share·limit: the node keeps
// admitting its part of the limit. From two sync periods past its last
// sync (handoffPeriods), the share is the safe one: the lower of the last
// sync's and the share as the previous window ended, as a burst's syncs
// skew the averages upward on every node. After an outage, for a Fixed or
// Buckets rule, that rule caps the share for a few syncs (outagePeriods)
// while the other nodes push what they admitted in it. A key whose node
// has not synced it yet, or that sees too few requests per sync for a
// share to mean anything, falls back to the plain rule.

// Tuning of the share policy, measured with the simulation (see
// docs/design.md for the figures).
const (
	// shareAlpha is the weight of one sync in the running averages of
	// the node's and the cluster's increments, after a plain average over
	// the first syncs.
	shareAlpha = 1.0 / 16
	// rateAlpha is the weight of one sync in the other nodes' rate.
	rateAlpha = 0.5
	// shareMin is the least share: a node whose share fell keeps
	// admitting a little, and grows back when the others leave room.
	shareMin = 1.0 / 256
	// shareMinCount is the least this node admits per sync period when
	// the key runs at the limit (share × limit × period / window; for a
	// Buckets rule, over one bucket, Rule.w) for the share to decide:
	// below it, a share of a handful of requests denies what an exact
	// limiter admits, and the plain rule decides.
	shareMinCount = 1.5
	// lagFactor is how far, in sync periods, the other nodes' increments
	// are on average behind this node's sync: half, when the nodes sync
	// at independent instants.
	lagFactor = 0.5
	// headroomFactor: while the quota left exceeds this many sync
	// periods of the cluster's increments, no node can run it out before
	// its next sync, and the plain rule decides (so that the share policy
	// never denies far below the limit).
	headroomFactor = 2.0
	// peakWindows is over how many of the rule's windows the busiest
	// sync fades (linearly): the cluster's increments in one sync, which
	// the headroom test takes when above their average, and for Fixed and
	// Buckets rules the other nodes' rate, which lag takes when above the
	// recent one. Admissions per sync measure what the cluster asks for
	// only while the limit does not bind: a Fixed window's quota goes in
	// a burst at its start and nothing is admitted after it, so the
	// window's average understates the next window's first syncs (and the
	// plain rule on every node would take that burst N times over), and
	// the recent rate, taken at the idle end of the last window, misses
	// the others' unpushed part of it. Two windows: at a sync of a tenth
	// of a window the burst still counts 0.6 of itself a window later;
	// over four, the catch-up of an outage's increments, which the others
	// push in one sync, made the nodes deny 4 % under the limit for four
	// windows after it (TestShareDuringAnOutage). The cost is a little
	// caution after a burst that is not repeated (docs/design.md, "Fixed
	// windows under overload").
	peakWindows = 2.0
	// handoffPeriods is how long, in sync periods (Options.SyncRate or
	// the key's measured one, the longer), a sync's hand-off of a key to
	// the plain rule for its quota left (headroomFactor) lasts. While the
	// store answers for the key, its next sync renews or ends the
	// hand-off; when it stops (an outage, or in a Cluster the outage of
	// the key's shard alone), the share decides again once that time has
	// passed: the quota left that justified the hand-off lasts about
	// headroomFactor sync periods at the cluster's pace, and the plain
	// rule on every node would spend it N times over.
	handoffPeriods = headroomFactor
	// outagePeriods is for how many syncs of a key after a store outage
	// a Fixed or Buckets rule recovers (settleShare): the other nodes push
	// what they admitted in the outage once their backoff ends, at most
	// 10 sync periods (sync.backoffRates) after the store is back.
	outagePeriods = 12
	// outageWait is how many more syncs a recovery may wait for the
	// other nodes' increments of the outage to reach the store (see
	// shareStats.recovery): in a Redis Cluster, a node can find the promoted
	// replica a StoreTimeout and a slot-map reload after another, well
	// past outagePeriods syncs.
	outageWait = 4 * outagePeriods
)

// snapshot is what a decision needs of a counter's last sync, published by
// Settle with a sequence lock.
type snapshot struct {
	seq     atomic.Uint64 // odd while being written
	win     atomic.Int64  // the window the sync read; 0: none yet
	base    atomic.Int64  // the counter's base right after the sync
	until   atomic.Int64  // > 0: from this instant (ns) the safe share decides
	share   atomic.Uint64 // float64 bits
	dith    atomic.Uint64 // float64 bits
	lagSafe atomic.Uint64 // lag and safe, float32 bits each
}

// snapValues is a snapshot's content. A share of 1 leaves the decision to
// the plain rule. Until `until` (0: no deadline) share decides; from then
// on, when no later sync of the key has answered, safe does (snapValues.at).
type snapValues struct {
	win, base, until       int64
	share, lag, dith, safe float64
}

// at returns v as a decision at instant now uses it: share replaced by
// safe from v.until on.
func (v snapValues) at(now int64) snapValues {
	if v.until > 0 && now >= v.until {
		v.share = v.safe
	}
	return v
}

func (sn *snapshot) load() (v snapValues, ok bool) {
	for range 4 {
		s := sn.seq.Load()
		if s&1 != 0 {
			continue
		}
		ls := sn.lagSafe.Load()
		v = snapValues{
			win:   sn.win.Load(),
			base:  sn.base.Load(),
			until: sn.until.Load(),
			share: math.Float64frombits(sn.share.Load()),
			dith:  math.Float64frombits(sn.dith.Load()),
			lag:   float64(math.Float32frombits(uint32(ls))),
			safe:  float64(math.Float32frombits(uint32(ls >> 32))),
		}
		if sn.seq.Load() == s {
			return v, v.win != 0
		}
	}
	return v, false // a sync is writing right now: decide by the plain rule
}

func (sn *snapshot) store(v snapValues) {
	sn.seq.Add(1)
	sn.win.Store(v.win)
	sn.base.Store(v.base)
	sn.until.Store(v.until)
	sn.share.Store(math.Float64bits(v.share))
	sn.dith.Store(math.Float64bits(v.dith))
	sn.lagSafe.Store(uint64(math.Float32bits(float32(v.lag))) | uint64(math.Float32bits(float32(v.safe)))<<32)
	sn.seq.Add(1)
}

// shareState is a counter's share-policy state. The states of an entry's
// rules are allocated together, in the entry's extension, at the first
// sync that shows another node's increments of one of its counters: until
// then every share is 1 and the plain rule decides, as it would with
// statistics (this node's part of the key's increments is all of them),
// so a key that only this node decides costs nothing here.
type shareState struct {
	snap snapshot
	st   shareStats // guarded by the entry's mutex
}

// shareStats is a counter's record of its syncs, for the share policy.
// Guarded by the entry's mutex.
type shareStats struct {
	at       int64   // instant of the last sync (ns), 0: none yet
	total    int64   // the store's total of that sync's window (snapshot.win) then
	ownAvg   float64 // running average of this node's increments per sync
	allAvg   float64 // running average of the cluster's increments per sync
	rate     float64 // the other nodes' admissions per ns, recently
	period   float64 // running average of the time between syncs (ns)
	allPeak  float32 // the cluster's most increments in one sync, fading (peakWindows)
	ratePeak float32 // the other nodes' highest rate, fading as allPeak
	winShare float32 // the share as of the last sync of an earlier window, 0: none
	ownWin   float32 // while recovering: this node's increments in the rule's window since the outage
	samples  int16   // syncs averaged so far, up to math.MaxInt16
	recover  int16   // syncs left under the outage's cap (Fixed and Buckets rules), 0: none
	waited   int16   // syncs the recovery has waited for the others (outageWait)
}

// share returns the share the averages give, 1 when they give none.
func (st *shareStats) share() float64 {
	if st.samples >= 1 && st.allAvg > 0 && st.ownAvg < st.allAvg {
		return max(st.ownAvg/st.allAvg, shareMin)
	}
	return 1
}

// periodOf returns the sync period of st's counter (ns): the measured one
// or Options.SyncRate, the longer.
func (t *Table) periodOf(st *shareStats) int64 {
	return int64(max(st.period, float64(t.syncRate)))
}

// recovery notes a sync of rule r at now, in window win, whose last sync
// published last, on the recovery from a store outage. Past that sync's
// deadline (a store outage, or the key left idle on this node) the key
// was decided by the safe share, and the averages may hold a burst half
// seen: they go on from that share. The other nodes push what they
// admitted meanwhile over their next syncs, some only after their
// backoff: until then the store's totals lack it, and then it is no
// traffic of theirs. So for the next outagePeriods syncs of a Fixed or
// Buckets rule (recovering: st.recover > 0) the averages take no sample,
// nothing is handed to the plain rule, and the outage's rule caps the
// room: own increments in the window since the outage (st.ownWin) ≤
// safe·limit.
//
// A gap is a sync a period or more past the deadline (the deadline is
// two periods past the last sync; a cycle a little late, or a call that
// took a while to be answered, is no outage). A gap while recovering (a
// store that answers again, then not, as a Cluster answering CLUSTERDOWN
// while go-redis sends the calls again) renews the recovery and keeps
// what this node admitted in the window: starting over from this sync's
// increments would give it its safe share of the limit twice.
//
// Nor does a recovery end while the store's count of the window (count
// returns it) lacks the others' part (othersMissing): their pushes of the
// outage may come late (in a Redis Cluster, a node can reach a promoted
// replica a StoreTimeout and a slot-map reload after another), and ending
// on these totals would hand the key to the plain rule, which spends their
// part again. It waits at most outageWait more syncs.
func (st *shareStats) recovery(r *Rule, last snapValues, now, win, ownSpan, period int64, count func() float64) {
	newWindow := r.kind == Fixed && last.win != win
	switch {
	case st.at != 0 && last.until > 0 && now >= last.until+period:
		st.ownAvg = min(st.ownAvg, last.safe*st.allAvg)
		if !r.fixed {
			return
		}
		if st.recover == 0 {
			st.waited = 0
		}
		if st.recover == 0 || newWindow {
			st.ownWin = 0
		}
		st.recover = outagePeriods
	case st.recover > 0:
		if newWindow {
			st.ownWin = 0
		}
		st.ownWin += float32(ownSpan)
		if st.recover == 1 && st.waited < outageWait && st.othersMissing(last.safe, count()) {
			st.waited++
		} else {
			st.recover--
		}
		return
	default:
		return
	}
	st.ownWin += float32(ownSpan)
}

// othersMissing reports whether the store's count of a recovering rule's
// window, count, still lacks most of what the other nodes admitted in it.
// By the shares, they admit (1−safe)/safe of what this node does: while
// the count shows less than three quarters of that beside this node's
// increments since the outage (st.ownWin), they have not pushed their
// admissions of the outage yet.
func (st *shareStats) othersMissing(safe, count float64) bool {
	if safe <= 0 || safe >= 1 || st.ownWin <= 0 {
		return false
	}
	own := float64(st.ownWin)
	return count-own < 0.75*own*(1-safe)/safe
}

// storeCount returns the cluster's count of rule i of e in window win at
// now as the store holds it, cur being the window's total there: a
// Buckets rule's buckets summed, a sliding window's previous count
// weighted. Call with e's mutex held.
func (t *Table) storeCount(e *Entry, i int, now, win, cur int64) float64 {
	r := &t.rules[i]
	if r.kind == Buckets {
		var buf [maxBuckets]int64
		return float64(r.bucketSum(t.bucketCounts(e, i, win, cur, buf[:])))
	}
	weight := 0.0
	if !r.fixed {
		_, el := WindowOf(now, r.w)
		weight = float64(r.w-el) * r.invW
	}
	return float64(e.ctr(i).prev.Load())*weight + float64(cur)
}

// shareRoom returns what the share policy allows at counts prev and cur
// (this node's view) in window win, el into it: the cost still allowed
// (share of the free quota plus dither, minus own), and whether the share
// policy applies at all (the caller checks the hand-off: handedOff).
func (r *Rule) shareRoom(v snapValues, prev, cur, win, el int64) (room float64, ok bool) {
	if v.share >= 1 {
		return 0, false
	}
	weight := 0.0
	if !r.fixed {
		weight = float64(r.w-el) * r.invW
	}
	var known, own, lag float64
	switch win - v.win {
	case 0:
		own, known, lag = float64(cur-v.base), float64(prev)*weight+float64(v.base), v.lag
	case 1:
		own = float64(cur) + float64(prev-v.base)*weight
		known, lag = float64(v.base)*weight, v.lag*weight
	default:
		own = float64(cur) + float64(prev)*weight
	}
	return v.share*(r.limitF-known-lag) + v.dith - own, true
}

// shareStateSize is the size of one rule's share state.
const shareStateSize = unsafe.Sizeof(shareState{})

// shareOf returns rule i's share state of e, nil while e has none. It
// takes no lock. Until e has its states it reads only e's flags, in the
// cache line a decision reads anyway, not the extension's pointer; the
// flag is set after the states are stored (newShares).
func (t *Table) shareOf(e *Entry, i int) *shareState {
	if e.flags.Load()&flagShared == 0 {
		return nil
	}
	p := t.xOf(e).Load().share.Load()
	return (*shareState)(unsafe.Add(unsafe.Pointer(p), uintptr(i)*shareStateSize))
}

// othersShown reports whether the store's totals of pushes, which the
// store applied, show increments of e's counters from other nodes: a
// current window's total grew by more than this node pushed since it last
// read it. Call with e's mutex held, before Settle updates the counters.
func (t *Table) othersShown(e *Entry, pushes []Push, totals []int64) bool {
	for k := range pushes {
		p := &pushes[k]
		if p.kind != pushCur || !t.rules[p.Rule].counted() {
			continue
		}
		c, s := e.ctr(p.Rule), t.sync(e, p.Rule)
		if c.win.Load() != p.Win {
			continue
		}
		// The store's total as last read; s.inflight holds p.Delta.
		known := c.base.Load() - s.inflight - s.adj
		if totals[k]-known-p.Delta > 0 {
			return true
		}
	}
	return false
}

// newShares gives e its rules' share states. Call with e's mutex held.
func (t *Table) newShares(e *Entry) {
	states := make([]shareState, len(t.rules))
	t.extend(e).share.Store(&states[0])
	e.set(flagShared, true) // after the store: a decision that sees the flag finds the states
}

// settleShare updates rule i's share statistics after a sync at now that
// read the store's totals cur (window win) and, when prevRead, prev
// (window win−1), having pushed ownCur and ownPrev (and ownSpan into the
// windows a Buckets rule counts, ownCur for the others); then it publishes
// the snapshot decisions use. Call with e's mutex held, once e has its
// share states.
func (t *Table) settleShare(e *Entry, i int, now, win, cur, prev int64, prevRead bool, ownCur, ownPrev, ownSpan int64) {
	x := t.shareOf(e, i)
	st := &x.st
	r := &t.rules[i]
	last, _ := x.snap.load() // the last sync's (this goroutine is its only writer)
	var others int64
	known := true
	switch {
	case st.at == 0:
		known = false
	case last.win == win:
		others = cur - st.total - ownCur
	case last.win == win-1 && prevRead:
		others = (prev - st.total - ownPrev) + (cur - ownCur)
	default:
		known = false
	}
	st.recovery(r, last, now, win, ownSpan, t.periodOf(st), func() float64 { return t.storeCount(e, i, now, win, cur) })
	if st.recover > 0 && r.kind == Buckets {
		// The others' pushes of the outage reach closed buckets after
		// ReadPrev: the next take reads them all again.
		t.ext(e).oldReads |= oldAll << i
	}
	if st.at != 0 && last.win != win {
		// The share as the previous window ended, before its last
		// increments enter the averages (safeShare).
		st.winShare = float32(st.share())
	}
	if known && now > st.at && st.recover == 0 {
		dt := float64(now - st.at)
		o := float64(max(others, 0))
		own := float64(ownCur + ownPrev)
		// The peak forgets a sync's count over peakWindows windows.
		fade := max(1-dt/(peakWindows*float64(r.window)), 0)
		st.allPeak = float32(max(own+o, float64(st.allPeak)*fade))
		st.ratePeak = float32(max(o/dt, float64(st.ratePeak)*fade))
		if st.samples == 0 || st.period == 0 {
			if st.samples == 0 {
				st.ownAvg, st.allAvg = own, own+o
			}
			st.rate, st.period = o/dt, dt
		} else {
			// A plain average over the first syncs, then a running one.
			a := max(1/float64(st.samples+1), shareAlpha)
			st.ownAvg += a * (own - st.ownAvg)
			st.allAvg += a * (own + o - st.allAvg)
			st.rate += rateAlpha * (o/dt - st.rate)
			st.period += 0.25 * (dt - st.period)
		}
		st.samples = min(st.samples, math.MaxInt16-1) + 1
	}
	st.at, st.total = now, cur
	v := snapValues{win: win, base: e.ctr(i).base.Load(), share: 1}
	if share := st.share(); share < 1 {
		// The others' admissions not yet in the store: their rate over
		// half a period. A Fixed window's quota goes in a burst at its
		// start, which the recent rate (the idle end of the last window)
		// misses: their busiest rate of the last windows, when higher.
		rate := st.rate
		if r.fixed {
			rate = max(rate, float64(st.ratePeak))
		}
		known := t.storeCount(e, i, now, win, cur)
		// Past handoffPeriods without a sync of the key (a store outage),
		// the safe share decides, with the dither's mean.
		until := now + max(handoffPeriods*t.periodOf(st), 1)
		safe := share
		if st.winShare > 0 {
			safe = min(share, float64(st.winShare))
		}
		lag := rate * st.period * lagFactor
		if st.recover > 0 {
			// Recovering: lag large enough that the room is at most the
			// outage's, safe·limit + dither − own in the window.
			lag = max(lag, r.limitF-known-(safe*r.limitF-float64(st.ownWin))/share)
		}
		// The quota left once the others' unpushed admissions are counted:
		// while it holds more than what the cluster admits in a few sync
		// periods, no node can run it out before the next sync, and the
		// plain rule decides (no false denials under the limit).
		headroom := r.limitF - known - lag
		switch {
		case share*r.limitF*st.period*r.invW < shareMinCount:
			// Too few requests per sync for a share: the plain rule,
			// until the next sync whenever it comes.
		case st.recover == 0 && headroom >= headroomFactor*max(st.allAvg, float64(st.allPeak)):
			// The plain rule decides until the key's next sync, for at
			// most handoffPeriods.
			v.until, v.safe, v.lag, v.dith = until, safe, lag, 0.5
		default:
			v.share, v.lag, v.dith = share, lag, t.rng.Float64()
			v.until, v.safe = until, safe
		}
	}
	x.snap.store(v)
}

// shareRetry returns how long from el into the window until a request of
// cost n fits the share policy's room, if nothing is admitted meanwhile:
// the free quota grows as the previous window slides out, and resets at
// the window's end. At least 1 µs.
func (r *Rule) shareRetry(v snapValues, room float64, prev, el, n int64) int64 {
	need := float64(n) - room
	if need <= 0 {
		return 0
	}
	d := r.w - el
	if !r.fixed && prev > 0 {
		if t := need / (v.share * float64(prev) * r.invW); t < float64(d) {
			d = int64(math.Ceil(t))
		}
	}
	return max(d, 1000)
}

// shareLeft returns the largest whole cost n that a share with room
// admits (n ≤ room + Epsilon, as decisions test it), 0 when there is none.
func shareLeft(room float64) int64 {
	return int64(max(room+Epsilon, 0))
}

// shareRoomOf returns the share policy's room for rule i of e, as
// shareRoom, reading the counter's snapshot.
func (t *Table) shareRoomOf(e *Entry, i int, prev, cur, win, el int64) (snapValues, float64, bool) {
	x := t.shareOf(e, i)
	if x == nil {
		return snapValues{}, 0, false
	}
	v, ok := x.snap.load()
	if !ok {
		return v, 0, false
	}
	v = v.at(win*t.rules[i].w + el)
	room, ok := t.rules[i].shareRoom(v, prev, cur, win, el)
	return v, room, ok
}

// bucketRoom is shareRoom for a Buckets rule: b holds the window's bucket
// counts (ids win−span+1 … win) as this node sees them. What this node
// counted since its sync is in the snapshot's bucket (beyond its base) and
// the buckets after it; the rest is the cluster's as of the sync.
func (r *Rule) bucketRoom(v snapValues, b []int64, win int64) (room float64, ok bool) {
	if v.share >= 1 {
		return 0, false
	}
	first := win - r.span + 1
	var own, all int64
	for k, n := range b {
		id := first + int64(k)
		all += n
		switch {
		case id == v.win:
			own += n - v.base
		case id > v.win:
			own += n
		}
	}
	lag := v.lag
	if v.win < first {
		lag = 0 // the sync's bucket has left the window, and its lag with it
	}
	known := float64(all - own)
	return v.share*(r.limitF-known-lag) + v.dith - float64(own), true
}

// bucketShareRoomOf returns the share policy's room for Buckets rule i of
// e, whose counts are b in window win, el into it.
func (t *Table) bucketShareRoomOf(e *Entry, i int, b []int64, win, el int64) (float64, bool) {
	x := t.shareOf(e, i)
	if x == nil {
		return 0, false
	}
	v, ok := x.snap.load()
	if !ok {
		return 0, false
	}
	return t.rules[i].bucketRoom(v.at(win*t.rules[i].w+el), b, win)
}
