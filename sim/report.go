package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"

	"github.com/hybridlimit/hybridlimit"
)

// report is the outcome of one configuration. The JSON names of the first
// fields are the stable interface (tests and scripts read them); the
// others may grow.
type report struct {
	Nodes           int     `json:"nodes"`
	Mode            string  `json:"mode"`
	Policy          string  `json:"policy,omitempty"`
	SyncRateMs      float64 `json:"sync_rate_ms"`
	Pattern         string  `json:"pattern"`
	Limit           int64   `json:"limit"`
	WindowMs        int64   `json:"window_ms"`
	Requests        int64   `json:"requests"`
	Admitted        int64   `json:"admitted"`
	Ideal           int64   `json:"ideal"`
	OvershootPct    float64 `json:"overshoot_pct"`
	FalseDenyPct    float64 `json:"false_deny_pct"`
	PeakWindowRatio float64 `json:"peak_window_ratio"`
	StoreCalls      uint64  `json:"store_calls"`

	IdealPeakRatio float64      `json:"ideal_peak_window_ratio"`
	KeysPushed     uint64       `json:"keys_pushed"`
	FalseDenied    int64        `json:"false_denied"`
	StoreFailures  uint64       `json:"store_failures"`
	Degraded       uint64       `json:"degraded"`
	Rules          string       `json:"rules"`
	Keys           int          `json:"keys"`
	RatePerSec     float64      `json:"rate_per_s"`
	DurationS      float64      `json:"duration_s"`
	WarmupS        float64      `json:"warmup_s,omitempty"`
	Seed           uint64       `json:"seed"`
	Store          string       `json:"store"`
	Time           string       `json:"time"`
	StoreLatMs     float64      `json:"store_latency_ms,omitempty"`
	SkewMs         float64      `json:"skew_ms,omitempty"`
	Outage         string       `json:"outage,omitempty"`
	Churn          string       `json:"churn,omitempty"`
	FailClosed     bool         `json:"fail_closed,omitempty"`
	Spread         string       `json:"spread"`
	Trace          string       `json:"trace,omitempty"`
	TraceFormat    string       `json:"trace_format,omitempty"`
	TraceSkipped   int64        `json:"trace_skipped,omitempty"`
	TraceReordered int64        `json:"trace_reordered,omitempty"`
	PerNode        []nodeReport `json:"per_node,omitempty"`

	label       string
	series      []int64 // admitted per bucket
	idealSeries []int64
}

// nodeReport is one node slot's share of a configuration.
type nodeReport struct {
	Node          int     `json:"node"`
	Admitted      int64   `json:"admitted"`
	Denied        int64   `json:"denied"`
	StoreCalls    uint64  `json:"store_calls"`
	KeysPushed    uint64  `json:"keys_pushed"`
	Degraded      uint64  `json:"degraded"`
	ClockOffsetMs float64 `json:"clock_offset_ms"`
}

func newReport(o *options, m modeSpec) *report {
	var rules []string
	for _, r := range o.Rules {
		rules = append(rules, r.String())
	}
	mode := "local"
	switch m.Mode {
	case hybridlimit.ModeAsync:
		mode = "async"
	case hybridlimit.ModeSynchronous:
		mode = "sync"
	}
	policy := ""
	if m.Mode == hybridlimit.ModeAsync {
		policy = m.Policy.String()
	}
	buckets := int((o.Duration + o.Bucket - 1) / o.Bucket)
	r := &report{
		Nodes:       o.Nodes,
		Mode:        mode,
		Policy:      policy,
		SyncRateMs:  durMs(m.SyncRate),
		Pattern:     o.Pattern,
		Limit:       o.Rules[0].Limit,
		WindowMs:    o.Rules[0].Window.Milliseconds(),
		Rules:       strings.Join(rules, ","),
		Keys:        o.Keys,
		RatePerSec:  o.Rate,
		DurationS:   o.Duration.Seconds(),
		WarmupS:     o.Warmup.Seconds(),
		Seed:        o.Seed,
		Store:       "memory",
		Time:        "virtual",
		StoreLatMs:  durMs(o.StoreLatency),
		SkewMs:      durMs(o.Skew),
		FailClosed:  o.FailClosed,
		Spread:      o.Spread,
		label:       m.String(),
		series:      make([]int64, buckets),
		idealSeries: make([]int64, buckets),
	}
	if o.Redis != "" {
		r.Store = "redis"
	}
	if o.Realtime {
		r.Time = "real"
	}
	if t := o.trace; t != nil {
		r.Trace, r.TraceFormat, r.TraceSkipped, r.TraceReordered = o.Trace, t.format.String(), t.skipped, t.reordered
	}
	if o.Outage.Dur > 0 {
		r.Outage = fmt.Sprintf("%v+%v", o.Outage.From, o.Outage.Dur)
	}
	if o.Churn.Nodes > 0 {
		r.Churn = fmt.Sprintf("%d@%v+%v", o.Churn.Nodes, o.Churn.From, o.Churn.Dur)
	}
	return r
}

