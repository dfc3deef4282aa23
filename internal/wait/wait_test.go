package wait

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSeconds(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0}, {0, 0}, {1, 1}, {time.Second, 1}, {time.Second + 1, 2},
		{math.MaxInt64, math.MaxInt64/int64(time.Second) + 1},
	} {
		assert.Equal(t, c.want, Seconds(c.d), "%v", c.d)
	}
}

func TestJittered(t *testing.T) {
	assert.Equal(t, time.Second, Jittered(time.Second, 0))
	for range 100 {
		assert.Equal(t, time.Duration(math.MaxInt64), Jittered(math.MaxInt64, time.Hour))
		assert.GreaterOrEqual(t, Jittered(math.MaxInt64-time.Minute, time.Hour), math.MaxInt64-time.Minute)
	}
	for range 100 {
		d := Jittered(time.Second, time.Millisecond)
		assert.True(t, d >= time.Second && d <= time.Second+time.Millisecond, "%v", d)
	}
}
