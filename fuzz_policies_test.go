package hybridlimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
)

// FuzzPolicies runs an arbitrary sequence of Block, Unblock, SetOverride,
// RemoveOverride, AllowN, Peek, State and clock steps on a ModeLocal
// limiter of tierCfg, on a mock clock, beside a model of the policies in
// force, and checks that nothing panics, that invalid arguments (a
// negative or too long duration, an unknown tier, a cost of 0) are errors
// that change nothing, and these invariants:
//   - a blocked key is never admitted before its block ends, and is
//     admitted again (not Blocked) from the millisecond after its end;
//     RetryAfter never points before that end;
//   - an override's tier decides the key until its ttl, then the key's
//     own tier does again;
//   - Remaining lies within [0, Limit] and Limit is the rule's.
//
// Each operation is 3 bytes: the operation, the key, an argument. Its
// seeds run with the normal tests; to fuzz:
//
//	go test -run '^$' -fuzz FuzzPolicies -fuzztime 60s .
func FuzzPolicies(f *testing.F) {
	f.Add([]byte{0, 0, 5, 4, 0, 1, 6, 0, 5, 4, 0, 1})          // block a for 1s, decide, 1s on, decide
	f.Add([]byte{2, 1, 6, 4, 1, 1, 6, 0, 7, 4, 1, 1})          // override paid-b, decide, an hour on, decide
	f.Add([]byte{6, 0, 1, 0, 2, 2, 5, 2, 1, 6, 0, 2, 5, 2, 1}) // a sub-ms block between milliseconds
	f.Add([]byte{0, 0, 9, 2, 0, 3, 4, 0, 0, 1, 0, 0, 4, 0, 1}) // invalid d, tier and cost; unblock
	f.Add([]byte{2, 2, 26, 7, 2, 0, 3, 2, 0, 4, 2, 3, 6, 2, 5, 4, 2, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 3*200 {
			ops = ops[:3*200]
		}
		mock := &stepClock{Mock: clock.NewMock()}
		mock.Set(at(10, 0, 0))
		cfg := tierCfg
		cfg.Clock, cfg.Manual = mock, true
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close(context.Background())
		ctx := context.Background()

		keys := []string{"a", "paid-b", "c"}
		tiers := []string{"", "paid", "abusive", "gold"}
		durs := []time.Duration{0, 1, 999 * time.Microsecond, time.Millisecond, 1500 * time.Microsecond,
			time.Second, time.Minute, MaxWindow, -1, MaxWindow + 1}
		steps := []time.Duration{1, 37 * time.Microsecond, 999 * time.Microsecond, time.Millisecond,
			time.Second - 1, time.Second, time.Minute, time.Hour}
		type policy struct {
			set   bool
			start int64 // ns
			d     time.Duration
			tier  string
		}
		// ends returns whether p holds for sure at now, and whether it may
		// (the store keeps its end rounded up to the millisecond).
		holds := func(p policy, now int64) (sure, may bool) {
			if !p.set {
				return false, false
			}
			if p.d == 0 {
				return true, true
			}
			end := p.start + int64(p.d)
			return now < end, now < ceilMs(end)*int64(time.Millisecond)
		}
		blocks := map[string]policy{}
		overs := map[string]policy{}
		for i := 0; i+2 < len(ops); i += 3 {
			op, key, arg := ops[i]%8, keys[int(ops[i+1])%len(keys)], int(ops[i+2])
			now := mock.Now().UnixNano()
			switch op {
			case 0:
				d := durs[arg%len(durs)]
				err := l.Block(ctx, key, d, "fuzz")
				if valid := d >= 0 && d <= MaxWindow; valid != (err == nil) {
					t.Fatalf("op %d: Block(%q, %v): %v", i/3, key, d, err)
				}
				if err == nil {
					blocks[key] = policy{set: true, start: now, d: d}
				}
			case 1:
				had, err := l.Unblock(ctx, key)
				if err != nil {
					t.Fatalf("op %d: Unblock(%q): %v", i/3, key, err)
				}
				if _, may := holds(blocks[key], now); may && !had {
					t.Fatalf("op %d: Unblock(%q) found no block", i/3, key)
				}
				delete(blocks, key)
			case 2:
				tier, d := tiers[arg%len(tiers)], durs[(arg/len(tiers))%len(durs)]
				err := l.SetOverride(ctx, key, tier, d)
				valid := d >= 0 && d <= MaxWindow && tier != "gold"
				if valid != (err == nil) {
					t.Fatalf("op %d: SetOverride(%q, %q, %v): %v", i/3, key, tier, d, err)
				}
				if tier == "gold" && !errors.Is(err, ErrUnknownTier) {
					t.Fatalf("op %d: SetOverride(%q, %q): %v, want ErrUnknownTier", i/3, key, tier, err)
				}
				if err == nil {
					overs[key] = policy{set: true, start: now, d: d, tier: tier}
				}
			case 3:
				if _, err := l.RemoveOverride(ctx, key); err != nil {
					t.Fatalf("op %d: RemoveOverride(%q): %v", i/3, key, err)
				}
				delete(overs, key)
			case 4, 5:
				n := int64(arg % 4)
				var res Result
				var err error
				if op == 4 {
					res, err = l.AllowN(ctx, key, n)
				} else {
					res, err = l.PeekN(ctx, key, n)
				}
				if n == 0 {
					if !errors.Is(err, ErrCost) {
						t.Fatalf("op %d: n=0: %v, want ErrCost", i/3, err)
					}
					continue
				}
				// The key's tier: its override's while it holds, else
				// TierOf's.
				want := tierCfg.TierOf(key)
				sure, may := holds(overs[key], now)
				if sure {
					want = overs[key].tier
				}
				rules, _ := l.TierRules(want)
				if n > rules[0].Limit || len(rules) > 1 && n > rules[1].Limit {
					if err == nil && (sure || !may) {
						t.Fatalf("op %d: cost %d above tier %q's limits admitted", i/3, n, want)
					}
					continue
				}
				if err != nil {
					if may && !sure {
						continue // the override's tier, by the store's rounding, may refuse n
					}
					t.Fatalf("op %d: decide(%q, %d): %v", i/3, key, n, err)
				}
				if (sure || !may) && res.Tier != want {
					t.Fatalf("op %d: %q decided by tier %q, want %q (override %+v, now %d)", i/3, key, res.Tier, want, overs[key], now)
				}
				bsure, bmay := holds(blocks[key], now)
				switch {
				case bsure && (res.Allowed || !res.Blocked):
					t.Fatalf("op %d: %q blocked until %v after %d admitted or not Blocked: %+v", i/3, key, blocks[key].d, blocks[key].start, res)
				case !bmay && res.Blocked:
					t.Fatalf("op %d: %q Blocked after its block ended: %+v (block %+v, now %d)", i/3, key, res, blocks[key], now)
				case res.Blocked && res.Allowed:
					t.Fatalf("op %d: Blocked and Allowed: %+v", i/3, res)
				case res.Blocked && blocks[key].d != 0 && now+int64(res.RetryAfter) < blocks[key].start+int64(blocks[key].d):
					t.Fatalf("op %d: RetryAfter %v points before the block's end", i/3, res.RetryAfter)
				}
				tr, _ := l.TierRules(res.Tier)
				if res.Rule < 0 || res.Rule >= len(tr) || res.Limit != tr[res.Rule].Limit || res.Remaining < 0 || res.Remaining > res.Limit {
					t.Fatalf("op %d: result out of range for tier %q: %+v", i/3, res.Tier, res)
				}
			case 6:
				mock.Add(steps[arg%len(steps)])
			case 7:
				states, err := l.State(ctx, key, nil)
				if err != nil {
					t.Fatalf("op %d: State(%q): %v", i/3, key, err)
				}
				for _, s := range states {
					if s.Remaining < 0 || s.Remaining > s.Limit || s.ResetAfter < 0 {
						t.Fatalf("op %d: state out of range: %+v", i/3, s)
					}
				}
			}
		}
	})
}
