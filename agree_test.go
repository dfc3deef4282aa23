package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// The modes against one another and against a reference model.
//
// The same random requests (three keys; costs from 0 to one above what
// the rules admit at once; peeks; instants on window and bucket
// boundaries, a nanosecond and a microsecond either side; retries at
// RetryAfter and just before it) go to a ModeLocal limiter, a
// ModeSynchronous one on the memory store and, when a Redis server is
// given, one on the Redis store, all on one mock clock. Every answer is
// checked against refModel, written here from docs/algorithms.md and
// independent of package local: admission and Remaining from each
// algorithm's definition, RetryAfter and ResetAfter as the first instant,
// found by bisection, at which the request fits or the rule is empty.
//
// For rules of windows only (Sliding, Fixed, Bucketed), two ModeAsync
// limiters on the memory store, one per policy, synced every seventh
// request, must give ModeLocal's answers too: one node sees no one else's
// counts.
//
// ModeLocal decides at the clock's nanosecond. ModeSynchronous decides at
// the instant truncated to the microsecond (the store keeps instants in
// microseconds) and rounds RetryAfter up to a microsecond, so it is held
// to the reference at that instant and step; the two synchronous stores
// must answer exactly alike. In the runs whose instants are whole
// microseconds the three modes must also agree with one another, and
// State after a synchronous decision must report the reference's counts.

// agreeStart is a boundary of every window below, far enough in the
// future that the Redis store's deadlines and expiries, which follow the
// decisions' instants, are not yet past on the server's clock.
var agreeStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// refModel decides requests as docs/algorithms.md defines the algorithms.
// unit is its time step: 1 (ns) for ModeLocal; 1000 for ModeSynchronous,
// which decides at the microsecond and reports waits in whole
// microseconds.
type refModel struct {
	rules       []Rule
	t           []int64 // bucket rules: the interval, rounded up to a µs
	unit        int64
	countDenied bool
	keys        map[string]*refKey
}

type refKey struct {
	cnt []map[int64]int64 // window rules: count per counter window id
	tat []int64           // bucket rules: the arrival time (ns)
	log []int64           // every unit of cost logged, oldest first
}

func newRefModel(rules []Rule, unit int64, countDenied bool) *refModel {
	m := &refModel{rules: rules, unit: unit, countDenied: countDenied, keys: map[string]*refKey{}, t: make([]int64, len(rules))}
	for i, r := range rules {
		if r.Type == TokenBucket || r.Type == LeakyBucket {
			us := int64(r.Window / time.Microsecond)
			m.t[i] = (us + r.Limit - 1) / r.Limit * 1000
		}
	}
	return m
}

func (m *refModel) key(name string) *refKey {
	k := m.keys[name]
	if k == nil {
		k = &refKey{cnt: make([]map[int64]int64, len(m.rules)), tat: make([]int64, len(m.rules))}
		for i := range k.cnt {
			k.cnt[i] = map[int64]int64{}
		}
		m.keys[name] = k
	}
	return k
}

// counterWindow returns the window of rule r's counters (a Bucketed
// rule's bucket).
func counterWindow(r Rule) int64 {
	if r.Type == Bucketed {
		return int64(r.Window) / int64(r.Buckets)
	}
	return int64(r.Window)
}

// sliding returns a Sliding or Fixed rule's estimate at now.
func (m *refModel) sliding(k *refKey, i int, now int64) float64 {
	r := m.rules[i]
	w := int64(r.Window)
	id, e := now/w, now%w
	est := float64(k.cnt[i][id])
	if r.Type == Sliding {
		est += float64(k.cnt[i][id-1]) * float64(w-e) / float64(w)
	}
	return est
}

// counted returns a Bucketed rule's sum, or a Log rule's count, at now.
func (m *refModel) counted(k *refKey, i int, now int64) int64 {
	r := m.rules[i]
	if r.Type == Log {
		n := int64(0)
		for _, x := range k.log {
			if x > now-int64(r.Window) {
				n++
			}
		}
		return n
	}
	bw := counterWindow(r)
	id, sum := now/bw, int64(0)
	for b := id - int64(r.Buckets) + 1; b <= id; b++ {
		sum += k.cnt[i][b]
	}
	return sum
}

// ahead returns a bucket rule's arrival time minus now, at least 0.
func (m *refModel) ahead(k *refKey, i int, now int64) int64 { return max(k.tat[i]-now, 0) }

