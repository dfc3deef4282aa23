package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// parseTimestamp parses a CSV or JSON timestamp: RFC 3339 (fraction
// optional); a whole number of 13 digits or more: Unix milliseconds; any
// other decimal number, with an optional fraction: Unix seconds (to the
// nanosecond; further digits are dropped).
func parseTimestamp(s string) (int64, tsKind, error) {
	whole, frac, hasFrac := strings.Cut(s, ".")
	if !digits(whole) || (hasFrac && !digits(frac)) {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return 0, 0, fmt.Errorf("timestamp %q is not RFC 3339 (2030-01-01T00:00:00.25Z), Unix seconds (1893456000.25) or Unix milliseconds (1893456000250)", s)
		}
		if t.Year() < 1678 || t.Year() > 2261 {
			return 0, 0, fmt.Errorf("timestamp %q is out of range", s)
		}
		return t.UnixNano(), tsRFC3339, nil
	}
	n, err := strconv.ParseInt(whole, 10, 64)
	if !hasFrac && len(whole) >= 13 {
		if err != nil || n > math.MaxInt64/1_000_000 {
			return 0, 0, fmt.Errorf("timestamp %q is out of range", s)
		}
		return n * 1_000_000, tsUnixMs, nil
	}
	if err != nil || n >= math.MaxInt64/1_000_000_000 {
		return 0, 0, fmt.Errorf("timestamp %q is out of range", s)
	}
	var ns int64
	for i := range 9 {
		ns *= 10
		if i < len(frac) {
			ns += int64(frac[i] - '0')
		}
	}
	return n*1_000_000_000 + ns, tsUnixS, nil
}

// digits reports whether s is one or more ASCII digits.
func digits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}
