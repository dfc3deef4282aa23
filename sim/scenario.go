package main

import (
	"container/heap"
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
	syncloop "github.com/hybridlimit/hybridlimit/sync"
)

// start is the virtual instant every in-memory run begins at: aligned to
// every window up to a day, so runs are reproducible.
var virtualStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// env is what a configuration needs from outside: a fresh store per
// configuration, and a progress callback.
type env struct {
	newStore func(c *vclock) (inner store.Store, prefix string, err error)
	start    time.Time
	progress func(done time.Duration)
}

// simNode is one slot of the cluster; a node that leaves and rejoins is a
// new Limiter in the same slot.
type simNode struct {
	l       *hybridlimit.Limiter
	clk     *vclock
	st      *nodeStore
	present bool
	gen     int
	delay   time.Duration
	cycleAt int64
	applied bool // the paced cycle under way reached the store (evApply)
	done    chan error
	rng     *rand.Rand

	admitted, denied int64
	past             hybridlimit.Stats // summed stats of the slot's earlier limiters
}

// driver runs one configuration in virtual time.
type driver struct {
	o     *options
	m     modeSpec
	env   env
	ctx   context.Context
	base  *vclock
	start int64
	st    *simStore
	pfx   string
	nodes []*simNode
	live  []int // present nodes, in slot order
	sp    *spreader
	ev    events
	seq   uint64
}

func (d *driver) push(at int64, kind, node int) {
	gen := 0
	if node >= 0 {
		gen = d.nodes[node].gen
	}
	d.seq++
	heap.Push(&d.ev, event{at: at, seq: d.seq, kind: kind, node: node, gen: gen})
}

// syncRate is how often a node runs Sync: the configured rate in the async
// mode; in the synchronous mode the library's default, which pushes what
// was decided locally while the store failed.
func (d *driver) syncRate() time.Duration {
	if d.m.Mode == hybridlimit.ModeAsync {
		return d.m.SyncRate
	}
	return hybridlimit.DefaultSyncRate
}

// newLimiter starts the limiter of slot i at t.
func (d *driver) newLimiter(i int, t int64) error {
	n := d.nodes[i]
	cfg := hybridlimit.Config{
		Rules:        d.o.Rules,
		Mode:         d.m.Mode,
		SyncRate:     d.m.SyncRate,
		AsyncPolicy:  d.m.Policy,
		Seed:         d.o.Seed<<16 + uint64(i)<<8 + uint64(n.gen) + 1,
		Clock:        n.clk,
		Manual:       true,
		Prefix:       d.pfx,
		StoreTimeout: time.Minute,
	}
	if d.o.FailClosed {
		cfg.FailurePolicy = hybridlimit.FailClosed
	}
	if d.m.Mode != hybridlimit.ModeLocal {
		cfg.Store = n.st
	}
	l, err := hybridlimit.New(cfg)
	if err != nil {
		return err
	}
	n.l, n.present, n.delay = l, true, d.syncRate()
	n.gen++
	if d.m.Mode == hybridlimit.ModeLocal {
		return nil
	}
	_ = l.SyncClock(d.ctx) // as the background loop does when it starts
	// Staggered, slot i of N first syncs (i+1)/N of a period after it
	// starts. N is the number of slots, o.Nodes, not len(d.nodes): the
	// slots are still being appended while the first limiters start.
	first := t + int64(d.syncRate())
	if d.o.Stagger {
		first = t + int64(d.syncRate())*int64(i+1)/int64(d.o.Nodes)
	}
	d.push(first, evSync, i)
	return nil
}

func (d *driver) setLive() {
	d.live = d.live[:0]
	for i, n := range d.nodes {
		if n.present {
			d.live = append(d.live, i)
		}
	}
}

// runConfig runs configuration m of o and returns its report.
func runConfig(o *options, m modeSpec, e env) (*report, error) {
	d, err := newDriver(o, m, e)
	if err != nil {
		return nil, err
	}
	return d.run()
}

