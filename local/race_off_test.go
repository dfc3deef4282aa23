//go:build !race

package local

// raceOn reports whether the race detector is on, which slows the
// lockstep tests' rounds about fifty times: they run fewer rounds then,
// and scripts/test.sh runs them whole without it (list a new one there).
const raceOn = false
