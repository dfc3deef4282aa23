package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/hybridlimit/hybridlimit"
)

func validPattern(p string) bool {
	for _, q := range patterns {
		if p == q {
			return true
		}
	}
	return false
}

// ruleSyntax is the form of one -rules item.
const ruleSyntax = "LIMIT/WINDOW[:TYPE], TYPE one of sliding, fixed, log, buckets=N, gcra[=BURST], leaky[=QUEUE]"

// parseRules parses "LIMIT/WINDOW[:TYPE],..." (see ruleSyntax) and checks
// the rules as hybridlimit.New would.
func parseRules(s string) ([]hybridlimit.Rule, error) {
	var rules []hybridlimit.Rule
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		spec, typ, hasType := strings.Cut(part, ":")
		lim, win, ok := strings.Cut(spec, "/")
		if !ok {
			return nil, usagef("-rules: %q is not %s; e.g. 1000/1s,5/1m:log,10/1s:gcra=20", part, ruleSyntax)
		}
		limit, err := strconv.ParseInt(lim, 10, 64)
		if err != nil || limit < 1 || limit > hybridlimit.MaxLimit {
			return nil, usagef("-rules: limit %q in %q is not a whole number from 1 to %d", lim, part, int64(hybridlimit.MaxLimit))
		}
		w, err := time.ParseDuration(win)
		if err != nil || w < time.Millisecond || w%time.Millisecond != 0 || w > hybridlimit.MaxWindow {
			return nil, usagef("-rules: window %q in %q is not a whole number of milliseconds from 1ms to %v", win, part, hybridlimit.MaxWindow)
		}
		r := hybridlimit.Rule{Limit: limit, Window: w}
		if hasType {
			name, arg, hasArg := strings.Cut(typ, "=")
			n := int64(0)
			if hasArg {
				if n, err = strconv.ParseInt(arg, 10, 64); err != nil || n < 1 {
					return nil, usagef("-rules: %q in %q is not a whole number from 1", arg, part)
				}
			}
			switch name {
			case "sliding":
			case "fixed":
				r.Type = hybridlimit.Fixed
			case "log":
				r.Type = hybridlimit.Log
			case "buckets":
				r.Type = hybridlimit.Bucketed
				if !hasArg || n > hybridlimit.MaxBuckets {
					return nil, usagef("-rules: %q needs buckets=N, N from 2 to %d", part, hybridlimit.MaxBuckets)
				}
				r.Buckets = int(n)
			case "gcra", "token":
				r.Type, r.Burst = hybridlimit.TokenBucket, n
			case "leaky":
				r.Type, r.Burst = hybridlimit.LeakyBucket, n
			default:
				return nil, usagef("-rules: type %q in %q is not one of sliding, fixed, log, buckets=N, gcra[=BURST], leaky[=QUEUE]", typ, part)
			}
			if hasArg && name != "buckets" && name != "gcra" && name != "token" && name != "leaky" {
				return nil, usagef("-rules: type %q in %q takes no argument", name, part)
			}
		}
		rules = append(rules, r)
	}
	if len(rules) > hybridlimit.MaxRules {
		return nil, usagef("-rules has %d rules, want at most %d", len(rules), hybridlimit.MaxRules)
	}
	if _, err := hybridlimit.New(hybridlimit.Config{Rules: rules, Manual: true}); err != nil {
		return nil, usagef("-rules: %s", strings.TrimPrefix(err.Error(), "hybridlimit: "))
	}
	return rules, nil
}

// parseModes parses "local,sync,async:RATE,...".
func parseModes(s string) ([]modeSpec, error) {
	var out []modeSpec
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, arg, hasArg := strings.Cut(part, ":")
		var m modeSpec
		switch name {
		case "local":
			m.Mode = hybridlimit.ModeLocal
		case "sync", "synchronous":
			m.Mode = hybridlimit.ModeSynchronous
		case "async", "naive":
			m.Mode = hybridlimit.ModeAsync
			if name == "naive" {
				m.Policy = hybridlimit.Naive
			}
			if !hasArg {
				return nil, usagef("-modes: %q needs a sync rate, e.g. %s:100ms", part, name)
			}
			d, err := time.ParseDuration(arg)
			if err != nil || d < time.Millisecond || d > time.Hour {
				return nil, usagef("-modes: sync rate %q in %q is not a duration from 1ms to 1h", arg, part)
			}
			m.SyncRate = d
		default:
			return nil, usagef("-modes: %q is not local, sync, async:RATE or naive:RATE", part)
		}
		if hasArg && m.Mode != hybridlimit.ModeAsync {
			return nil, usagef("-modes: %q takes no argument; only async:RATE and naive:RATE do", part)
		}
		out = append(out, m)
	}
	if len(out) > 64 {
		return nil, usagef("-modes lists %d configurations, want at most 64", len(out))
	}
	return out, nil
}

// parseWindow parses "START+LEN".
func parseWindow(flagName, s string) (window, error) {
	a, b, ok := strings.Cut(s, "+")
	if !ok {
		return window{}, usagef("%s %q is not START+LEN, e.g. 20s+10s", flagName, s)
	}
	from, err1 := time.ParseDuration(a)
	dur, err2 := time.ParseDuration(b)
	if err1 != nil || err2 != nil || from < 0 || dur <= 0 {
		return window{}, usagef("%s %q: START must be a duration ≥ 0 and LEN a duration > 0, e.g. 20s+10s", flagName, s)
	}
	return window{From: from, Dur: dur}, nil
}

// parseChurn parses "K@START+LEN".
func parseChurn(s string) (churn, error) {
	k, w, ok := strings.Cut(s, "@")
	if !ok {
		return churn{}, usagef("-churn %q is not K@START+LEN, e.g. 3@20s+10s", s)
	}
	n, err := strconv.Atoi(k)
	if err != nil || n < 1 {
		return churn{}, usagef("-churn %q: K must be a whole number of nodes ≥ 1", s)
	}
	win, err := parseWindow("-churn", w)
	if err != nil {
		return churn{}, err
	}
	return churn{Nodes: n, window: win}, nil
}

// tightest returns the rule with the smallest limit per second.
func tightest(rules []hybridlimit.Rule) hybridlimit.Rule {
	best := rules[0]
	for _, r := range rules[1:] {
		if perSecond(r) < perSecond(best) {
			best = r
		}
	}
	return best
}

func perSecond(r hybridlimit.Rule) float64 { return float64(r.Limit) / r.Window.Seconds() }
