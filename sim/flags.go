package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/hybridlimit/hybridlimit"
)

// modeSpec is one configuration of the sweep: a limiter mode and, for the
// async mode, its sync rate.
type modeSpec struct {
	Mode     hybridlimit.Mode
	SyncRate time.Duration
	Policy   hybridlimit.AsyncPolicy // in ModeAsync
}

// String returns the spelling accepted by -modes: local, sync, async:RATE
// (the share policy) or naive:RATE (the async mode's naive policy).
func (m modeSpec) String() string {
	switch m.Mode {
	case hybridlimit.ModeAsync:
		if m.Policy == hybridlimit.Naive {
			return "naive:" + m.SyncRate.String()
		}
		return "async:" + m.SyncRate.String()
	case hybridlimit.ModeSynchronous:
		return "sync"
	}
	return "local"
}

// window is a fault window in virtual time, from the start of the run.
type window struct {
	From, Dur time.Duration
}

func (w window) active(t time.Duration) bool { return w.Dur > 0 && t >= w.From && t < w.From+w.Dur }

// churn takes Nodes nodes away during a window; they come back as new
// nodes (empty tables) when it ends.
type churn struct {
	Nodes int
	window
}

// options is a parsed command line.
type options struct {
	Nodes        int
	Duration     time.Duration
	Rate         float64 // total requests per second; 0: from Overload
	Overload     float64
	Keys         int
	Zipf         float64
	Pattern      string
	Rules        []hybridlimit.Rule
	Modes        []modeSpec
	Seed         uint64
	Stagger      bool
	StoreLatency time.Duration
	Outage       window
	Churn        churn
	Skew         time.Duration
	FailClosed   bool
	Redis        string
	Realtime     bool
	JSON         bool
	PerNode      bool
	Plot         string
	Bucket       time.Duration
	Warmup       time.Duration
	Small        bool
	Policy       hybridlimit.AsyncPolicy // of -target
	Quiet        bool
	Prefix       string
	Spread       string  // spreadRR or spreadHash
	Trace        string  // replay this file instead of generating traffic
	TraceSkipBad bool    // skip and count malformed trace lines
	WriteTrace   string  // write the generated traffic to this file and exit
	Target       float64 // -target, in percent; with HasTarget
	HasTarget    bool

	set   map[string]bool // the flags given on the command line
	trace *traceInfo      // the first pass over Trace
}

var patterns = []string{"steady", "burst", "ramp", "zipf", "sticky", "under"}

