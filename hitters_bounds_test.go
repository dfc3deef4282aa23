package hybridlimit

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A sketch's costs saturate instead of wrapping: a tag counted past
// MaxInt64 (8.4M denials of cost MaxLimit) stays the top contributor.
func TestSketchCostSaturates(t *testing.T) {
	s := &sketch{}
	s.add("a", MaxLimit, 0)
	s.add("b", 1, 0)
	s.cost[0], s.pending[0] = math.MaxInt64-10, math.MaxInt64-10
	s.add("a", MaxLimit, 1)
	assert.Equal(t, []Contributor{{"a", math.MaxInt64}, {"b", 1}}, s.top())
	tags := s.take()
	assert.Equal(t, int64(math.MaxInt64), tags[0].Count)
	// A tag taking the place of one at MaxInt64 saturates too.
	for i := range s.tags {
		s.tags[i], s.cost[i] = string(rune('c'+i)), math.MaxInt64
	}
	s.add("z", MaxLimit, 2)
	for _, c := range s.top() {
		assert.Positive(t, c.Cost, c.Tag)
	}
}
