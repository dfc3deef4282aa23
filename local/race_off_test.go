//go:build !race

package local

// raceOn reports whether the race detector is on, which slows the
// lockstep tests' rounds about fifty times.
const raceOn = false
