package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"

	"github.com/stretchr/testify/require"
)

// shareRuleSets are the rules of the share policy's tests: each kind of
// rule that has a share, alone, and two together.
var shareRuleSets = [][]Rule{
	{{Limit: 100, Window: time.Second}},
	{{Limit: 100, Window: time.Second, Type: Fixed}},
	{{Limit: 100, Window: time.Second, Type: Bucketed, Buckets: 5}},
	{{Limit: 100, Window: time.Second}, {Limit: 300, Window: 5 * time.Second, Type: Bucketed, Buckets: 5}},
}

// shareSteps runs 800 steps of 5 ms on three ModeAsync nodes of rules
// under the share policy, synced every 20 steps, and calls step with the
// node that decides on key "k" at each: in turn, but in every other run of
// 300 steps the first node alone, against the others' shares. step
// reports whether the share policy denied a request the plain rules admit
// (plainAdmits, before deciding); shareSteps fails t unless it did, and
// returns the nodes.
func shareSteps(t *testing.T, rules []Rule, step func(i int, l *Limiter) bool) []*Limiter {
	nodes, _, mock := newNodes(t, 3, Config{Rules: rules, Mode: ModeAsync, SyncRate: 100 * time.Millisecond, Seed: 7})
	byShare := 0
	for i := range 800 {
		mock.Add(5 * time.Millisecond)
		if i%20 == 0 {
			syncAll(t, nodes)
		}
		l := nodes[i%3]
		if (i/300)%2 == 1 {
			l = nodes[0] // one node takes all, against the others' shares
		}
		if step(i, l) {
			byShare++
		}
	}
	t.Logf("800 steps; denials the share policy made: %d", byShare)
	require.Positive(t, byShare)
	return nodes
}

// plainAdmits reports whether l's rules, without the share policy, admit
// a request of cost n on key k now.
func plainAdmits(l *Limiter, k string, n int64) bool {
	rules := l.def.rules
	var v [MaxRules]local.Counts
	l.def.table.View(k, l.clock.now(), n, v[:len(rules)])
	for i := range rules {
		if !rules[i].Admits(v[i], n) {
			return false
		}
	}
	return true
}

// TestPeekFollowsTheSharePolicy holds PeekN to the decision AllowN makes
// right after it, at the same instant, on three ModeAsync nodes under the
// share policy, whose shares deny what the plain rule admits: the same
// answer, and when admitted the same Result but for Remaining, which a
// peek reports before the request (and ResetAfter, for the counts
// without it).
func TestPeekFollowsTheSharePolicy(t *testing.T) {
	ctx := context.Background()
	for _, rules := range shareRuleSets {
		t.Run(rules[len(rules)-1].String(), func(t *testing.T) {
			shareSteps(t, rules, func(step int, l *Limiter) bool {
				plain := plainAdmits(l, "k", 1)
				p, err := l.Peek(ctx, "k")
				require.NoError(t, err)
				a, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				if p.Allowed {
					// Before the request: one more remaining, and the reset
					// of the counts without it.
					p.Remaining--
					p.ResetAfter = a.ResetAfter
				}
				require.Equal(t, a, p, "step %d: Allow (want) and the Peek before it (got)", step)
				return !a.Allowed && plain
			})
		})
	}
}