// finish computes the ratios, rounded to 4 decimals.
func (r *report) finish() {
	if r.Ideal > 0 {
		r.OvershootPct = round4(100 * float64(r.Admitted-r.Ideal) / float64(r.Ideal))
	}
	if r.Requests > 0 {
		r.FalseDenyPct = round4(100 * float64(r.FalseDenied) / float64(r.Requests))
	}
	r.PeakWindowRatio = round4(r.PeakWindowRatio)
	r.IdealPeakRatio = round4(r.IdealPeakRatio)
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

// writeJSON writes one JSON object per line.
func writeJSON(w io.Writer, reports []*report) error {
	enc := json.NewEncoder(w)
	for _, r := range reports {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// writeTable writes the human summary.
func writeTable(w io.Writer, o *options, reports []*report) error {
	writeHeader(w, o)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "config\trequests\tadmitted\tideal\tover/under %\tfalse-deny %\tpeak/limit\tideal peak\tstore calls\tkeys pushed\t")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%+.2f\t%.3f\t%.3f\t%.3f\t%d\t%d\t\n",
			r.label, r.Requests, r.Admitted, r.Ideal, r.OvershootPct, r.FalseDenyPct, r.PeakWindowRatio, r.IdealPeakRatio, r.StoreCalls, r.KeysPushed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if o.PerNode {
		for _, r := range reports {
			fmt.Fprintf(w, "\n%s per node:\n", r.label)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "node\tadmitted\tdenied\tstore calls\tkeys pushed\tdegraded\tclock offset ms\t")
			for _, n := range r.PerNode {
				fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%.3f\t\n", n.Node, n.Admitted, n.Denied, n.StoreCalls, n.KeysPushed, n.Degraded, n.ClockOffsetMs)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
		}
	}
	_, err := fmt.Fprintf(w, "\nover/under = (admitted − ideal) / ideal, below 0 when the nodes admit less; ideal = one exact global limiter fed the same requests;\nnaive:RATE and async:RATE are the async mode's naive and share policies (Config.AsyncPolicy);\nfalse-deny = denied by the nodes but admitted by the ideal, over all requests;\npeak/limit = most admitted in any interval of one window (sliding log), over the limit;\nideal peak = the same for the ideal's admissions (the sliding-window estimate itself allows a little over 1).\n")
	return err
}

// writeHeader writes the scenario: nodes, traffic, rules, time, store and
// faults, then a blank line.
func writeHeader(w io.Writer, o *options) {
	var rules []string
	for _, r := range o.Rules {
		rules = append(rules, r.String())
	}
	clockName := "virtual"
	if o.Realtime {
		clockName = "real"
	}
	storeName := "memory store"
	if o.Redis != "" {
		storeName = "redis " + o.Redis
	}
	fmt.Fprintf(w, "%d nodes · %s · rules %s · %.0f req/s for %v (%s time) · %s · seed %d\n",
		o.Nodes, describeTraffic(o), strings.Join(rules, ", "), o.Rate, o.Duration, clockName, storeName, o.Seed)
	var faults []string
	if o.StoreLatency > 0 {
		faults = append(faults, "store latency "+o.StoreLatency.String())
	}
	if o.Outage.Dur > 0 {
		faults = append(faults, fmt.Sprintf("store outage %v for %v", o.Outage.From, o.Outage.Dur))
	}
	if o.Churn.Nodes > 0 {
		faults = append(faults, fmt.Sprintf("%d nodes away %v for %v", o.Churn.Nodes, o.Churn.From, o.Churn.Dur))
	}
	if o.Skew > 0 {
		faults = append(faults, "clock skew ±"+o.Skew.String())
	}
	if o.FailClosed {
		faults = append(faults, "fail closed")
	}
	if len(faults) > 0 {
		fmt.Fprintf(w, "faults: %s\n", strings.Join(faults, ", "))
	}
	fmt.Fprintln(w)
}
