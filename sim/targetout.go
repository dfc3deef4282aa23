package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hybridlimit/hybridlimit"
)

// runTarget is -target: the search, then its table (or JSON) and chart.
func runTarget(o *options, stdout, stderr io.Writer) error {
	res, err := searchTarget(o, modeSpec{Mode: hybridlimit.ModeAsync, Policy: o.Policy}, stderr)
	if err != nil {
		return err
	}
	if o.JSON {
		err = writeTargetJSON(stdout, o, res)
	} else {
		err = writeTargetTable(stdout, o, res)
	}
	if err == nil && o.Plot != "" {
		reps := make([]*report, len(res.Tried))
		for i, c := range res.Tried {
			reps[i] = c.Rep
		}
		if err = writePlot(o.Plot, o, reps); err == nil && !o.Quiet {
			fmt.Fprintf(stderr, "sim: chart written to %s\n", o.Plot)
		}
	}
	return err
}

func callsPerSec(o *options, r *report) float64 { return float64(r.StoreCalls) / o.Duration.Seconds() }

func writeTargetTable(w io.Writer, o *options, res *targetResult) error {
	writeHeader(w, o)
	fmt.Fprintf(w, "target: admitted within %+g%% of the exact reference; async sync rates from 1ms to %v, refined to within %.0f%%\n\n", res.Target, res.Upper, 100*(targetTolerance-1))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "sync rate\tovershoot %%\tfalse-deny %%\tpeak/limit\tstore calls/s\twithin %+g%%\t\n", res.Target)
	for _, c := range res.Tried {
		ok := "no"
		if c.OK {
			ok = "yes"
		}
		fmt.Fprintf(tw, "%v\t%+.2f\t%.3f\t%.3f\t%.1f\t%s\t\n", c.Rate, c.Rep.OvershootPct, c.Rep.FalseDenyPct, c.Rep.PeakWindowRatio, callsPerSec(o, c.Rep), ok)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	a, m := res.Answer, res.Missed
	mode := "async" // the -modes name of the policy searched
	if o.Policy == hybridlimit.Naive {
		mode = "naive"
	}
	switch {
	case a == nil:
		fmt.Fprintf(w, "\nanswer: none. Even "+mode+":1ms overshoots by %+.2f%%, more than %+g%%: use the synchronous mode (-modes sync), exact at about one store call per request (or per batch of concurrent requests).\n", res.Tried[0].Rep.OvershootPct, res.Target)
	case m == nil:
		upto := "the longest window"
		if res.Upper < longestWindow(o.Rules) {
			upto = "the slowest rate these rules allow in ModeAsync"
		}
		fmt.Fprintf(w, "\nanswer: "+mode+":%v (overshoot %+.2f%%, %.1f store calls/s): every rate tried up to %s, %v, is within %+g%%.\n", a.Rate, a.Rep.OvershootPct, callsPerSec(o, a.Rep), upto, res.Upper, res.Target)
	default:
		fmt.Fprintf(w, "\nanswer: "+mode+":%v (overshoot %+.2f%%, %.1f store calls/s), the slowest sync rate tried within %+g%%; the next one tried, %v, overshoots %+.2f%%.\n", a.Rate, a.Rep.OvershootPct, callsPerSec(o, a.Rep), res.Target, m.Rate, m.Rep.OvershootPct)
	}
	var err error
	if miss := res.fasterMisses(); len(miss) > 0 {
		var names []string
		for _, c := range miss {
			names = append(names, fmt.Sprintf("%v (%+.2f%%)", c.Rate, c.Rep.OvershootPct))
		}
		one := ""
		if miss[0].Rate == time.Millisecond {
			one = " Even async:1ms missed it: for a bound that holds at every rate, use the synchronous mode (-modes sync)."
		}
		_, err = fmt.Fprintf(w, "caution: faster rates missed the target: %s. Overshoot does not grow strictly with the sync rate here; more traffic (a longer -duration) sharpens the figures.%s\n", strings.Join(names, ", "), one)
	}
	return err
}

func writeTargetJSON(w io.Writer, o *options, res *targetResult) error {
	type cand struct {
		SyncRateMs   float64 `json:"sync_rate_ms"`
		Within       bool    `json:"within_target"`
		CallsPerSec  float64 `json:"store_calls_per_s"`
		OvershootPct float64 `json:"overshoot_pct"`
		Report       *report `json:"report"`
	}
	out := struct {
		TargetPct    float64  `json:"target_pct"`
		AnswerMs     *float64 `json:"answer_sync_rate_ms"`
		AnswerCalls  *float64 `json:"answer_store_calls_per_s"`
		UseSyncMode  bool     `json:"use_sync_mode"`
		UpperMs      float64  `json:"upper_sync_rate_ms"`
		Candidates   []cand   `json:"candidates"`
		TolerancePct float64  `json:"tolerance_pct"`
	}{TargetPct: res.Target, UseSyncMode: res.Answer == nil, UpperMs: durMs(res.Upper), TolerancePct: round4(100 * (targetTolerance - 1))}
	if a := res.Answer; a != nil {
		ms, calls := durMs(a.Rate), round4(callsPerSec(o, a.Rep))
		out.AnswerMs, out.AnswerCalls = &ms, &calls
	}
	for _, c := range res.Tried {
		out.Candidates = append(out.Candidates, cand{durMs(c.Rate), c.OK, round4(callsPerSec(o, c.Rep)), c.Rep.OvershootPct, c.Rep})
	}
	return json.NewEncoder(w).Encode(out)
}
