package httplimit

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/wait"
)

// Canonical header names, as net/http stores them, so that the middleware
// can set them without canonicalizing on every request.
const (
	headerPolicy     = "Ratelimit-Policy"    // RateLimit-Policy
	headerRateLimit  = "Ratelimit"           // RateLimit
	headerLimit      = "Ratelimit-Limit"     // RateLimit-Limit
	headerRemaining  = "Ratelimit-Remaining" // RateLimit-Remaining
	headerReset      = "Ratelimit-Reset"     // RateLimit-Reset
	headerRetryAfter = "Retry-After"
)

// PolicyName returns the default name of a rule's policy in the
// RateLimit-Policy and RateLimit headers: its window in the largest whole
// unit among days, hours, minutes, seconds and milliseconds ("1s", "15m",
// "1h", "1d", "250ms"). Names are stable as long as the rules are.
func PolicyName(window time.Duration) string {
	switch {
	case window <= 0:
		return "0s"
	case window%(24*time.Hour) == 0:
		return strconv.FormatInt(int64(window/(24*time.Hour)), 10) + "d"
	case window%time.Hour == 0:
		return strconv.FormatInt(int64(window/time.Hour), 10) + "h"
	case window%time.Minute == 0:
		return strconv.FormatInt(int64(window/time.Minute), 10) + "m"
	case window%time.Second == 0:
		return strconv.FormatInt(int64(window/time.Second), 10) + "s"
	}
	return strconv.FormatInt(window.Milliseconds(), 10) + "ms"
}

// checkSFString reports whether s can be a structured-field String (RFC
// 9651 section 3.3.3): printable ASCII only.
func checkSFString(s string) error {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("byte %#x at %d is not printable ASCII", c, i)
		}
	}
	return nil
}

// appendSFString appends s as a structured-field String: quoted, with '"'
// and '\' escaped. s must pass checkSFString.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// Quota returns the quota a rule advertises and the window it is given
// over: Limit per Window; for a token or leaky bucket, its burst (Burst,
// or Limit when Burst is 0) over the time the burst takes to come back at
// the rate, Window·burst/Limit rounded down to the nanosecond (so that
// quota/window is the rate).
//
// Quota is defined for every Rule, also one New would refuse: the quota is
// never negative (a negative count gives 0), nor is the window, which is 0
// when it cannot be computed (a Window not above 0, or a bucket whose
// Limit is not above 0 or whose burst is 0) and saturates at the longest
// time.Duration when the exact value is longer.
func Quota(r hybridlimit.Rule) (quota int64, window time.Duration) {
	if r.Type != hybridlimit.TokenBucket && r.Type != hybridlimit.LeakyBucket {
		return max(r.Limit, 0), max(r.Window, 0)
	}
	burst := r.Burst
	if burst == 0 {
		burst = r.Limit
	}
	burst = max(burst, 0)
	if r.Window <= 0 || r.Limit <= 0 || burst == 0 {
		return burst, 0
	}
	// Window·burst/Limit in 128 bits: all three are positive int64s.
	hi, lo := bits.Mul64(uint64(r.Window), uint64(burst))
	if hi >= uint64(r.Limit) { // the quotient needs more than 64 bits
		return burst, math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(r.Limit))
	return burst, time.Duration(min(q, math.MaxInt64))
}

// seconds rounds d up to whole seconds, never below zero: the
// delay-seconds of Retry-After and the draft's "w" and "t" parameters.
func seconds(d time.Duration) int64 { return wait.Seconds(d) }

// Policy names a limiter's rules as the rate-limit draft's policies, one
// per rule, and formats the draft's two fields: RateLimit-Policy, fixed for
// a set of rules, and RateLimit, which describes one key's state. The
// Middleware formats its headers with one; other transports use one to send
// the same values (package grpclimit sends them as gRPC metadata). A Policy
// is immutable and safe for concurrent use; the zero value is not usable.
type Policy struct {
	names []string
	field string // the RateLimit-Policy value
}

