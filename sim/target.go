package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// The -target search: the slowest async sync rate whose overshoot over the
// exact reference is at most P percent, for the traffic of the command
// line.
//
//  1. ladder: 1ms, 2ms, 5ms, 10ms, ... up to the longest rule window (at
//     most 1h, the slowest sync rate, and at most the slowest rate the
//     library accepts for the rules: targetUpper), run targetBatch at a time, fastest
//     first, until every rate of a batch misses the target;
//  2. refinement: between the slowest rate tried that met the target and
//     the next rate tried (which missed it), targetSteps rates evenly
//     spaced on a log scale (whole milliseconds), again and again, until
//     the two are within targetTolerance of each other or 1ms apart.
//
// The answer is the slowest rate tried that met the target. Overshoot
// mostly grows with the sync rate, but not strictly (small samples): the
// output names the faster rates that missed, if any. A looser target never
// gives a faster answer, as it is met wherever a tighter one is. What is
// tried depends only on the command line (not on the number of cores), so
// with a fixed -seed the list and the answer are reproducible.
const (
	targetBatch     = 4
	targetSteps     = 3
	targetTolerance = 1.1
)

// candidate is one sync rate tried.
type candidate struct {
	Rate time.Duration
	Rep  *report
	OK   bool // overshoot within the target
}

// targetResult is the outcome of a search.
type targetResult struct {
	Target float64
	Upper  time.Duration // the slowest rate of the ladder
	Tried  []candidate   // by rate
	Answer *candidate    // the slowest rate tried within the target; nil: none
	Missed *candidate    // the next rate tried above Answer (it missed), if any
}

// searchTarget runs the search. Every candidate is base with its sync rate
// set: whatever else base carries (a future async policy) passes through.
func searchTarget(o *options, base modeSpec, stderr io.Writer) (*targetResult, error) {
	res := &targetResult{Target: o.Target, Upper: targetUpper(o.Rules)}
	round := 0
	try := func(rates []time.Duration) ([]candidate, error) {
		modes := make([]modeSpec, len(rates))
		for i, r := range rates {
			modes[i] = base
			modes[i].SyncRate = r
		}
		round++
		reps, err := runModes(o, modes, fmt.Sprintf("_t%d", round), stderr)
		if err != nil {
			return nil, err
		}
		out := make([]candidate, len(rates))
		for i, rep := range reps {
			out[i] = candidate{Rate: rates[i], Rep: rep, OK: rep.OvershootPct <= o.Target+1e-9}
		}
		res.Tried = append(res.Tried, out...)
		slices.SortFunc(res.Tried, func(a, b candidate) int { return int(a.Rate - b.Rate) })
		return out, nil
	}
	ladder := targetLadder(res.Upper)
	for i := 0; i < len(ladder); i += targetBatch {
		cs, err := try(ladder[i:min(i+targetBatch, len(ladder))])
		if err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(cs, func(c candidate) bool { return c.OK }) {
			break
		}
	}
	lo, hi := res.bracket()
	for lo != nil && hi != nil && float64(hi.Rate) > targetTolerance*float64(lo.Rate) {
		var rates []time.Duration
		for j := 1; j <= targetSteps; j++ {
			f := math.Pow(float64(hi.Rate)/float64(lo.Rate), float64(j)/(targetSteps+1))
			r := time.Duration(float64(lo.Rate) * f).Round(time.Millisecond)
			if r > lo.Rate && r < hi.Rate && !slices.Contains(rates, r) {
				rates = append(rates, r)
			}
		}
		if len(rates) == 0 {
			break
		}
		if _, err := try(rates); err != nil {
			return nil, err
		}
		lo, hi = res.bracket()
	}
	res.Answer, res.Missed = lo, hi
	return res, nil
}

// bracket returns the slowest rate tried within the target and the next
// rate tried above it.
func (res *targetResult) bracket() (lo, hi *candidate) {
	for i := range res.Tried {
		if res.Tried[i].OK {
			lo, hi = &res.Tried[i], nil
			if i+1 < len(res.Tried) {
				hi = &res.Tried[i+1]
			}
		}
	}
	return lo, hi
}

// fasterMisses returns the rates tried faster than the answer that missed
// the target.
func (res *targetResult) fasterMisses() []candidate {
	var out []candidate
	for _, c := range res.Tried {
		if !c.OK && res.Answer != nil && c.Rate < res.Answer.Rate {
			out = append(out, c)
		}
	}
	return out
}

// targetUpper is the slowest sync rate searched: the longest rule window,
// at most the slowest sync rate the library accepts (1h), and at most the
// slowest one it accepts for these rules (a shorter window, a bucket or a
// log's two buckets must last a sync period), which it finds by asking
// New, to the millisecond.
func targetUpper(rules []hybridlimit.Rule) time.Duration {
	w := min(longestWindow(rules), time.Hour)
	if acceptsRate(rules, w) || !acceptsRate(rules, time.Millisecond) {
		return w // (rules no rate suits fail in New, with its error)
	}
	lo, hi := time.Millisecond, w // accepted, refused: acceptance only falls with the rate
	for hi-lo > time.Millisecond {
		mid := (lo + (hi-lo)/2).Truncate(time.Millisecond)
		if acceptsRate(rules, mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// longestWindow returns the longest of rules' windows.
func longestWindow(rules []hybridlimit.Rule) time.Duration {
	var w time.Duration
	for _, r := range rules {
		w = max(w, r.Window)
	}
	return w
}

// acceptsRate reports whether New accepts rules in ModeAsync at sync rate
// d.
func acceptsRate(rules []hybridlimit.Rule, d time.Duration) bool {
	l, err := hybridlimit.New(hybridlimit.Config{Rules: rules, Mode: hybridlimit.ModeAsync, SyncRate: d, Manual: true, Store: store.NewMemory(nil)})
	if err != nil {
		return false
	}
	_ = l.Close(context.Background())
	return true
}

// targetLadder is 1ms, 2ms, 5ms, 10ms, ... below upper, then upper.
func targetLadder(upper time.Duration) []time.Duration {
	var out []time.Duration
	for d := time.Millisecond; d < upper; d *= 10 {
		for _, m := range []time.Duration{1, 2, 5} {
			if m*d < upper {
				out = append(out, m*d)
			}
		}
	}
	return append(out, upper)
}
