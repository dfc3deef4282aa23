// Package wait holds the arithmetic the HTTP and gRPC middleware share for
// the waits they advertise, none of which wraps near the longest Duration
// (a block may end centuries ahead).
package wait

import (
	"math"
	"math/rand/v2"
	"time"
)

// Seconds rounds d up to whole seconds, never below zero.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second) // not (d + 1s − 1) / 1s, which wraps
	if d%time.Second != 0 {
		s++
	}
	return s
}

// Jittered returns d plus a random jitter from 0 to jitter, at most the
// longest Duration; d itself when jitter is not positive.
func Jittered(d, jitter time.Duration) time.Duration {
	if jitter <= 0 {
		return d
	}
	j := time.Duration(rand.Int64N(int64(jitter) + 1))
	if d > math.MaxInt64-j {
		return math.MaxInt64
	}
	return d + j
}