// NewPolicy returns the Policy of rules (a Limiter's Rules), naming rule i
// names[i]; nil names name each rule after its window (see PolicyName).
// Names must be unique, non-empty printable ASCII; an error names the
// offending index of names.
func NewPolicy(rules []hybridlimit.Rule, names []string) (*Policy, error) {
	if len(rules) == 0 {
		return nil, errors.New("httplimit: NewPolicy: no rules")
	}
	return newPolicy(rules, names, "NewPolicy: names")
}

// newPolicy is NewPolicy, with field naming names in errors.
func newPolicy(rules []hybridlimit.Rule, names []string, field string) (*Policy, error) {
	if names != nil && len(names) != len(rules) {
		return nil, fmt.Errorf("httplimit: %s has %d names, want one per rule: %d", field, len(names), len(rules))
	}
	p := &Policy{names: make([]string, len(rules))}
	taken := func(name string, i int) bool { return slices.Contains(p.names[:i], name) }
	for i, r := range rules {
		name := PolicyName(r.Window)
		if names != nil {
			name = names[i]
		} else if taken(name, i) {
			// Rules of one window and other algorithms: named after
			// both, then after their place.
			if name += "-" + r.Type.String(); taken(name, i) {
				name += "-" + strconv.Itoa(i)
			}
		}
		if name == "" {
			return nil, fmt.Errorf("httplimit: %s[%d] is empty", field, i)
		}
		if err := checkSFString(name); err != nil {
			return nil, fmt.Errorf("httplimit: %s[%d] is %q: %v; want printable ASCII", field, i, name, err)
		}
		for j, prev := range p.names[:i] {
			if prev == name {
				return nil, fmt.Errorf("httplimit: %s: policy name %q of rule %d repeats rule %d's", field, name, i, j)
			}
		}
		p.names[i] = name
	}
	// One Item per rule: the policy name with its quota "q" and window "w"
	// in seconds. The draft allows no sub-second window, so a window that
	// is not a whole number of seconds is rounded up, which understates the
	// rate (q/w), never overstates it. A token or leaky bucket's quota is
	// its burst, and its window the time the burst takes to come back at
	// the rate: q/w is the rate.
	var b []byte
	for i, r := range rules {
		if i > 0 {
			b = append(b, ", "...)
		}
		q, w := Quota(r)
		b = appendSFString(b, p.names[i])
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, q, 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, max(seconds(w), 1), 10)
	}
	p.field = string(b)
	return p, nil
}

// Names returns the policy name of every rule, in the rules' order.
func (p *Policy) Names() []string { return append([]string(nil), p.names...) }

// Field returns the value of the RateLimit-Policy field: one Item per rule,
// its name with its quota "q" and its window "w" in seconds (rounded up,
// at least 1), such as `"1s";q=10;w=1, "1m";q=300;w=60`.
func (p *Policy) Field() string { return p.field }

// AppendRateLimit appends the value of the RateLimit field for states (one
// key's state, as Limiter.State reports it, or any subset of its rules) to
// b and returns the extended buffer: one Item per state, named after its
// rule, with the remaining quota "r" (at least 0) and the seconds until the
// rule resets "t", rounded up, such as `"1s";r=9;t=1`. A positive maxT caps
// every t: on a denial, pass the Retry-After delay in seconds, so that
// Retry-After never points before the end of an effective window (the
// draft's SHOULD) and no client is told to wait longer than needed. States
// of rules the Policy does not have are skipped.
func (p *Policy) AppendRateLimit(b []byte, states []hybridlimit.RuleState, maxT int64) []byte {
	first := true
	for _, s := range states {
		if s.Rule < 0 || s.Rule >= len(p.names) {
			continue
		}
		if !first {
			b = append(b, ", "...)
		}
		first = false
		t := seconds(s.ResetAfter)
		if maxT > 0 {
			t = min(t, maxT)
		}
		b = appendSFString(b, p.names[s.Rule])
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, max(s.Remaining, 0), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
	}
	return b
}
