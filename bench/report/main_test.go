package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// The goals read the rotation's figures when the run has them, and the
// single run's otherwise.
func TestGoalsReadTheRotation(t *testing.T) {
	out := `cpu: test CPU
BenchmarkLocal/impl=hybridlimit-local/keys=100k/rules=1/procs=1-2  1  500 ns/op  0 B/op  0 allocs/op
BenchmarkLocal/impl=throttled-memory/keys=100k/rules=1/procs=1-2  1  400 ns/op  0 B/op  0 allocs/op
BenchmarkLocal/impl=sethvargo-memory/keys=100k/rules=1/procs=1-2  1  300 ns/op  0 B/op  0 allocs/op
`
	var rot strings.Builder
	for _, ns := range []string{"100", "900", "120"} { // three rounds: the median is 120
		rot.WriteString("BenchmarkRotationLocal/impl=hybridlimit-local/keys=100k/rules=1/procs=1-2  1  " + ns + " ns/op  0 B/op  0 allocs/op\n")
	}
	rot.WriteString("BenchmarkRotationLocal/impl=throttled-memory/keys=100k/rules=1/procs=1-2  1  400 ns/op  0 B/op  0 allocs/op\n")
	rot.WriteString("BenchmarkRotationLocal/impl=sethvargo-memory/keys=100k/rules=1/procs=1-2  1  300 ns/op  0 B/op  0 allocs/op\n")

	report := func(text string) string {
		var w bytes.Buffer
		printReport(&w, parse(strings.NewReader(text)), nil, "test CPU", time.Second, "1s", 1, 3)
		return w.String()
	}
	single := report(out)
	if !strings.Contains(single, "| 100k uniform keys, 1 procs: ≤ 0.8× throttled and ≤ 1.0× sethvargo | 500 ns vs throttled 400 (1.25×), sethvargo 300 (1.67×) | **no** |") {
		t.Errorf("without a rotation, the goal reads the single run:\n%s", single)
	}
	rotated := report(out + rot.String())
	if !strings.Contains(rotated, "| 100k uniform keys, 1 procs: ≤ 0.8× throttled and ≤ 1.0× sethvargo | 120 ns vs throttled 400 (0.30×), sethvargo 300 (0.40×) (rotation, median of 3 rounds) | yes |") {
		t.Errorf("with a rotation, the goal reads its medians:\n%s", rotated)
	}
	if !strings.Contains(rotated, "### The goals' timed cases in rotation (median of 3 rounds)") {
		t.Errorf("the rotation's table is missing:\n%s", rotated)
	}
}
