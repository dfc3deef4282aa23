package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"

	"github.com/stretchr/testify/require"
)

// TestPeekFollowsTheSharePolicy holds PeekN to the decision AllowN makes
// right after it, at the same instant, on three ModeAsync nodes under the
// share policy, whose shares deny what the plain rule admits: the same
// answer, and when admitted the same Result but for Remaining, which a
// peek reports before the request (and ResetAfter, for the counts
// without it).
func TestPeekFollowsTheSharePolicy(t *testing.T) {
	ctx := context.Background()
	for _, rules := range [][]Rule{
		{{Limit: 100, Window: time.Second}},
		{{Limit: 100, Window: time.Second, Type: Fixed}},
		{{Limit: 100, Window: time.Second, Type: Bucketed, Buckets: 5}},
		{{Limit: 100, Window: time.Second}, {Limit: 300, Window: 5 * time.Second, Type: Bucketed, Buckets: 5}},
	} {
		t.Run(rules[len(rules)-1].String(), func(t *testing.T) {
			sr := 100 * time.Millisecond
			nodes, _, mock := newNodes(t, 3, Config{Rules: rules, Mode: ModeAsync, SyncRate: sr, Seed: 7})
			byShare := 0
			for step := range 800 {
				mock.Add(5 * time.Millisecond)
				if step%20 == 0 {
					syncAll(t, nodes)
				}
				l := nodes[step%3]
				if (step/300)%2 == 1 {
					l = nodes[0] // one node takes all, against the others' shares
				}
				var v [MaxRules]local.Counts
				l.def.table.View("k", l.clock.now(), 1, v[:len(rules)])
				plain := true
				for i := range rules {
					plain = plain && l.def.rules[i].Admits(v[i], 1)
				}
				p, err := l.Peek(ctx, "k")
				require.NoError(t, err)
				a, err := l.Allow(ctx, "k")
				require.NoError(t, err)
				if !a.Allowed && plain {
					byShare++
				}
				if p.Allowed {
					// Before the request: one more remaining, and the reset
					// of the counts without it.
					p.Remaining--
					p.ResetAfter = a.ResetAfter
				}
				require.Equal(t, a, p, "step %d: Allow (want) and the Peek before it (got)", step)
			}
			t.Logf("800 steps; denials the share policy made: %d", byShare)
			require.Positive(t, byShare)
		})
	}
}