func (m *refModel) fits(k *refKey, i int, n, now int64) bool {
	r := m.rules[i]
	switch r.Type {
	case Sliding, Fixed:
		return m.sliding(k, i, now)+float64(n) <= float64(r.Limit)+1e-9
	case Bucketed, Log:
		return m.counted(k, i, now)+n <= r.Limit
	}
	return m.ahead(k, i, now)+n*m.t[i] <= r.burst()*m.t[i]
}

func (m *refModel) remaining(k *refKey, i int, now int64) int64 {
	r := m.rules[i]
	switch r.Type {
	case Sliding, Fixed:
		left := float64(r.Limit) - m.sliding(k, i, now) + 1e-9
		if left < 0 {
			return 0
		}
		return int64(left)
	case Bucketed, Log:
		return max(r.Limit-m.counted(k, i, now), 0)
	}
	return max(r.burst()*m.t[i]-m.ahead(k, i, now), 0) / m.t[i]
}

func (m *refModel) empty(k *refKey, i int, now int64) bool {
	switch m.rules[i].Type {
	case Sliding, Fixed:
		return m.sliding(k, i, now) == 0
	case Bucketed, Log:
		return m.counted(k, i, now) == 0
	}
	return m.ahead(k, i, now) == 0
}

// first returns the least d ≥ 0, a multiple of m.unit, such that ok(now+d),
// for an ok that stays true once true.
func (m *refModel) first(now int64, ok func(int64) bool) int64 {
	if ok(now) {
		return 0
	}
	lo, hi := int64(0), m.unit
	for !ok(now + hi) {
		lo, hi = hi, 2*hi
	}
	for hi-lo > m.unit {
		mid := lo + (hi-lo)/2/m.unit*m.unit
		if ok(now + mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// slidingRetry returns, for a Sliding rule that does not admit a request
// of cost n at now, the instant docs/algorithms.md names, by exact
// fractions: when the previous window's weight has fallen to what is left
// of the limit, or, when this window alone is too full, when its weight
// in the next window has; rounded up to a multiple of m.unit. The
// comparison's slack (a billionth of a request) may admit the request a
// few nanoseconds earlier: the limiter still reports this instant. 0 for
// the other rules.
func (m *refModel) slidingRetry(k *refKey, i int, n, now int64) int64 {
	r := m.rules[i]
	if r.Type != Sliding || m.fits(k, i, n, now) {
		return 0
	}
	w := int64(r.Window)
	id, e := now/w, now%w
	prev, cur := k.cnt[i][id-1], k.cnt[i][id]
	ceilDiv := func(a, b int64) int64 { return (a + b - 1) / b }
	if room := r.Limit - cur - n; room >= 0 {
		// prev·(W − x)/W ≤ room: x ≥ W − room·W/prev, d = x − e.
		return ceilDiv(prev*(w-e)-room*w, prev*m.unit) * m.unit
	}
	// cur·(W − x)/W ≤ limit − n in the next window: d = W − e + x.
	return ceilDiv(cur*(w-e)+max(cur*w-(r.Limit-n)*w, 0), cur*m.unit) * m.unit
}

// decide decides a request of cost n (valid) for key at now, counting it
// unless peek, and returns the Result the limiter must return.
func (m *refModel) decide(key string, n, now int64, peek bool) Result {
	now = now / m.unit * m.unit
	k := m.key(key)
	allowed, delay := true, int64(0)
	for i, r := range m.rules {
		allowed = allowed && m.fits(k, i, n, now)
		if r.Type == LeakyBucket {
			delay = max(delay, m.ahead(k, i, now))
		}
	}
	if !peek && (allowed || m.countDenied) {
		logged := false
		for i, r := range m.rules {
			switch r.Type {
			case Log:
				if !logged {
					for range n {
						k.log = append(k.log, now)
					}
					logged = true
				}
			case TokenBucket, LeakyBucket:
				k.tat[i] = max(k.tat[i], now) + n*m.t[i]
			default:
				k.cnt[i][now/counterWindow(r)] += n
			}
		}
	}
	res := Result{Allowed: allowed, Rule: -1}
	best := int64(-1)
	for i := range m.rules {
		rem := m.remaining(k, i, now)
		var retry int64
		if !allowed {
			retry = m.first(now, func(t int64) bool { return m.fits(k, i, n, t) })
			retry = max(retry, m.slidingRetry(k, i, n, now))
		}
		if allowed && (res.Rule < 0 || rem < res.Remaining) || !allowed && retry > best {
			best = retry
			res.Rule, res.Remaining, res.RetryAfter = i, rem, time.Duration(retry)
			res.ResetAfter = time.Duration(m.first(now, func(t int64) bool { return m.empty(k, i, t) }))
		}
	}
	r := m.rules[res.Rule]
	res.Limit, res.Window = r.Limit, r.Window
	if allowed {
		res.Delay = time.Duration(delay)
	}
	return res
}

// state returns what State must report for key at now.
func (m *refModel) state(key string, now int64) []RuleState {
	k := m.key(key)
	var out []RuleState
	for i, r := range m.rules {
		out = append(out, RuleState{Rule: i, Limit: r.Limit, Window: r.Window, Remaining: m.remaining(k, i, now),
			ResetAfter: time.Duration(m.first(now, func(t int64) bool { return m.empty(k, i, t) }))})
	}
	return out
}

// agreeReq is one request of the sequence.
type agreeReq struct {
	at   int64
	key  string
	n    int64
	peek bool
	// probe: the request is a retry at (want true) or just before (want
	// false) the instant RetryAfter named; checked in the modes that named
	// it.
	probe, want bool
	local, sync bool // the modes whose RetryAfter named the instant
}

// TestAlgorithmsAgreeAcrossModes runs every algorithm, alone and mixed,
// with and without CountDenied, on whole microseconds and on nanoseconds,
// through every mode of one node and the reference model (see above).
func TestAlgorithmsAgreeAcrossModes(t *testing.T) {
	ms := time.Millisecond
	sets := []struct {
		name  string
		rules []Rule
	}{
		{"sliding", []Rule{{Limit: 5, Window: 100 * ms}}},
		{"sliding-10s", []Rule{{Limit: 7, Window: 10 * time.Second}}},
		{"fixed", []Rule{{Limit: 4, Window: 50 * ms, Type: Fixed}}},
		{"bucketed", []Rule{{Limit: 6, Window: 120 * ms, Type: Bucketed, Buckets: 4}}},
		{"log", []Rule{{Limit: 5, Window: 100 * ms, Type: Log}}},
		{"token", []Rule{{Limit: 10, Window: 100 * ms, Type: TokenBucket, Burst: 4}}},
		{"token-334us", []Rule{{Limit: 3, Window: ms, Type: TokenBucket}}},
		{"leaky", []Rule{{Limit: 5, Window: 100 * ms, Type: LeakyBucket, Burst: 3}}},
		{"mixed", []Rule{
			{Limit: 3, Window: 50 * ms},
			{Limit: 7, Window: 200 * ms, Type: Fixed},
			{Limit: 5, Window: 150 * ms, Type: Log},
			{Limit: 5, Window: 100 * ms, Type: TokenBucket, Burst: 4},
		}},
		{"odd", []Rule{
			{Limit: 4, Window: 7 * ms},
			{Limit: 3, Window: 11 * ms, Type: Fixed},
			{Limit: 2, Window: 3 * ms, Type: TokenBucket, Burst: 5},
			{Limit: 7, Window: 13 * ms, Type: LeakyBucket, Burst: 9},
		}},
		{"large", []Rule{
			{Limit: 1000, Window: time.Hour},
			{Limit: 300, Window: time.Minute, Type: Log},
			{Limit: 50, Window: time.Second, Type: TokenBucket, Burst: 400},
			{Limit: 700, Window: 10 * time.Minute, Type: Bucketed, Buckets: 10},
		}},
		{"mixed2", []Rule{
			{Limit: 8, Window: 300 * ms, Type: Bucketed, Buckets: 3},
			{Limit: 4, Window: 100 * ms, Type: LeakyBucket, Burst: 3},
			{Limit: 6, Window: time.Second},
			{Limit: 3, Window: 40 * ms, Type: Log},
			{Limit: 9, Window: 400 * ms, Type: Log},
		}},
	}
	var rs store.Store
	if os.Getenv(redistest.EnvAddr) != "" || os.Getenv("CI") == "true" {
		rs = storetest.Redis(t, redistest.PatientClient(t)) // fails under CI=true without a server
	} else {
		t.Logf("%s is not set: the Redis store is left out", redistest.EnvAddr)
	}
	for si, set := range sets {
		for _, countDenied := range []bool{false, true} {
			for _, jitter := range []bool{false, true} {
				name := fmt.Sprintf("%s/countDenied=%v/ns=%v", set.name, countDenied, jitter)
				t.Run(name, func(t *testing.T) {
					t.Parallel() // each sequence has its own clock, limiters and prefix
					seed := uint64(si)*4 + uint64(len(name))
					runAgree(t, set.rules, countDenied, jitter, rs, seed)
				})
			}
		}
	}
}

// runAgree runs one sequence; jitter puts instants on nanoseconds (else
// on whole microseconds).
func runAgree(t *testing.T, rules []Rule, countDenied, jitter bool, rs store.Store, seed uint64) {
	ctx := context.Background()
	mock := &stepClock{Mock: clock.NewMock()}
	mock.now.Store(agreeStart)
	type mode struct {
		name string
		l    *Limiter
		ref  *refModel
		sync bool
	}
	newMode := func(name string, cfg Config) mode {
		cfg.Rules, cfg.Clock, cfg.Manual, cfg.CountDenied = rules, mock, true, countDenied
		cfg.MaxKeys = 64 // a small table: Evict scans it
		// Agreement, not latency: no store call may time out (and its
		// decision be Degraded, or Sync fail) on a loaded machine.
		cfg.StoreTimeout = time.Minute
		l, err := New(cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(ctx) })
		unit := int64(1)
		if cfg.Mode == ModeSynchronous {
			unit = 1000
		}
		return mode{name, l, newRefModel(rules, unit, countDenied), cfg.Mode == ModeSynchronous}
	}
	modes := []mode{
		newMode("local", Config{}),
		newMode("sync-memory", Config{Mode: ModeSynchronous, Store: store.NewMemory(mock), ClockSync: -1}),
	}
	windowsOnly := true
	for _, r := range rules {
		windowsOnly = windowsOnly && r.Type <= Bucketed
	}
	if windowsOnly {
		// One node in ModeAsync decides window rules as ModeLocal does,
		// whenever it syncs, under either policy. (Its Log rules count as
		// Bucketed and its bucket rules decide on the arrival time last
		// read plus the cost admitted since: docs/algorithms.md.)
		for _, p := range []AsyncPolicy{Naive, Share} {
			modes = append(modes, newMode("async-"+p.String(), Config{Mode: ModeAsync, Store: store.NewMemory(mock), ClockSync: -1,
				SyncRate: time.Millisecond, AsyncPolicy: p}))
		}
	}
	if rs != nil {
		modes = append(modes, newMode("sync-redis", Config{Mode: ModeSynchronous, Store: rs, ClockSync: -1, Prefix: redistest.Prefix(t)}))
	}

	maxCost := int64(1 << 62)
	var windows []int64 // counter windows, for boundaries
	minW := int64(1 << 62)
	for _, r := range rules {
		maxCost = min(maxCost, r.maxCost())
		windows = append(windows, counterWindow(r))
		minW = min(minW, int64(r.Window))
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	keys := []string{"a", "b", "c"}
	now := agreeStart
	step := int64(1000) // the instants' grain
	if jitter {
		step = 1
	}
	var queue []agreeReq
	admitted := make([]int, len(modes))
	const requests = 400
	probes, evicted := 0, 0
	for i := 0; i < requests; i++ {
		var q agreeReq
		if len(queue) > 0 {
			q, queue = queue[0], queue[1:]
		} else {
			switch x := rng.IntN(10); {
			case x < 4:
				now += rng.Int64N(minW/3) / step * step
			case x < 7:
				w := windows[rng.IntN(len(windows))]
				b := (now/w + 1) * w
				offs := []int64{0, 0, step, -step, 1000, -1000}
				now = max(now, b+offs[rng.IntN(len(offs))])
			case x < 8:
				// the same instant
			default:
				now += rng.Int64N(2*int64(rules[rng.IntN(len(rules))].Window)) / step * step
			}
			q = agreeReq{at: now, key: keys[rng.IntN(len(keys))], peek: rng.IntN(10) == 0}
			switch x := rng.IntN(20); {
			case x == 0:
				q.n = 0
			case x == 1:
				q.n = maxCost + 1
			case x < 10:
				q.n = 1
			default:
				q.n = 1 + rng.Int64N(maxCost)
			}
		}
		now = max(now, q.at)
		mock.now.Store(now)
		if i%7 == 0 {
			for _, md := range modes {
				if md.l.cfg.Mode == ModeAsync {
					require.NoError(t, md.l.Sync(ctx))
				}
			}
		}
		if i%5 == 0 {
			// Eviction removes only keys whose counts no longer matter.
			for _, md := range modes {
				evicted += md.l.Evict()
			}
		}
		results := make([]Result, len(modes))
		for j, md := range modes {
			var res Result
			var err error
			if q.peek {
				res, err = md.l.PeekN(ctx, q.key, q.n)
			} else {
				res, err = md.l.AllowN(ctx, q.key, q.n)
			}
			where := fmt.Sprintf("request %d (%s, key %s, cost %d, peek %v, at +%dns, probe %v)", i, md.name, q.key, q.n, q.peek, now-agreeStart, q.probe)
			if q.n < 1 || q.n > maxCost {
				require.Error(t, err, where)
				require.True(t, errors.Is(err, ErrCost), "%s: %v", where, err)
				continue
			}
			require.NoError(t, err, where)
			require.False(t, res.Degraded, where)
			want := md.ref.decide(q.key, q.n, now, q.peek)
			require.Equal(t, want, res, "%s: the reference (want) and the limiter (got) disagree", where)
			if q.probe && (md.sync && q.sync || !md.sync && q.local) {
				probes++
				require.Equal(t, q.want, res.Allowed, "%s: a retry at (true) or just before (false) RetryAfter", where)
			}
			if res.Allowed && !q.peek {
				admitted[j]++
			}
			if md.sync && !jitter {
				// State reports the counts the store answered with.
				got, err := md.l.State(ctx, q.key, nil)
				require.NoError(t, err)
				require.Equal(t, md.ref.state(q.key, now), got, "%s: State after the decision", where)
			}
			results[j] = res
		}
		if q.n < 1 || q.n > maxCost {
			continue
		}
		loc, syn := results[0], results[1]
		for j := 2; j < len(modes); j++ {
			if modes[j].sync {
				require.Equal(t, syn, results[j], "request %d: %s and %s disagree", i, modes[1].name, modes[j].name)
			}
		}
		if !jitter {
			// On whole microseconds the modes decide alike; only
			// RetryAfter is rounded up to a microsecond.
			require.Equal(t, loc.Allowed, syn.Allowed, "request %d: local and synchronous disagree", i)
			require.Equal(t, roundUp(loc.RetryAfter, time.Microsecond), syn.RetryAfter, "request %d: retry after", i)
			if loc.Rule == syn.Rule {
				require.Equal(t, loc, Result{Allowed: syn.Allowed, Rule: syn.Rule, Limit: syn.Limit, Window: syn.Window, Remaining: syn.Remaining,
					RetryAfter: loc.RetryAfter, ResetAfter: syn.ResetAfter, Delay: syn.Delay}, "request %d", i)
			}
		}
		// Retry the denied request at the RetryAfter that a mode named,
		// and (when the retry does not count) just before it.
		if q.probe || q.peek || loc.Allowed && syn.Allowed || rng.IntN(3) != 0 {
			continue
		}
		p := agreeReq{key: q.key, n: q.n, probe: true}
		switch {
		case jitter && !loc.Allowed:
			p.local = true
			p.at = now + int64(loc.RetryAfter)
			if before := p.at - 1 - slack(rules[loc.Rule]); !countDenied && before > now {
				queue = append(queue, agreeReq{key: q.key, n: q.n, probe: true, local: true, at: before})
			}
		case !jitter && !syn.Allowed:
			p.local, p.sync = true, true
			p.at = now + int64(syn.RetryAfter)
			if before := p.at - 1000 - int64(roundUp(time.Duration(slack(rules[syn.Rule])), time.Microsecond)); !countDenied && syn.RetryAfter == loc.RetryAfter && before > now {
				queue = append(queue, agreeReq{key: q.key, n: q.n, probe: true, local: true, sync: true, at: before})
			}
		default:
			continue
		}
		p.want = true
		queue = append(queue, p)
	}
	if !jitter {
		for j := range modes {
			require.Equal(t, admitted[0], admitted[j], "admitted by %s and %s", modes[0].name, modes[j].name)
		}
	}
	// State on the local limiter against the reference, for every key.
	for _, k := range keys {
		got, err := modes[0].l.State(ctx, k, nil)
		require.NoError(t, err)
		require.Equal(t, modes[0].ref.state(k, now), got, "State of %s", k)
	}
	t.Logf("%d requests, admitted %v, %d retries checked, %d keys evicted", requests, admitted, probes, evicted)
}

// slack returns how much earlier than its RetryAfter a rule may admit a
// request: a Sliding rule's comparison admits a billionth of a request
// over the limit, which the count whose weight falls (at least 1) sheds
// in at most a billionth of the window.
func slack(r Rule) int64 {
	if r.Type != Sliding {
		return 0
	}
	return int64(r.Window)/1e9 + 1
}

func roundUp(d, unit time.Duration) time.Duration { return (d + unit - 1) / unit * unit }
