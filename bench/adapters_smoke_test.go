package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestAdaptersAdmitExactlyTheLimit checks every adapter the benchmarks use:
// for one key, a burst of requests is admitted exactly up to the tightest
// limit and denied after, with one rule and with three (chained for the
// peers). The windows are long, so no window or token refill can happen
// during the test.
func TestAdaptersAdmitExactlyTheLimit(t *testing.T) {
	sets := []struct {
		name  string
		rules []limit
		want  int
	}{
		{"rules=1", []limit{{5, time.Hour}}, 5},
		{"rules=3", []limit{{10, time.Hour}, {4, 2 * time.Hour}, {20, 24 * time.Hour}}, 4},
	}
	seen := map[string]bool{}
	for _, family := range [][]impl{localImpls, distImpls} {
		for _, im := range family {
			if seen[im.name] {
				continue
			}
			seen[im.name] = true
			for _, set := range sets {
				t.Run("impl="+im.name+"/"+set.name, func(t *testing.T) {
					d := im.new(t, set.rules)
					defer d.close()
					allowed := 0
					var got []bool
					for range 3 * set.want {
						ok := d.allow("smoke-key")
						got = append(got, ok)
						if ok {
							allowed++
						}
					}
					assert.Equal(t, set.want, allowed, "admitted of %d requests: %v", len(got), got)
					for i, ok := range got {
						assert.Equal(t, i < set.want, ok, "request %d", i)
					}
					assert.True(t, d.allow("other-key"), "another key has its own quota")
				})
			}
		}
	}
}
