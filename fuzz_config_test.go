package hybridlimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/hybridlimit/hybridlimit/store"
)

// FuzzConfig builds a Config from arbitrary fields (two rules, the mode,
// policies, bounds, a ban policy) and checks that New never panics and
// either returns an error naming a Config field or a limiter whose
// decisions (AllowN, Peek, PeekN, WaitN) and State, with an arbitrary key,
// cost and passage of time,
// never panic and keep their figures in range. Its seeds run with the normal tests; to
// fuzz:
//
//	go test -run '^$' -fuzz FuzzConfig -fuzztime 60s .
func FuzzConfig(f *testing.F) {
	type seed struct {
		limit1, window1         int64
		type1                   uint8
		buckets1                int
		burst1                  int64
		limit2, window2         int64
		type2                   uint8
		buckets2                int
		burst2                  int64
		mode, asyncPol, failPol uint8
		countDenied             bool
		maxKeys, maxKeyLen      int
		prefix                  string
		syncRate, storeTimeout  int64
		clockRes, clockSync     int64
		denials                 int
		within, forget          int64
		key                     string
		cost, step              int64
	}
	ms := int64(time.Millisecond)
	for _, s := range []seed{
		{limit1: 10, window1: 1000 * ms, mode: 0, key: "k", cost: 1, step: 100 * ms},
		{limit1: 5, window1: 60000 * ms, type1: uint8(Bucketed), buckets1: 6, limit2: 100, window2: 3600000 * ms, mode: 1, key: "a", cost: 2, step: 10000 * ms},
		{limit1: 1, window1: int64(MaxWindow), type1: uint8(TokenBucket), countDenied: true, mode: 2, key: "b", cost: 1, step: 1},
		{limit1: 3, window1: 1000 * ms, type1: uint8(Log), limit2: 2, window2: 1000 * ms, type2: uint8(LeakyBucket), burst2: 4, mode: 2, key: "c", cost: 1, step: 500 * ms},
		{limit1: MaxLimit, window1: 1, mode: 0, key: "d", cost: MaxLimit, step: -1},
		{limit1: 10, window1: 1000 * ms, mode: 1, syncRate: 50 * ms, asyncPol: 1, failPol: 1, maxKeys: 1, maxKeyLen: 3, prefix: "p", key: "long key", cost: 1, step: 1},
		{limit1: 10, window1: 1000 * ms, mode: 0, denials: 2, within: 1000 * ms, forget: 60000 * ms, key: "e", cost: 20, step: 2000 * ms},
		{limit1: -1, window1: 1500000, type1: 200, buckets1: -3, burst1: -5, mode: 9, asyncPol: 7, failPol: 7, maxKeys: -1, maxKeyLen: -1, prefix: "{x}", syncRate: -1, storeTimeout: -1, clockRes: 1 << 62, clockSync: 1, denials: -1, key: "", cost: -1},
	} {
		f.Add(s.limit1, s.window1, s.type1, s.buckets1, s.burst1, s.limit2, s.window2, s.type2, s.buckets2, s.burst2,
			s.mode, s.asyncPol, s.failPol, s.countDenied, s.maxKeys, s.maxKeyLen, s.prefix, s.syncRate, s.storeTimeout,
			s.clockRes, s.clockSync, s.denials, s.within, s.forget, s.key, s.cost, s.step)
	}
	f.Fuzz(func(t *testing.T, limit1, window1 int64, type1 uint8, buckets1 int, burst1 int64,
		limit2, window2 int64, type2 uint8, buckets2 int, burst2 int64,
		mode, asyncPol, failPol uint8, countDenied bool, maxKeys, maxKeyLen int, prefix string,
		syncRate, storeTimeout, clockRes, clockSync int64, denials int, within, forget int64,
		key string, cost, step int64) {
		mock := clock.NewMock()
		mock.Set(t0)
		rules := []Rule{{Limit: limit1, Window: time.Duration(window1), Type: Algorithm(type1), Buckets: buckets1, Burst: burst1}}
		if limit2 != 0 || window2 != 0 {
			rules = append(rules, Rule{Limit: limit2, Window: time.Duration(window2), Type: Algorithm(type2), Buckets: buckets2, Burst: burst2})
		}
		cfg := Config{
			Rules:           rules,
			Mode:            Mode(mode),
			SyncRate:        time.Duration(syncRate),
			AsyncPolicy:     AsyncPolicy(asyncPol),
			FailurePolicy:   FailurePolicy(failPol),
			CountDenied:     countDenied,
			MaxKeys:         maxKeys,
			MaxKeyLen:       maxKeyLen,
			Prefix:          prefix,
			StoreTimeout:    time.Duration(storeTimeout),
			ClockResolution: time.Duration(clockRes),
			ClockSync:       time.Duration(clockSync),
			Ban:             BanPolicy{Denials: denials, Within: time.Duration(within), Forget: time.Duration(forget)},
			Clock:           mock,
			Manual:          true,
		}
		if cfg.Mode == ModeAsync || cfg.Mode == ModeSynchronous {
			cfg.Store = store.NewMemory(mock)
		}
		l, err := New(cfg)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "hybridlimit: ") || !strings.Contains(msg, "Config.") {
				t.Fatalf("New's error does not name a Config field: %q", msg)
			}
			return
		}
		ctx := context.Background()
		defer func() {
			if err := l.Close(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
		var most int64 // the largest Limit or Burst: what Remaining never exceeds
		for _, r := range cfg.Rules {
			most = max(most, r.Limit, r.Burst)
		}
		check := func(what string, res Result, err error) {
			t.Helper()
			if err != nil {
				if !errors.Is(err, ErrEmptyKey) && !errors.Is(err, ErrKeyTooLong) && !errors.Is(err, ErrCost) {
					t.Fatalf("%s: unexpected error %v", what, err)
				}
				return
			}
			if res.Remaining < 0 || res.Remaining > most {
				t.Fatalf("%s: Remaining %d outside 0 to %d: %+v", what, res.Remaining, most, res)
			}
			if res.RetryAfter < 0 || res.ResetAfter < 0 || res.Delay < 0 {
				t.Fatalf("%s: a negative duration: %+v", what, res)
			}
			if res.Allowed && res.Blocked {
				t.Fatalf("%s: allowed and blocked: %+v", what, res)
			}
		}
		for i := range 3 {
			res, err := l.AllowN(ctx, key, cost)
			check("AllowN", res, err)
			res, err = l.Peek(ctx, key)
			check("Peek", res, err)
			res, err = l.PeekN(ctx, key, cost)
			check("PeekN", res, err)
			// WaitN with a deadline a millisecond away: the mock clock
			// does not move while it waits, so it returns by then at the
			// latest, admitted, or with an error saying why not.
			wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
			res, err = l.WaitN(wctx, key, cost)
			cancel()
			if err != nil && (errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "past the context deadline")) {
				err = nil
			}
			check("WaitN", res, err)
			states, err := l.State(ctx, key, nil)
			if err != nil && !errors.Is(err, ErrEmptyKey) && !errors.Is(err, ErrKeyTooLong) {
				t.Fatalf("State: %v", err)
			}
			for _, st := range states {
				if st.Remaining < 0 || st.Remaining > most || st.ResetAfter < 0 {
					t.Fatalf("State: rule %d out of range: %+v", st.Rule, st)
				}
			}
			if cfg.Mode == ModeAsync {
				if err := l.Sync(ctx); err != nil {
					t.Fatalf("Sync: %v", err)
				}
			}
			// Time moves by step (bounded to a year either way: the mock
			// clock only goes forwards, and a step back is skipped).
			if d := time.Duration(step % int64(MaxWindow)); d > 0 {
				mock.Add(d >> i)
			}
		}
	})
}
