//go:build !race

package hybridlimit

// raceOn reports whether the race detector is on, which slows the
// single-goroutine property tests tenfold: they run fewer cases then,
// and scripts/test.sh runs them whole without it (list a new one there);
// the fault tests whose claims are timings check those only without it
// (RaceOn).
const raceOn = false
