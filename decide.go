package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Errors returned by decisions.
var (
	// ErrClosed is returned by decisions on a Limiter after Close.
	ErrClosed = errors.New("hybridlimit: limiter is closed")
	// ErrEmptyKey is returned for an empty key.
	ErrEmptyKey = errors.New("hybridlimit: empty key")
	// ErrKeyTooLong is wrapped by the error returned for a key longer than
	// Config.MaxKeyLen.
	ErrKeyTooLong = errors.New("hybridlimit: key too long")
	// ErrCost is wrapped by the error returned for a cost below 1 or above
	// what some rule admits at once (its Limit, or a bucket's Burst).
	ErrCost = errors.New("hybridlimit: invalid cost")
	// ErrUnknownTier is wrapped by the error returned when Config.TierOf
	// names a tier that is not in Config.Tiers, and by SetOverride's for
	// such a tier.
	ErrUnknownTier = errors.New("hybridlimit: unknown tier")
)

// Result is the outcome of one decision. Limit, Remaining and ResetAfter
// describe one rule, Rule: when the request is denied, the denying rule
// that needs the longest wait; otherwise the tightest rule (the least
// remaining).
type Result struct {
	// Allowed reports whether the request was admitted (for Peek: would be).
	Allowed bool
	// Degraded reports that the store failed and the decision was made by
	// the FailurePolicy (or the key table was full).
	Degraded bool
	// Blocked reports that the key is blocked (Limiter.Block, or a
	// BanPolicy): the request was denied before any rule counted it, and
	// RetryAfter is the time left on the block.
	Blocked bool
	// Rule is the index of the rule described below in the rules of the
	// key's tier (Config.Rules for the default tier, "").
	Rule int
	// Limit and Window are that rule's.
	Limit  int64
	Window time.Duration
	// Remaining is the cost that rule still admits, after this request.
	Remaining int64
	// RetryAfter is how long until this same request would be admitted, if
	// nothing else is admitted meanwhile: zero when Allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until that rule is back to its full limit, if
	// nothing else is admitted meanwhile.
	ResetAfter time.Duration
	// Delay is how long an admitted request must wait before it proceeds:
	// its turn in a LeakyBucket rule's queue (the longest, with several).
	// Zero for the other algorithms, and when denied. WaitN waits it.
	Delay time.Duration
	// Tier is the name of the key's tier ("" for Config.Rules); Rule
	// indexes that tier's rules.
	Tier string
}

// Allow is AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Result, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN decides a request of cost n for key and, if it is admitted,
// consumes n from every rule. In ModeLocal and ModeAsync it does no I/O and
// ignores ctx; in ModeSynchronous it makes one round trip to the store
// (shared with concurrent decisions) and returns ctx's error if ctx is done
// before it starts, or, for a node's first decisions, before its first
// read of the store's clock returns (see Config.ClockSync). The error is
// non-nil only for invalid input (an empty or oversized key, n < 1 or n
// above what some rule of the key's tier admits at once: its Limit, or a
// bucket's Burst; a tier named by Config.TierOf that is not in
// Config.Tiers), after Close, or for a done ctx;
// store failures are decided by the FailurePolicy and reported in
// Result.Degraded.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (res Result, err error) {
	if !l.plain(key, n) {
		return l.allowRouted(ctx, key, n, "AllowN")
	}
	t, now := l.def, l.clock.now()
	if i, rem, reset := t.table.Allow1(key, n, now); i >= 0 {
		// Field by field into the zeroed result (a composite literal
		// would be built in a temporary and copied); Tier stays "",
		// the default tier's name.
		r := &t.cfg[i]
		res.Allowed, res.Rule, res.Limit, res.Window = true, i, r.Limit, r.Window
		res.Remaining, res.ResetAfter = rem, time.Duration(reset)
		return res, nil
	}
	return l.decideLocal(t, key, n, now, true)
}

// allowRouted is AllowN for every case but the common one: invalid input,
// tiers and policies, ModeSynchronous, FailClosed; op names the method in
// errors.
func (l *Limiter) allowRouted(ctx context.Context, key string, n int64, op string) (Result, error) {
	t, kp, err := l.route(key, n, op)
	if err != nil {
		return Result{Rule: -1}, err
	}
	if kp != nil {
		if b := kp.blocked(l.clock.now()); b != nil {
			return l.blockedResult(t, b), nil
		}
	}
	if l.sync != nil {
		return l.sync.decide(ctx, t, key, n, false)
	}
	if l.failingClosed(key) {
		return l.failClosed(t, true), nil
	}
	now := l.clock.now()
	if i, rem, reset := t.table.Allow1(key, n, now); i >= 0 {
		// A tier's or a routed key's decision takes the table's fast path
		// too: policies cost a lookup, not the general path.
		r := &t.cfg[i]
		return Result{Allowed: true, Rule: i, Limit: r.Limit, Window: r.Window, Remaining: rem, ResetAfter: time.Duration(reset), Tier: t.name}, nil
	}
	return l.decideLocal(t, key, n, now, true)
}

