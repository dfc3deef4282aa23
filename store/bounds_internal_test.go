package store

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
)

// escalation doubles without overflow whatever the strikes: it stops at
// max, and every length lies within [base, max].
func TestEscalationBounds(t *testing.T) {
	const maxWindow = 366 * 24 * time.Hour // hybridlimit.MaxWindow
	for _, c := range []struct{ base, max time.Duration }{
		{time.Second, maxWindow},
		{time.Second, time.Second},
		{maxWindow, maxWindow},
		{time.Second, 3 * time.Second},
		{maxWindow/2 + 1, maxWindow},
	} {
		prev := time.Duration(0)
		for _, n := range []int{math.MinInt, -1, 0, 1, 2, 3, 30, 62, 63, 64, 1000, math.MaxInt32, math.MaxInt - 1, math.MaxInt} {
			d := escalation(c.base, c.max, n)
			if d < c.base || d > c.max {
				t.Errorf("escalation(%v, %v, %d) = %v, want %v to %v", c.base, c.max, n, d, c.base, c.max)
			}
			if n >= 1 && d < prev {
				t.Errorf("escalation(%v, %v, %d) = %v, less than for fewer strikes (%v)", c.base, c.max, n, d, prev)
			}
			if n >= 1 {
				prev = d
			}
		}
		if got := escalation(c.base, c.max, 2); got != min(2*c.base, c.max) {
			t.Errorf("escalation(%v, %v, 2) = %v, want %v", c.base, c.max, got, min(2*c.base, c.max))
		}
	}
}

// A tag's count in the memory store saturates instead of wrapping.
func TestMemoryTagsSaturate(t *testing.T) {
	s := NewMemory(nil)
	ctx := context.Background()
	for range 3 {
		if err := s.AddTags(ctx, "p", "k", []TagCount{{"a", math.MaxInt64 / 2}, {"b", 1}}, 32, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Tags(ctx, "p", "k", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (TagCount{"a", math.MaxInt64}) || got[1] != (TagCount{"b", 3}) {
		t.Errorf("Tags = %v, want [{a %d} {b 3}]", got, int64(math.MaxInt64))
	}
}

// A tag's score in Redis at or past 2^63 (a float) reads as MaxInt64, not
// as whatever the conversion gives.
func TestRedisTagsSaturate(t *testing.T) {
	c := redistest.Client(t)
	s, err := NewRedis(c, RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pfx := redistest.Prefix(t)
	if err := s.AddTags(ctx, pfx, "k", []TagCount{{"a", math.MaxInt64}, {"b", 3}}, 32, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTags(ctx, pfx, "k", []TagCount{{"a", math.MaxInt64}}, 32, time.Minute); err != nil {
		t.Fatal(err)
	}
	got, err := s.Tags(ctx, pfx, "k", 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != (TagCount{"a", math.MaxInt64}) || got[1] != (TagCount{"b", 3}) {
		t.Errorf("Tags = %v, want [{a %d} {b 3}]", got, int64(math.MaxInt64))
	}
}
