package hybridlimit

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// A node keeps sketches of at most maxSketchKeys keys: a new key beyond
// them counts nothing until the sketches unseen for two of their longest
// windows are forgotten, also in ModeLocal, which has no store to flush
// them to.
func TestSketchKeysBounded(t *testing.T) {
	l, mock := newTiered(t, BanPolicy{}) // default tier: 1 minute
	ctx := context.Background()
	now := mock.Now().UnixNano()
	for i := range maxSketchKeys {
		l.noteTag(fmt.Sprintf("k%d", i), "t", 1, "")
	}
	l.noteTag("over", "t", 1, "")
	got, err := l.Contributors(ctx, "over")
	require.NoError(t, err)
	assert.Empty(t, got, "a key beyond the bound")
	got, err = l.Contributors(ctx, "k0")
	require.NoError(t, err)
	assert.Equal(t, []Contributor{{"t", 1}}, got)
	assert.Equal(t, maxSketchKeys, l.hit.m.Size())

	mock.Set(time.Unix(0, now).Add(2*time.Minute + 1))
	l.noteTag("over", "t", 1, "")
	got, err = l.Contributors(ctx, "over")
	require.NoError(t, err)
	assert.Equal(t, []Contributor{{"t", 1}}, got, "once the idle sketches are forgotten")
	assert.Equal(t, 1, l.hit.m.Size())
}