// blockedResult answers a request of a blocked key.
func (l *Limiter) blockedResult(t *tier, b *store.Policy) Result {
	l.blocked.Add(1)
	return t.blocked(b, l.clock.now())
}

// decideLocal decides on this node's table of t, from the start; bans
// counts a denial towards Config.Ban.
func (l *Limiter) decideLocal(t *tier, key string, n, now int64, bans bool) (Result, error) {
	d, st := t.table.Allow(key, n, now)
	if st != local.Decided {
		return l.undecided(t, st, n)
	}
	if bans && !d.Allowed && l.bans != nil {
		l.noteDenied(key, now)
	}
	return t.result(d), nil
}

// undecided answers a decision the table did not make.
func (l *Limiter) undecided(t *tier, st local.Status, n int64) (Result, error) {
	if st == local.Full {
		return l.untracked(t, n), nil
	}
	return Result{Rule: -1}, ErrClosed
}

// Peek is PeekN(ctx, key, 1).
func (l *Limiter) Peek(ctx context.Context, key string) (Result, error) {
	return l.PeekN(ctx, key, 1)
}

// PeekN reports whether a request of cost n for key would be admitted now,
// without consuming anything: the answer AllowN would give, the share
// policy of ModeAsync included. Remaining is what is left before the
// request.
// It makes a store round trip in ModeSynchronous only.
func (l *Limiter) PeekN(ctx context.Context, key string, n int64) (Result, error) {
	return l.peek(ctx, key, n, "PeekN")
}

// peek is PeekN; op names the method in errors.
func (l *Limiter) peek(ctx context.Context, key string, n int64, op string) (Result, error) {
	t, kp, err := l.route(key, n, op)
	if err != nil {
		return Result{Rule: -1}, err
	}
	if b := kp.blocked(l.clock.now()); b != nil {
		return t.blocked(b, l.clock.now()), nil
	}
	if l.sync != nil {
		return l.sync.decide(ctx, t, key, n, true)
	}
	if l.failingClosed(key) {
		return l.failClosed(t, false), nil
	}
	now := l.clock.now()
	if t.table.Len() >= l.cfg.MaxKeys && !t.table.Tracked(key) {
		return l.untrackedResult(t), nil // a new key would not be tracked
	}
	return t.result(t.table.Peek(key, n, now)), nil
}

// Wait is WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) (Result, error) {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until a request of cost n for key is admitted, and consumes
// it; for a LeakyBucket rule it then waits the request's Delay, its turn in
// the queue. It returns an error wrapping context.DeadlineExceeded,
// without waiting, if ctx's deadline comes before the request could be
// admitted or, once admitted, before its Delay ends (its turn in the queue
// stays taken: Result.Allowed is set), and ctx's error if ctx is done
// while waiting, or at once, consuming nothing, if ctx is done already.
// Time is measured on the configured Clock. A change of the policies this
// node sees (Unblock, SetOverride, RemoveOverride, here or, within a sync
// period, on another node) ends a wait early: the request is looked at
// again (as PeekN does, counting nothing) and decided once it would be
// admitted.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{Rule: -1}, err
	}
	// A change of any key's policies wakes every wait: after one, the wait
	// looks (PeekN) before it decides again, so that a change that does
	// not admit the request counts nothing against the key (a denial
	// towards Config.Ban, CountDenied's charge).
	peek := false
	for {
		changed := l.pol.changes() // before the decision, so that no change is missed
		var res Result
		var err error
		if peek {
			if res, err = l.peek(ctx, key, n, "WaitN"); err == nil && res.Allowed {
				peek = false
				continue // decide
			}
		} else {
			res, err = l.allowRouted(ctx, key, n, "WaitN")
			if err == nil && res.Allowed && res.Delay > 0 {
				if dl, ok := ctx.Deadline(); ok && time.Until(dl) < res.Delay {
					return res, fmt.Errorf("hybridlimit: a request of cost %d was admitted with a delay of %v, past the context deadline: %w", n, res.Delay, context.DeadlineExceeded)
				}
				return res, l.sleep(ctx, res.Delay)
			}
		}
		if err != nil || res.Allowed {
			return res, err
		}
		wait := max(res.RetryAfter, time.Microsecond)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait { // deadlines are wall-clock time
			return res, fmt.Errorf("hybridlimit: a request of cost %d would wait %v, past the context deadline: %w", n, wait, context.DeadlineExceeded)
		}
		t := l.cfg.Clock.Timer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return res, ctx.Err()
		case <-l.stop:
			t.Stop()
			return res, ErrClosed
		case <-changed:
			t.Stop()
			peek = true
		case <-t.C:
			peek = false
		}
	}
}

// sleep waits d on the configured Clock, or until ctx is done or the
// limiter closed.
func (l *Limiter) sleep(ctx context.Context, d time.Duration) error {
	t := l.cfg.Clock.Timer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-l.stop:
		return ErrClosed
	case <-t.C:
		return nil
	}
}

