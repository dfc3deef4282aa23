//go:build race

package hybridlimit

// raceOn reports whether the race detector is on, which slows the
// single-goroutine property tests tenfold: they run fewer cases then.
const raceOn = true
