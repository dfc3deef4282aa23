package hybridlimit

import (
	"context"
	"testing"

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
	for _, rules := range shareRuleSets {
		t.Run(rules[len(rules)-1].String(), func(t *testing.T) {
			most := rules[0].Limit // the largest cost PeekN accepts
			for _, r := range rules {
				most = min(most, r.Limit)
			}
			var buf [MaxRules]RuleState
			nodes := shareSteps(t, rules, func(step int, l *Limiter) bool {
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

				plain := plainAdmits(l, "k", 1+int64(step%7))
				a, err := l.AllowN(ctx, "k", 1+int64(step%7))
				require.NoError(t, err)
				st, err = l.State(ctx, "k", buf[:0])
				require.NoError(t, err)
				got := st[a.Rule]
				require.Equal(t, [2]any{a.Remaining, a.ResetAfter}, [2]any{got.Remaining, got.ResetAfter},
					"step %d: Allow (want) and the State of its rule %d right after it (got), allowed %v", step, a.Rule, a.Allowed)
				return !a.Allowed && plain
			})
			if rules[len(rules)-1].Type != Bucketed { // a view of buckets allocates them
				allocs := testing.AllocsPerRun(100, func() { _, _ = nodes[0].State(ctx, "k", buf[:0]) })
				require.Zero(t, allocs, "State into a slice with room")
			}
		})
	}
}
