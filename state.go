package hybridlimit

import (
	"context"
	"time"
)

// RuleState is one rule's state for one key.
type RuleState struct {
	// Rule is the index in Config.Rules; Limit and Window are that rule's.
	Rule   int
	Limit  int64
	Window time.Duration
	// Remaining is the cost the rule still admits now.
	Remaining int64
	// ResetAfter is how long until the rule is back to its full limit, if
	// nothing is admitted meanwhile.
	ResetAfter time.Duration
}

// State appends the state of every rule for key, as this node sees it now,
// to dst and returns the extended slice. It consumes nothing and does no
// I/O in any mode: in ModeSynchronous it reports the counts seen by this
// node's last decision on key. Use it to fill per-rule response headers
// after a decision. It allocates only when dst lacks room.
func (l *Limiter) State(ctx context.Context, key string, dst []RuleState) ([]RuleState, error) {
	if err := l.check(key, 1, "State"); err != nil {
		return dst, err
	}
	now := l.now()
	e, ok := l.table.Load(key)
	for i := range l.rules {
		r := &l.rules[i]
		s := RuleState{Rule: i, Limit: r.limit, Window: r.window, Remaining: r.limit}
		if ok {
			v := l.view(e, i, now)
			s.Remaining = r.remaining(r.estimate(v.prev, v.cur, v.elapsed))
			s.ResetAfter = r.resetAfter(v.prev, v.cur, v.elapsed)
		}
		dst = append(dst, s)
	}
	return dst, nil
}