// usageError is a command-line error: the program prints it with the usage
// and exits with status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// parseFlags parses args (without the program name). Errors are
// *usageError, or flag.ErrHelp for -h.
func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by run; -h prints the usage below
	fs.IntVar(&o.Nodes, "nodes", 10, "number of limiter `nodes` sharing the store (1 to 1000)")
	fs.DurationVar(&o.Duration, "duration", 60*time.Second, "scenario length (virtual time; wall time with -realtime)")
	fs.Float64Var(&o.Rate, "rate", 0, "total requests per second over all nodes; 0: overload × keys × the tightest rule's limit per second")
	fs.Float64Var(&o.Overload, "overload", 0, "offered load as a multiple of the limit, when -rate is 0 (default 2, or 0.8 for -pattern under)")
	fs.IntVar(&o.Keys, "keys", 0, "number of distinct keys (default 10, or 1000 for -pattern zipf)")
	fs.Float64Var(&o.Zipf, "zipf", 1.1, "Zipf exponent s > 1 of key popularity for -pattern zipf")
	fs.StringVar(&o.Pattern, "pattern", "steady", "traffic `pattern`: "+strings.Join(patterns, ", "))
	rules := fs.String("rules", "1000/1s", "comma-separated `rules` "+ruleSyntax+", e.g. 1000/1s,20000/1m or 1000/1s:gcra=200,30000/1m:log")
	modes := fs.String("modes", "local,sync,naive:10ms,async:10ms,naive:100ms,async:100ms,naive:1s,async:1s", "comma-separated `configurations`: local, sync, async:RATE (the share policy), naive:RATE (the async mode's naive policy)")
	fs.Uint64Var(&o.Seed, "seed", 1, "random seed: the same seed gives the same traffic and the same report")
	fs.BoolVar(&o.Stagger, "stagger", true, "spread the nodes' sync instants evenly over one sync period (false: all nodes sync at once)")
	fs.DurationVar(&o.StoreLatency, "store-latency", 0, "simulated store round trip of every async sync cycle (memory store only)")
	outage := fs.String("outage", "", "store outage `START+LEN`, e.g. 20s+10s: every store call fails meanwhile")
	churnS := fs.String("churn", "", "`K@START+LEN`: K nodes leave at START and rejoin as new nodes after LEN, e.g. 3@20s+10s")
	fs.DurationVar(&o.Skew, "skew", 0, "per-node clock skew: node clocks are spread evenly over ±skew (the store keeps true time)")
	fs.BoolVar(&o.FailClosed, "fail-closed", false, "deny while the store fails (default: fail open)")
	fs.StringVar(&o.Redis, "redis", "", "run against the Redis server at `ADDR` instead of the in-memory store")
	fs.BoolVar(&o.Realtime, "realtime", false, "real clock and background sync loops (needs -redis)")
	fs.BoolVar(&o.JSON, "json", false, "print one JSON object per configuration instead of the table")
	fs.BoolVar(&o.PerNode, "per-node", false, "add a per-node breakdown")
	fs.StringVar(&o.Plot, "plot", "", "write a chart to `FILE` (.svg or .png)")
	fs.DurationVar(&o.Bucket, "bucket", time.Second, "time step of the admitted-per-second series in the chart")
	fs.DurationVar(&o.Warmup, "warmup", 0, "leave the run's first `DURATION` out of the accuracy figures (overshoot, false denials, peak): requests are still decided, by the nodes and the reference")
	fs.BoolVar(&o.Small, "small", true, "after the table, compare the async policies on a small limit (a tenth of the first rule's), at 2× and 0.8× load: where a node sees a handful of requests per sync")
	policy := fs.String("policy", "share", "async `policy` of -target: share or naive")
	fs.BoolVar(&o.Quiet, "quiet", false, "no progress on stderr")
	fs.StringVar(&o.Prefix, "prefix", "", "store key `prefix` of the run (default: random per run), one per configuration with a suffix")
	fs.StringVar(&o.Spread, "spread", spreadRR, "how requests are spread over the nodes: rr (round robin) or hash (by a hash of the key: a key keeps to one node while the nodes present do not change)")
	fs.StringVar(&o.Trace, "trace", "", "replay the requests of `FILE` instead of generating traffic: CSV timestamp,key; JSON lines {\"ts\":...,\"key\":\"...\"}; or a web server's access log (Common/Combined Log Format, keyed by client address); see docs/simulation.md")
	fs.BoolVar(&o.TraceSkipBad, "trace-skip-bad", false, "skip and count the trace's malformed lines instead of stopping at the first one")
	fs.StringVar(&o.WriteTrace, "write-trace", "", "write the traffic of -pattern to `FILE` as CSV (timestamp,key) and exit, running nothing; -trace FILE replays it")
	target := fs.String("target", "", "find the slowest async sync rate whose admitted total stays within +`P` of the exact reference, e.g. 1%; prints the rates tried and their store calls/s")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fs.Usage()
			return nil, err
		}
		return nil, &usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q: every setting is a flag", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.set = set

	var err error
	if o.Rules, err = parseRules(*rules); err != nil {
		return nil, err
	}
	if o.Modes, err = parseModes(*modes); err != nil {
		return nil, err
	}
	if *outage != "" {
		if o.Outage, err = parseWindow("-outage", *outage); err != nil {
			return nil, err
		}
	}
	if *churnS != "" {
		if o.Churn, err = parseChurn(*churnS); err != nil {
			return nil, err
		}
	}
	if !validPattern(o.Pattern) {
		return nil, usagef("-pattern %q is not one of %s", o.Pattern, strings.Join(patterns, ", "))
	}
	if !validSpread(o.Spread) {
		return nil, usagef("-spread %q is not one of %s", o.Spread, spreadNames())
	}
	if set["target"] {
		if o.Target, err = parseTarget(*target); err != nil {
			return nil, err
		}
		o.HasTarget = true
	}
	switch *policy {
	case "share":
		o.Policy = hybridlimit.Share
	case "naive":
		o.Policy = hybridlimit.Naive
	default:
		return nil, usagef("-policy %q is not share or naive", *policy)
	}
	if set["policy"] && !set["target"] {
		return nil, usagef("-policy chooses the policy of -target; with -modes, write async:RATE (share) or naive:RATE")
	}
	if err := checkCombinations(o, set); err != nil {
		return nil, err
	}
	// 0 is the flags' default, picked by the pattern: given, it is out of
	// range.
	if set["keys"] && o.Keys == 0 {
		return nil, usagef("-keys is 0, want 1 to 10000000")
	}
	if set["overload"] && o.Overload == 0 {
		return nil, usagef("-overload is 0, want more than 0, at most 1000")
	}
	if o.Keys == 0 {
		o.Keys = 10
		if o.Pattern == "zipf" {
			o.Keys = 1000
		}
	}
	if o.Overload == 0 {
		o.Overload = 2
		if o.Pattern == "under" {
			o.Overload = 0.8
		}
	}
	minDuration := time.Second
	if o.Trace != "" {
		minDuration = time.Millisecond
	}
	switch {
	case o.Nodes < 1 || o.Nodes > 1000:
		return nil, usagef("-nodes is %d, want 1 to 1000", o.Nodes)
	case o.Duration < minDuration || o.Duration > 24*time.Hour:
		return nil, usagef("-duration is %v, want %v to 24h", o.Duration, minDuration)
	case o.Rate < 0 || o.Rate > 1e7 || math.IsNaN(o.Rate):
		return nil, usagef("-rate is %v, want 0 (derived from -overload) to 1e7 requests per second", o.Rate)
	case o.Overload <= 0 || o.Overload > 1000 || math.IsNaN(o.Overload):
		return nil, usagef("-overload is %v, want more than 0, at most 1000", o.Overload)
	case o.Keys < 1 || o.Keys > 10_000_000:
		return nil, usagef("-keys is %d, want 1 to 10000000", o.Keys)
	case !(o.Zipf > 1) || o.Zipf > 10:
		return nil, usagef("-zipf is %v, want more than 1, at most 10", o.Zipf)
	case o.Warmup < 0 || (o.Trace == "" && o.Warmup >= o.Duration):
		return nil, usagef("-warmup is %v, want 0 to less than -duration (%v)", o.Warmup, o.Duration)
	case o.StoreLatency < 0 || o.StoreLatency > time.Minute:
		return nil, usagef("-store-latency is %v, want 0 to 1m", o.StoreLatency)
	case o.Skew < 0 || o.Skew > time.Hour:
		return nil, usagef("-skew is %v, want 0 to 1h", o.Skew)
	case o.Churn.Nodes >= o.Nodes:
		return nil, usagef("-churn takes %d of %d nodes away, want fewer than -nodes", o.Churn.Nodes, o.Nodes)
	}
	if o.Trace != "" {
		if err := loadTrace(o); err != nil {
			return nil, err
		}
	}
	switch {
	case o.Bucket < time.Millisecond || o.Bucket > o.Duration:
		return nil, usagef("-bucket is %v, want 1ms to -duration (%v)", o.Bucket, o.Duration)
	case o.Duration/o.Bucket > 100_000:
		return nil, usagef("-bucket %v makes %d points over -duration %v, want at most 100000", o.Bucket, o.Duration/o.Bucket, o.Duration)
	case o.Realtime && o.Duration > 10*time.Minute:
		return nil, usagef("-duration is %v with -realtime, want at most 10m of wall time", o.Duration)
	case o.Outage.Dur > 0 && o.Outage.From >= o.Duration:
		return nil, usagef("-outage starts at %v, want before the end of -duration (%v)", o.Outage.From, o.Duration)
	case o.Churn.Dur > 0 && o.Churn.From >= o.Duration:
		return nil, usagef("-churn starts at %v, want before the end of -duration (%v)", o.Churn.From, o.Duration)
	case o.Trace != "" && o.Warmup >= o.Duration:
		return nil, usagef("-warmup is %v, want 0 to less than the trace's length (%v)", o.Warmup, o.Duration)
	}
	if o.Rate == 0 {
		per := perSecond(tightest(o.Rules))
		o.Rate = o.Overload * float64(o.Keys) * per
		if o.Rate > 1e7 {
			return nil, usagef("-overload %v × -keys %d × the tightest rule's %v per second is %.3g requests per second, want at most 1e7: give -rate", o.Overload, o.Keys, per, o.Rate)
		}
	}
	if o.Rate*o.Duration.Seconds() > 1e9 {
		return nil, usagef("-rate %v over -duration %v is %.3g requests, want at most 1e9", o.Rate, o.Duration, o.Rate*o.Duration.Seconds())
	}
	if len(o.Prefix) > 56 || strings.ContainsAny(o.Prefix, "{}:") {
		return nil, usagef("-prefix %q: want at most 56 bytes without '{', '}' or ':'", o.Prefix)
	}
	if o.Plot != "" && !strings.HasSuffix(o.Plot, ".svg") && !strings.HasSuffix(o.Plot, ".png") {
		return nil, usagef("-plot %q: the file name must end in .svg or .png", o.Plot)
	}
	return o, nil
}
