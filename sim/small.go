package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hybridlimit/hybridlimit"
)

// writeSmall runs and writes -small: both async policies at 100ms on a
// limit a tenth of the first rule's, at 2× and at 0.8× load. A node then
// sees a handful of requests per sync, too few for a share of them to
// mean anything; the share policy decides such keys by the naive rule, and
// the table shows what each policy costs there.
func writeSmall(w io.Writer, o *options, stderr io.Writer) error {
	small := *o
	small.Rules = append([]hybridlimit.Rule(nil), o.Rules...)
	small.Rules[0].Limit = max(o.Rules[0].Limit/10, 1)
	small.Modes = []modeSpec{
		{Mode: hybridlimit.ModeAsync, SyncRate: 100 * time.Millisecond, Policy: hybridlimit.Naive},
		{Mode: hybridlimit.ModeAsync, SyncRate: 100 * time.Millisecond, Policy: hybridlimit.Share},
	}
	small.Plot, small.PerNode = "", false
	type row struct {
		load float64
		reps []*report
	}
	var rows []row
	for _, load := range []float64{2, 0.8} {
		run := small
		run.Overload = load
		// The load the row prints, whatever -rate the main table runs at.
		run.Rate = load * float64(run.Keys) * float64(run.Rules[0].Limit) / run.Rules[0].Window.Seconds()
		reps, err := runModes(&run, run.Modes, fmt.Sprintf("small%v", load), stderr)
		if err != nil {
			return err
		}
		rows = append(rows, row{load, reps})
	}
	perNode := float64(small.Rules[0].Limit) * 0.1 / small.Rules[0].Window.Seconds() / float64(o.Nodes)
	fmt.Fprintf(w, "\nsmall limit: %v per key, %d nodes: about %.2g admission(s) per node per 100ms sync at the limit\n\n", small.Rules[0], o.Nodes, perNode)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "config\tload\trequests\tadmitted\tideal\tover/under %\tfalse-deny %\tpeak/limit\t")
	for _, r := range rows {
		for _, rep := range r.reps {
			fmt.Fprintf(tw, "%s\t%.1f×\t%d\t%d\t%d\t%+.2f\t%.3f\t%.3f\t\n", rep.label, r.load, rep.Requests, rep.Admitted, rep.Ideal, rep.OvershootPct, rep.FalseDenyPct, rep.PeakWindowRatio)
		}
	}
	return tw.Flush()
}