// newDriver builds configuration m of o at virtual time 0: the store, every
// node with its limiter, and the first events.
func newDriver(o *options, m modeSpec, e env) (*driver, error) {
	d := &driver{o: o, m: m, env: e, ctx: context.Background()}
	d.base = newVClock(e.start)
	d.start = e.start.UnixNano()
	inner, pfx, err := e.newStore(d.base)
	if err != nil {
		return nil, err
	}
	d.pfx = pfx
	d.st = &simStore{inner: inner, clock: d.base, start: d.start, outage: o.Outage, virtual: true}
	for i := range o.Nodes {
		var skew time.Duration
		if o.Skew > 0 && o.Nodes > 1 {
			skew = -o.Skew + 2*o.Skew*time.Duration(i)/time.Duration(o.Nodes-1)
		}
		d.nodes = append(d.nodes, &simNode{
			clk:  d.base.skewed(skew),
			st:   newNodeStore(d.st),
			done: make(chan error, 1),
			rng:  rand.New(rand.NewPCG(o.Seed, uint64(i))),
		})
		if err := d.newLimiter(i, 0); err != nil {
			return nil, err
		}
	}
	d.setLive()
	if m.Mode != hybridlimit.ModeLocal {
		d.push(int64(hybridlimit.DefaultClockSync), evClock, -1)
	}
	d.push(int64(evictEvery(o.Rules)), evEvict, -1)
	if o.Churn.Nodes > 0 {
		d.push(int64(o.Churn.From), evLeave, -1)
		d.push(int64(o.Churn.From+o.Churn.Dur), evJoin, -1)
	}
	return d, nil
}

// run drives the traffic through the nodes and the reference to the end
// of the run and returns the report.
func (d *driver) run() (*report, error) {
	o, m, e := d.o, d.m, d.env
	r := newReport(o, m)
	ref := newReference(o)
	names := runKeys(o)
	d.sp = newSpreader(o, names)
	logs := make([][]int64, o.Keys)
	refLogs := make([][]int64, o.Keys)
	bucket := int64(o.Bucket)
	g, err := newSource(o)
	if err != nil {
		return nil, err
	}
	defer g.close()
	var tick int64
	for {
		q, ok := g.next()
		if !ok {
			if err := g.err(); err != nil {
				return nil, err
			}
			break
		}
		if err := d.until(q.at); err != nil {
			return nil, err
		}
		now := d.start + q.at
		d.base.set(now)
		ni := d.live[d.sp.pick(q, len(d.live))]
		n := d.nodes[ni]
		res, err := n.l.Allow(d.ctx, names[q.key])
		if err != nil {
			return nil, fmt.Errorf("node %d: %w", ni, err)
		}
		ideal := ref.allow(q.key, now)
		b := int(q.at / bucket)
		if q.at < int64(o.Warmup) {
			// Decided by both, counted by neither: the report covers the
			// run after the warm-up.
			n.admitted, n.denied = n.admitted+b2i(res.Allowed), n.denied+b2i(!res.Allowed)
			continue
		}
		r.Requests++
		if res.Allowed {
			r.Admitted++
			n.admitted++
			r.series[b]++
			logs[q.key] = append(logs[q.key], q.at)
		} else {
			n.denied++
			if ideal {
				r.FalseDenied++
			}
		}
		if ideal {
			r.Ideal++
			r.idealSeries[b]++
			refLogs[q.key] = append(refLogs[q.key], q.at)
		}
		if q.at >= tick && e.progress != nil {
			e.progress(time.Duration(q.at))
			tick = q.at + int64(time.Second)
		}
	}
	if err := d.until(int64(o.Duration)); err != nil {
		return nil, err
	}
	d.base.set(d.start + int64(o.Duration))
	r.PeakWindowRatio = peakRatio(logs, o)
	r.IdealPeakRatio = peakRatio(refLogs, o)
	r.StoreCalls = d.st.calls.Load()
	r.StoreFailures = d.st.failed.Load()
	for i, n := range d.nodes {
		s := n.past
		if n.present {
			s = addStats(s, n.l.Stats())
		}
		r.KeysPushed += s.KeysPushed
		r.Degraded += s.Degraded
		if o.PerNode {
			r.PerNode = append(r.PerNode, nodeReport{Node: i, Admitted: n.admitted, Denied: n.denied, StoreCalls: s.StoreCalls, KeysPushed: s.KeysPushed, Degraded: s.Degraded, ClockOffsetMs: durMs(s.ClockOffset)})
		}
	}
	r.finish()
	return r, nil
}

