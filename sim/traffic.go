package main

import (
	"math"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hybridlimit/hybridlimit"
)

// request is one arrival: its instant (ns from the start of the run), its
// key (an index) and a draw used to pick the node that receives it.
type request struct {
	at   int64
	key  int
	draw float64
}

// traffic generates the requests of a run, in time order, from the seed
// alone: every configuration of a sweep sees the same requests.
//
// Arrivals are a Poisson process whose rate is -rate times the pattern's
// shape, which averages 1 over the run:
//
//	steady, zipf, sticky, under: 1
//	burst: 3 for the first 2s of every 10s, 0.5 for the other 8s
//	ramp:  rising linearly from 0 to 2 over the run
type traffic struct {
	rng      *rand.Rand
	zipf     *rand.Zipf
	pattern  string
	rate     float64 // requests per ns
	duration int64
	keys     int
	t        float64
}

func newTraffic(o *options) *traffic {
	g := &traffic{
		rng:      rand.New(rand.NewPCG(o.Seed, 0x68796272696433)),
		pattern:  o.Pattern,
		rate:     o.Rate / 1e9,
		duration: int64(o.Duration),
		keys:     o.Keys,
	}
	if o.Pattern == "zipf" {
		g.zipf = rand.NewZipf(g.rng, o.Zipf, 1, uint64(o.Keys-1))
	}
	return g
}

// shape returns the rate multiplier at t ns.
func (g *traffic) shape(t float64) float64 {
	switch g.pattern {
	case "burst":
		if math.Mod(t, 10e9) < 2e9 {
			return 3
		}
		return 0.5
	case "ramp":
		return max(2*t/float64(g.duration), 0.005)
	}
	return 1
}

// next returns the next request, or false at the end of the run.
func (g *traffic) next() (request, bool) {
	g.t += g.rng.ExpFloat64() / (g.rate * g.shape(g.t))
	if g.t >= float64(g.duration) {
		return request{}, false
	}
	r := request{at: int64(g.t), draw: g.rng.Float64()}
	if g.zipf != nil {
		r.key = int(g.zipf.Uint64())
	} else if g.keys > 1 {
		r.key = g.rng.IntN(g.keys)
	}
	return r, true
}

func (g *traffic) err() error   { return nil }
func (g *traffic) close() error { return nil }

// keyNames returns the user keys of a run.
func keyNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = "client-" + strconv.Itoa(i)
	}
	return names
}

// reference is the ideal: one exact global limiter with the same rules,
// deciding every request of the run in order on the true clock, written
// apart from the library so that it checks it: the sliding-window-counter
// formula with exact counts, fixed windows, the sum of a bucketed window's
// buckets, an exact log of admission instants, and the cell rate
// algorithm's arrival time for token and leaky buckets.
type reference struct {
	rules []refRule
	n     int // rules per key
}

// refRule decides one rule for every key; admits checks a request of cost
// 1 at now and count records it.
type refRule interface {
	admits(key int, now int64) bool
	count(key int, now int64)
}

func newReference(o *options) *reference {
	r := &reference{n: len(o.Rules)}
	for _, rule := range o.Rules {
		w := int64(rule.Window)
		switch rule.Type {
		case hybridlimit.Sliding, hybridlimit.Fixed:
			c := &refWindow{limit: float64(rule.Limit), w: w, fixed: rule.Type == hybridlimit.Fixed, c: make([]refCounter, o.Keys)}
			for i := range c.c {
				c.c[i].win = math.MinInt64
			}
			r.rules = append(r.rules, c)
		case hybridlimit.Bucketed:
			r.rules = append(r.rules, &refBuckets{limit: rule.Limit, span: w / int64(rule.Buckets), n: rule.Buckets,
				ids: make([][]int64, o.Keys), counts: make([][]int64, o.Keys)})
		case hybridlimit.Log:
			r.rules = append(r.rules, &refLog{limit: rule.Limit, w: w, log: make([][]int64, o.Keys)})
		case hybridlimit.TokenBucket, hybridlimit.LeakyBucket:
			// The library's emission interval: whole microseconds, rounded up.
			us := int64(rule.Window / time.Microsecond)
			t := (us + rule.Limit - 1) / rule.Limit * int64(time.Microsecond)
			burst := rule.Burst
			if burst == 0 {
				burst = rule.Limit
			}
			tat := make([]int64, o.Keys)
			for i := range tat {
				tat[i] = math.MinInt64 / 2
			}
			r.rules = append(r.rules, &refGCRA{t: t, burst: burst, tat: tat})
		}
	}
	return r
}