// RuleState is one rule's state for one key.
type RuleState struct {
	// Rule is the index in the rules of the key's tier (Config.Rules for
	// the default tier); Limit and Window are that rule's.
	Rule   int
	Limit  int64
	Window time.Duration
	// Remaining is the cost the rule still admits now: in ModeAsync under
	// the share policy, at most what this node's share of the rule still
	// admits.
	Remaining int64
	// ResetAfter is how long until the counts this node sees for the rule
	// have left its window, if nothing is admitted meanwhile: the rule is
	// then back to its full limit (under the share policy, to this node's
	// share of it, until a sync hands the key back to the plain rule).
	ResetAfter time.Duration
}

// State appends the state of every rule for key, as this node sees it now,
// to dst and returns the extended slice. It consumes nothing and does no
// I/O in any mode: in ModeSynchronous it reports the counts seen by this
// node's last decision on key. In ModeAsync under the share policy (the
// default AsyncPolicy) each rule's Remaining is what AllowN would admit by
// that rule now, the node's share included: the least Remaining of the
// rules is the largest cost PeekN admits, and right after a decision,
// with no other decision on key in between, its rule's state has the
// decision's Remaining (but at instants where a sliding estimate lies
// within rounding of its 1e-9 slack, where the decision's can be one off:
// see docs/design.md). Use it to fill per-rule response headers after a
// decision. It allocates when dst lacks room, and once per Bucketed rule
// (a copy of its buckets' counts); otherwise nothing.
func (l *Limiter) State(ctx context.Context, key string, dst []RuleState) ([]RuleState, error) {
	t, _, err := l.route(key, 1, "State")
	if err != nil {
		return dst, err
	}
	return l.state(t, key, dst), nil
}

// TierState is State for the rules of the named tier ("" for
// Config.Rules), whatever tier key is in now, the share policy included.
// With Result.Tier it describes the rules a decision was made by, also
// when SetOverride, RemoveOverride or Config.TierOf moved the key to
// another tier since: the per-rule response headers of a decision then
// match its Result. A name
// that is not a tier gives an error wrapping ErrUnknownTier.
func (l *Limiter) TierState(ctx context.Context, key, tier string, dst []RuleState) ([]RuleState, error) {
	if l.closed.Load() || uint(len(key)-1) >= uint(l.cfg.MaxKeyLen) {
		return dst, l.keyError(key)
	}
	t := l.byName[tier]
	if t == nil {
		return dst, &inputError{fmt.Sprintf("hybridlimit: TierState: tier %q is not in Config.Tiers; want one of %q", tier, l.Tiers()), ErrUnknownTier}
	}
	return l.state(t, key, dst), nil
}

// state appends the state of every rule of t for key to dst.
func (l *Limiter) state(t *tier, key string, dst []RuleState) []RuleState {
	var lv [MaxRules]local.Level
	t.table.Levels(key, l.clock.now(), lv[:len(t.rules)])
	for i := range t.rules {
		r := &t.cfg[i]
		dst = append(dst, RuleState{Rule: i, Limit: r.Limit, Window: r.Window, Remaining: lv[i].Remaining, ResetAfter: time.Duration(lv[i].ResetAfter)})
	}
	return dst
}

// inputError is an error about the caller's input, wrapping a sentinel.
type inputError struct {
	msg  string
	kind error
}

func (e *inputError) Error() string { return e.msg }
func (e *inputError) Unwrap() error { return e.kind }

// untracked decides a request of cost n for a new key while the table is
// full: FailOpen admits it (the cost fits every limit: check made sure),
// FailClosed denies it.
func (l *Limiter) untracked(t *tier, n int64) Result {
	l.overflow.Add(1)
	res := l.untrackedResult(t)
	if !res.Allowed {
		l.untrackedDenied.Add(1)
		return res
	}
	l.untrackedAllowed.Add(1)
	res.Remaining -= n
	return res
}

// failingClosed reports whether a decision on key is FailClosed's while
// the store fails for it.
func (l *Limiter) failingClosed(key string) bool {
	return l.cfg.FailurePolicy == FailClosed && l.loop != nil && l.loop.Failing() && l.loop.KeyFailing(key)
}

// untrackedResult is the answer for a new key of t while the table is
// full, before its cost is counted: admitted under FailOpen, denied under
// FailClosed (nothing remaining, as failClosed), degraded either way.
func (l *Limiter) untrackedResult(t *tier) Result {
	res := t.fresh()
	res.Degraded = true
	if l.cfg.FailurePolicy == FailClosed {
		res.Allowed, res.Remaining, res.RetryAfter = false, 0, time.Second
	}
	return res
}

// failClosed denies a request while the store fails, under FailClosed;
// count counts the denial in Stats (a decision does, a Peek does not).
func (l *Limiter) failClosed(t *tier, count bool) Result {
	if count {
		l.degraded.Add(1)
		l.untrackedDenied.Add(1)
	}
	res := t.fresh()
	res.Allowed, res.Degraded, res.Remaining = false, true, 0
	res.RetryAfter = l.loop.Backoff()
	return res
}