func addStats(a, b hybridlimit.Stats) hybridlimit.Stats {
	a.StoreCalls += b.StoreCalls
	a.KeysPushed += b.KeysPushed
	a.Degraded += b.Degraded
	a.ClockOffset = b.ClockOffset
	return a
}

// evictEvery mirrors the background loop's eviction period.
func evictEvery(rules []hybridlimit.Rule) time.Duration {
	var longest time.Duration
	for _, r := range rules {
		longest = max(longest, r.Window)
	}
	return min(max(longest/2, time.Second), time.Minute)
}

// until processes every event due at or before t.
func (d *driver) until(t int64) error {
	for len(d.ev) > 0 && d.ev[0].at <= t {
		e := heap.Pop(&d.ev).(event)
		d.base.set(d.start + e.at)
		if err := d.handle(e); err != nil {
			return err
		}
	}
	return nil
}

func (d *driver) handle(e event) error {
	var n *simNode
	if e.node >= 0 {
		n = d.nodes[e.node]
		if !n.present || n.gen != e.gen {
			return nil // the node left since
		}
	}
	lat := int64(d.o.StoreLatency)
	switch e.kind {
	case evSync:
		n.cycleAt = e.at
		if lat == 0 || d.m.Mode != hybridlimit.ModeAsync {
			d.synced(e.node, n.l.Sync(d.ctx), e.at)
			return nil
		}
		n.st.paced.Store(true)
		n.applied = false
		go func() { n.done <- n.l.Sync(d.ctx) }()
		select {
		case <-n.st.entered:
			d.push(e.at+lat/2, evApply, e.node)
		case err := <-n.done: // nothing to push: no round trip
			n.st.paced.Store(false)
			d.synced(e.node, err, e.at)
		}
	case evApply:
		n.st.release <- struct{}{}
		<-n.st.applied
		n.applied = true
		d.push(n.cycleAt+lat, evReply, e.node)
	case evReply:
		n.st.release <- struct{}{}
		err := <-n.done
		n.st.paced.Store(false)
		d.synced(e.node, err, n.cycleAt)
	case evClock:
		for _, i := range d.live {
			_ = d.nodes[i].l.SyncClock(d.ctx)
		}
		d.push(e.at+int64(hybridlimit.DefaultClockSync), evClock, -1)
	case evEvict:
		for _, i := range d.live {
			d.nodes[i].l.Evict()
		}
		d.push(e.at+int64(evictEvery(d.o.Rules)), evEvict, -1)
	case evLeave:
		for i := d.o.Nodes - d.o.Churn.Nodes; i < d.o.Nodes; i++ {
			n := d.nodes[i]
			if n.st.paced.Load() { // finish the cycle under way at once
				if !n.applied {
					n.st.release <- struct{}{}
					<-n.st.applied
				}
				n.st.release <- struct{}{}
				<-n.done
				n.st.paced.Store(false)
			}
			n.past = addStats(n.past, n.l.Stats())
			_ = n.l.Close(d.ctx) // pushes what it still holds
			n.present = false
			n.gen++
		}
		d.setLive()
	case evJoin:
		for i := d.o.Nodes - d.o.Churn.Nodes; i < d.o.Nodes; i++ {
			if err := d.newLimiter(i, e.at); err != nil {
				return err
			}
		}
		d.setLive()
	}
	return nil
}

// synced schedules node i's next cycle after one that started at at, as
// the background loop does: every sync rate from the start of the last
// cycle (with -store-latency, not from its reply), backing off as it does
// (syncloop.Backoff, with jitter) while the store fails.
func (d *driver) synced(i int, err error, at int64) {
	n := d.nodes[i]
	rate := d.syncRate()
	if err == nil {
		n.delay = rate
	} else {
		n.delay = syncloop.Backoff(n.delay, rate)
		n.delay += time.Duration(n.rng.Int64N(int64(n.delay)/5 + 1))
	}
	next := max(at+int64(n.delay), d.base.nowNs()-d.start)
	d.push(next, evSync, i)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
