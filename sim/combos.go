package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// checkCombinations rejects flags that do not go together; set holds the
// flags given on the command line.
func checkCombinations(o *options, set map[string]bool) error {
	if o.Trace != "" {
		for _, name := range []string{"write-trace", "pattern", "rate", "overload", "keys", "zipf"} {
			if set[name] {
				return usagef("-%s is not available with -trace: the trace is the traffic (drop -%s, or drop -trace to generate traffic)", name, name)
			}
		}
	} else if set["trace-skip-bad"] {
		return usagef("-trace-skip-bad needs -trace FILE: generated traffic has no malformed lines")
	}
	if o.Pattern == "sticky" && set["spread"] {
		return usagef("-spread is not available with -pattern sticky, which picks the nodes itself; with another -pattern, -spread takes %s", spreadNames())
	}
	if o.WriteTrace != "" {
		if o.Pattern == "sticky" {
			return usagef("-write-trace: -pattern sticky picks a node per request, which a trace does not record; use one of %s and replay with -spread", strings.Join(patterns[:len(patterns)-2], ", ")+", under")
		}
		for _, name := range []string{"target", "modes", "nodes", "spread", "stagger", "store-latency", "outage", "churn", "skew", "fail-closed", "redis", "realtime", "json", "per-node", "plot", "bucket", "prefix"} {
			if set[name] {
				return usagef("-%s is not available with -write-trace, which writes the generated traffic and runs nothing (drop -%s; pass it when replaying with -trace)", name, name)
			}
		}
	}
	if o.HasTarget {
		for _, c := range []struct{ name, why string }{
			{"modes", "the search picks the async sync rates itself"},
			{"realtime", "the search compares runs, which must be reproducible: virtual time only"},
			{"per-node", "the search prints one line per sync rate tried"},
		} {
			if set[c.name] {
				return usagef("-%s is not available with -target: %s (drop -%s)", c.name, c.why, c.name)
			}
		}
	}
	if o.Realtime {
		if o.Redis == "" {
			return usagef("-realtime needs -redis ADDR: in memory, virtual time gives the same answer, faster and reproducibly")
		}
		for _, name := range []string{"store-latency", "outage", "churn", "skew", "stagger"} {
			if set[name] {
				return usagef("-%s is not available with -realtime: faults, skew and sync instants are simulated in virtual time only (drop -realtime)", name)
			}
		}
	}
	if o.Redis != "" && o.StoreLatency > 0 {
		return usagef("-store-latency simulates a round trip in the memory store; with -redis the latency is Redis's own")
	}
	return nil
}

// parseTarget parses -target: a percentage with its sign, 0% to 1000%.
func parseTarget(s string) (float64, error) {
	num, ok := strings.CutSuffix(strings.TrimSpace(s), "%")
	p, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !ok || err != nil || math.IsNaN(p) || p < 0 || p > 1000 {
		return 0, usagef("-target %q is not a percentage from 0%% to 1000%%, e.g. 1%% or 0.5%% (the over-admission allowed over the exact reference)", s)
	}
	return p, nil
}

// loadTrace reads -trace once (see scanTrace) and derives the run's keys,
// length and rate from it. The run lasts -duration if given, else the
// trace's span.
func loadTrace(o *options) error {
	var limit time.Duration
	if o.set["duration"] {
		limit = o.Duration
	}
	info, err := scanTrace(o.Trace, o.TraceSkipBad, limit)
	if err != nil {
		return err
	}
	if info.dur > 24*time.Hour {
		return usagef("-trace %s spans %v, more than 24h: pass -duration to replay its beginning", o.Trace, info.dur)
	}
	o.trace = info
	o.Pattern = "trace"
	o.Keys = len(info.names)
	o.Duration = info.dur
	o.Rate = float64(info.requests) / info.dur.Seconds()
	if !o.set["bucket"] {
		o.Bucket = min(o.Bucket, o.Duration)
	}
	return nil
}

// describeTraffic is the traffic part of the table's first line.
func describeTraffic(o *options) string {
	if o.trace == nil {
		s := fmt.Sprintf("pattern %s · %d keys", o.Pattern, o.Keys)
		if o.Spread == spreadHash {
			s += " · spread hash"
		}
		return s
	}
	t := o.trace
	s := fmt.Sprintf("trace %s (%v, %d requests, %d keys, from %s", o.Trace, t.format, t.requests, o.Keys, t.start.Format(time.RFC3339Nano))
	if t.cut {
		s += ", cut at " + o.Duration.String()
	}
	if t.skipped > 0 {
		s += fmt.Sprintf(", %d malformed lines skipped", t.skipped)
	}
	if t.reordered > 0 {
		s += fmt.Sprintf(", %d out of time order replayed at the instant before them", t.reordered)
	}
	return s + ") · spread " + o.Spread
}
