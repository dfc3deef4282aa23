package httplimit

import (
	"fmt"
	"strconv"
	"time"
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

// seconds rounds d up to whole seconds, never below zero: the
// delay-seconds of Retry-After and the draft's "w" and "t" parameters.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// policyHeader builds the RateLimit-Policy value: one Item per rule, the
// policy name with its quota "q" and window "w" in seconds. The draft
// allows no sub-second window, so a window that is not a whole number of
// seconds is rounded up, which understates the rate (q/w), never
// overstates it.
func policyHeader(names []string, limits []int64, windows []time.Duration) string {
	var b []byte
	for i := range names {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendSFString(b, names[i])
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, limits[i], 10)
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, max(seconds(windows[i]), 1), 10)
	}
	return string(b)
}
