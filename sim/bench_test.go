package main

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkSim runs the speed bar: 10 nodes, 60 virtual seconds, 20k
// requests/s in total (1.2M decisions, with the reference and the sliding
// log), in memory mode, one configuration per mode.
func BenchmarkSim(b *testing.B) {
	for _, mode := range []string{"local", "sync", "async:100ms"} {
		b.Run(fmt.Sprintf("nodes:10;duration:60s;rate:20000;mode:%s", mode), func(b *testing.B) {
			o, err := parseFlags([]string{"-nodes", "10", "-duration", "60s", "-rate", "20000", "-modes", mode, "-quiet"}, io.Discard)
			require.NoError(b, err)
			b.ReportAllocs()
			var decisions int64
			for b.Loop() {
				reps, err := simulate(o, io.Discard)
				require.NoError(b, err)
				decisions += reps[0].Requests
			}
			b.ReportMetric(float64(decisions)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(time.Second), "s/run")
		})
	}
}