// allow decides a request of cost 1 for key at now (ns since the epoch):
// admitted when every rule admits it, and then counted by every rule.
func (r *reference) allow(key int, now int64) bool {
	for _, rule := range r.rules {
		if !rule.admits(key, now) {
			return false
		}
	}
	for _, rule := range r.rules {
		rule.count(key, now)
	}
	return true
}

// refWindow is a sliding (two-window estimate) or fixed window.
type refWindow struct {
	limit float64
	w     int64
	fixed bool
	c     []refCounter
}

type refCounter struct{ win, cur, prev int64 }

// at returns key's counter moved to the window of now, and how far into
// it now is.
func (r *refWindow) at(key int, now int64) (*refCounter, int64) {
	c := &r.c[key]
	id, el := now/r.w, now%r.w
	switch {
	case c.win == id:
	case c.win == id-1:
		c.win, c.prev, c.cur = id, c.cur, 0
	default:
		c.win, c.prev, c.cur = id, 0, 0
	}
	return c, el
}

func (r *refWindow) admits(key int, now int64) bool {
	c, el := r.at(key, now)
	est := float64(c.cur)
	if !r.fixed {
		est += float64(c.prev) * float64(r.w-el) / float64(r.w)
	}
	return est+1 <= r.limit+1e-9
}

func (r *refWindow) count(key int, now int64) {
	c, _ := r.at(key, now)
	c.cur++
}

// refBuckets sums the last n buckets of span ns, the current one included.
type refBuckets struct {
	limit, span int64
	n           int
	ids, counts [][]int64 // per key, the buckets counted, oldest first
}

func (r *refBuckets) sum(key int, now int64) int64 {
	id := now / r.span
	ids, counts := r.ids[key], r.counts[key]
	k := 0
	for k < len(ids) && ids[k] <= id-int64(r.n) {
		k++
	}
	r.ids[key], r.counts[key] = ids[k:], counts[k:]
	total := int64(0)
	for _, c := range r.counts[key] {
		total += c
	}
	return total
}

func (r *refBuckets) admits(key int, now int64) bool { return r.sum(key, now)+1 <= r.limit }

func (r *refBuckets) count(key int, now int64) {
	r.sum(key, now)
	id := now / r.span
	ids := r.ids[key]
	if len(ids) > 0 && ids[len(ids)-1] == id {
		r.counts[key][len(ids)-1]++
		return
	}
	r.ids[key] = append(ids, id)
	r.counts[key] = append(r.counts[key], 1)
}

// refLog keeps every admission of the last window: a request is admitted
// when fewer than limit were admitted in the window before it.
type refLog struct {
	limit, w int64
	log      [][]int64
}

func (r *refLog) admits(key int, now int64) bool {
	l := r.log[key]
	k := 0
	for k < len(l) && l[k] <= now-r.w {
		k++
	}
	r.log[key] = l[k:]
	return int64(len(r.log[key]))+1 <= r.limit
}

func (r *refLog) count(key int, now int64) { r.log[key] = append(r.log[key], now) }

// refGCRA is the cell rate algorithm: admitted when the arrival time the
// request moves to is at most burst intervals ahead (a token bucket; a
// leaky bucket admits the same requests and delays them).
type refGCRA struct {
	t, burst int64
	tat      []int64
}

func (r *refGCRA) admits(key int, now int64) bool {
	return max(r.tat[key], now)+r.t-now <= r.burst*r.t
}

func (r *refGCRA) count(key int, now int64) { r.tat[key] = max(r.tat[key], now) + r.t }

// peakRatio is the sliding-log check: the most requests admitted in any
// interval of length W (any start, not only aligned windows), divided by
// the limit, maximised over keys and rules. admitted holds each key's
// admission instants in order.
func peakRatio(admitted [][]int64, o *options) float64 {
	peak := 0.0
	for _, rule := range o.Rules {
		w := int64(rule.Window)
		for _, ts := range admitted {
			i := 0
			for j := range ts {
				for ts[j]-ts[i] >= w {
					i++
				}
				if r := float64(j-i+1) / float64(capacity(rule)); r > peak {
					peak = r
				}
			}
		}
	}
	return peak
}

func durMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// capacity is the most a rule can admit in one interval of its window: its
// limit, or for a token or leaky bucket its burst and the rate's
// admissions after it.
func capacity(r hybridlimit.Rule) int64 {
	if r.Type != hybridlimit.TokenBucket && r.Type != hybridlimit.LeakyBucket {
		return r.Limit
	}
	burst := r.Burst
	if burst == 0 {
		burst = r.Limit
	}
	return burst + r.Limit - 1
}
