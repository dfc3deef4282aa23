package hybridlimit

// RaceOn is raceOn for the package's external tests: the fault tests whose
// claims are timings check them only without the race detector.
const RaceOn = raceOn
