package hybridlimit

import (
	"testing"
	"time"
)

// TestLeakyBucketQueueLength checks LeakyBucket's doc on exact instants:
// with Burst 3 at 1 per second, three requests at once are admitted, with
// delays 0, 1 s and 2 s; the fourth, which would wait for three others,
// is denied until the first has left, and is then admitted with a delay of
// 2 s, behind the two still queued.
func TestLeakyBucketQueueLength(t *testing.T) {
	rules := []Rule{{Limit: 1, Window: time.Second, Type: LeakyBucket, Burst: 3}}
	eachMode(t, rules, func(t *testing.T, l *Limiter, mock *stepClock) {
		t0 := at(12, 0, 0)
		runAlgoSteps(t, l, mock, "k", []algoStep{
			{at: t0, n: 1, allowed: true, delay: 0, remaining: 2, rule: 0},
			{at: t0, n: 1, allowed: true, delay: time.Second, remaining: 1, rule: 0},
			{at: t0, n: 1, allowed: true, delay: 2 * time.Second, remaining: 0, rule: 0},
			{at: t0, n: 1, allowed: false, retry: time.Second, remaining: 0, rule: 0},
			{at: t0.Add(time.Second - time.Microsecond), n: 1, allowed: false, retry: time.Microsecond, remaining: 0, rule: 0},
			{at: t0.Add(time.Second), n: 1, allowed: true, delay: 2 * time.Second, remaining: 0, rule: 0},
			{at: t0.Add(2 * time.Second), n: 2, allowed: false, retry: time.Second, remaining: 1, rule: 0},
			{at: t0.Add(3 * time.Second), n: 2, allowed: true, delay: time.Second, remaining: 0, rule: 0},
			{at: t0.Add(3 * time.Second), n: 3, allowed: false, retry: 3 * time.Second, remaining: 0, rule: 0},
		})
	})
}
