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

// The synchronous mode's goals: decisions/s is 10⁹ ÷ ns/op, so the ratio
// to a peer or to the take script is their ns/op over the synchronous
// mode's; the take script's ceiling is its faster variant (two calls on
// their way at once, as the synchronous mode sends them, when that is
// faster than one at a time).
func TestGoalsSynchronousCeiling(t *testing.T) {
	out := `BenchmarkDistributed/impl=hybridlimit-sync/keys=1k/rules=1/goroutines=64-2  1  10000 ns/op
BenchmarkDistributed/impl=redis-rate/keys=1k/rules=1/goroutines=64-2  1  30000 ns/op
BenchmarkTakeScript/impl=take-script/keys=1k/rules=1/batch=512/inflight=1-2  1  8000 ns/op
BenchmarkTakeScript/impl=take-script/keys=1k/rules=1/batch=512/inflight=2-2  1  5000 ns/op
`
	var w bytes.Buffer
	printReport(&w, parse(strings.NewReader(out)), nil, "test CPU", time.Second, "1s", 1, 1)
	got := w.String()
	for _, want := range []string{
		"| synchronous ≥ 4× redis_rate decisions/s, 64 goroutines | 100k vs 33k decisions/s: 3.00× | **no** |",
		"| synchronous ≥ 0.8× the take script alone, 64 goroutines | 100k vs 200k decisions/s (2 in flight): 0.50× | **no** |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	// Without the two-call variant (a run of before it), the one-call
	// figure is the ceiling.
	one := strings.Replace(out, "BenchmarkTakeScript/impl=take-script/keys=1k/rules=1/batch=512/inflight=2-2  1  5000 ns/op\n", "", 1)
	w.Reset()
	printReport(&w, parse(strings.NewReader(one)), nil, "test CPU", time.Second, "1s", 1, 1)
	if want := "| synchronous ≥ 0.8× the take script alone, 64 goroutines | 100k vs 125k decisions/s (1 in flight): 0.80× | yes |"; !strings.Contains(w.String(), want) {
		t.Errorf("missing %q in:\n%s", want, w.String())
	}
}
