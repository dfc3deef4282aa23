package hybridlimit

import (
	"context"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit/local"

	"github.com/stretchr/testify/require"
)

// TestStateFollowsTheSharePolicy holds State to what AllowN would admit at
// the same instant, on three ModeAsync nodes under the share policy, whose
// shares deny what the plain rule admits: before each decision the least
// Remaining of the rules is the largest cost PeekN admits, and no rule
// reports less; right after it (of a cost from 1 to 7), the decision's
// rule reports the decision's Remaining and ResetAfter. It allocates
// nothing.
func TestStateFollowsTheSharePolicy(t *testing.T) {
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
			most := rules[0].Limit // the largest cost PeekN accepts
			for _, r := range rules {
				most = min(most, r.Limit)
			}
			var buf [MaxRules]RuleState
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
				st, err := l.State(ctx, "k", buf[:0])
				require.NoError(t, err)
				// The largest cost PeekN admits now (admission falls as the
				// cost grows): admits is admitted, above is not.
				admits, above := int64(0), most+1
				for above-admits > 1 {
					n := admits + (above-admits)/2
					p, err := l.PeekN(ctx, "k", n)
					require.NoError(t, err)
					if p.Allowed {
						admits = n
					} else {
						above = n
					}
				}
				least := st[0].Remaining
				for _, s := range st {
					least = min(least, s.Remaining)
				}
				require.Equal(t, admits, least, "step %d: the largest cost PeekN admits (want) and State's least Remaining (got): %+v", step, st)

				var v [MaxRules]local.Counts
				l.def.table.View("k", l.clock.now(), 1+int64(step%7), v[:len(rules)])
				plain := true
				for i := range rules {
					plain = plain && l.def.rules[i].Admits(v[i], 1+int64(step%7))
				}
				a, err := l.AllowN(ctx, "k", 1+int64(step%7))
				require.NoError(t, err)
				if !a.Allowed && plain {
					byShare++
				}
				st, err = l.State(ctx, "k", buf[:0])
				require.NoError(t, err)
				got := st[a.Rule]
				require.Equal(t, [2]any{a.Remaining, a.ResetAfter}, [2]any{got.Remaining, got.ResetAfter},
					"step %d: Allow (want) and the State of its rule %d right after it (got), allowed %v", step, a.Rule, a.Allowed)
			}
			t.Logf("800 steps; denials the share policy made: %d", byShare)
			require.Positive(t, byShare)
			if rules[len(rules)-1].Type != Bucketed { // a view of buckets allocates them
				allocs := testing.AllocsPerRun(100, func() { _, _ = nodes[0].State(ctx, "k", buf[:0]) })
				require.Zero(t, allocs, "State into a slice with room")
			}
		})
	}
}
