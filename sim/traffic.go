package main

import (
	"math"
	"math/rand/v2"
	"strconv"
	"time"
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
// deciding every request of the run in order on the true clock, with the
// limiter's sliding-window-counter formula and exact counts.
type reference struct {
	limit  []float64
	window []int64
	fixed  []bool
	c      []refCounter // key*rules + rule
}

type refCounter struct{ win, cur, prev int64 }

func newReference(o *options) *reference {
	r := &reference{c: make([]refCounter, o.Keys*len(o.Rules))}
	for _, rule := range o.Rules {
		r.limit = append(r.limit, float64(rule.Limit))
		r.window = append(r.window, int64(rule.Window))
		r.fixed = append(r.fixed, rule.Type == 1)
	}
	for i := range r.c {
		r.c[i].win = math.MinInt64
	}
	return r
}

// allow decides a request of cost 1 for key at now (ns since the epoch).
func (r *reference) allow(key int, now int64) bool {
	cs := r.c[key*len(r.limit) : (key+1)*len(r.limit)]
	for i := range cs {
		c, w := &cs[i], r.window[i]
		id, el := now/w, now%w
		switch {
		case c.win == id:
		case c.win == id-1:
			c.win, c.prev, c.cur = id, c.cur, 0
		default:
			c.win, c.prev, c.cur = id, 0, 0
		}
		est := float64(c.cur)
		if !r.fixed[i] {
			est += float64(c.prev) * float64(w-el) / float64(w)
		}
		if est+1 > r.limit[i]+1e-9 {
			return false
		}
	}
	for i := range cs {
		cs[i].cur++
	}
	return true
}

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
				if r := float64(j-i+1) / float64(rule.Limit); r > peak {
					peak = r
				}
			}
		}
	}
	return peak
}

func durMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
