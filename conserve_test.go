package hybridlimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/local"
	"github.com/hybridlimit/hybridlimit/store"
)

// Conservation in ModeAsync: several nodes share one store, and whatever
// happens to the sync loop's calls (failed, lost before or after the store
// ran them, some batches of a call applied and others not), whatever the
// nodes do while a call is on its way (decide, roll windows over, evict),
// and after Close, the store holds for every counter exactly what the
// nodes charged to it: nothing lost, nothing counted twice.

// ctrID names a store counter for the tallies: a window's count, or (Rate
// set) an arrival time, whose pushes add up to the cost admitted.
type ctrID struct {
	key        string
	window, id int64
	span       int64 // a Bucketed counter's buckets, 0 otherwise
	rate       int64
	burst      int64
}

func idOf(c store.Counter) ctrID {
	if c.Rate > 0 {
		return ctrID{key: c.Key, rate: 1, burst: c.Burst} // one bucket rule per set
	}
	id := ctrID{key: c.Key, window: c.Window, id: c.ID}
	if c.Span > 1 {
		id.span = c.Span
	}
	return id
}

// chaos is a store that wraps a memory store and, drawing from its own
// seeded source, fails calls, loses their replies before or after the
// store ran them, or applies only some of their batches; during runs
// while a call is on its way. applied tallies the deltas the store applied,
// each batch once (the markers' rule).
type chaos struct {
	mem     *store.Memory
	rng     *rand.Rand
	p       float64 // the probability that a call goes wrong
	during  func()  // run while a call is on its way, not nested
	inside  bool
	mu      sync.Mutex
	applied map[ctrID]int64
	marker  map[string]uint64
	calls   map[string]int // outcomes, for the log
	acked   []int64        // per node: the deltas of the batches answered Applied
}

// nodeStore is a node's door to the chaos store.
type nodeStore struct {
	*chaos
	node int
}

func (s nodeStore) Push(ctx context.Context, bs []*store.Batch) error {
	err := s.chaos.Push(ctx, bs)
	for _, b := range bs {
		if b.Status == store.Applied {
			for _, op := range b.Ops {
				s.acked[s.node] += op.Delta
			}
		}
	}
	return err
}

func (c *chaos) Group(key string) int                        { return c.mem.Group(key) }
func (c *chaos) Time(ctx context.Context) (time.Time, error) { return c.mem.Time(ctx) }
func (c *chaos) Take(ctx context.Context, r []*store.TakeRequest) error {
	return c.mem.Take(ctx, r)
}

var errChaos = errors.New("chaos")

// apply pushes bs to the memory store, tallying what it applies.
func (c *chaos) apply(bs []*store.Batch) {
	c.mu.Lock()
	for _, b := range bs {
		m := fmt.Sprintf("%s/%s/%d", b.Prefix, b.Node, b.Group)
		if c.marker[m] >= b.Seq {
			continue
		}
		c.marker[m] = b.Seq
		for _, op := range b.Ops {
			c.applied[idOf(op.Counter)] += op.Delta
		}
	}
	c.mu.Unlock()
	if err := c.mem.Push(context.Background(), bs); err != nil {
		panic(err)
	}
}

func (c *chaos) hook() {
	if c.during != nil && !c.inside && c.rng.IntN(3) == 0 {
		c.inside = true
		c.during()
		c.inside = false
	}
}

func (c *chaos) Push(ctx context.Context, bs []*store.Batch) error {
	if c.rng.Float64() >= c.p {
		c.calls["ok"]++
		c.hook()
		c.apply(bs)
		return nil
	}
	switch c.rng.IntN(4) {
	case 0: // refused unsent
		c.calls["failed"]++
		c.hook()
		for _, b := range bs {
			b.Status, b.Err = store.Failed, errChaos
		}
	case 1: // lost on the way there
		c.calls["lost before"]++
		c.hook()
		for _, b := range bs {
			b.Status, b.Err = store.InDoubt, errChaos
		}
	case 2: // run, and the reply lost
		c.calls["lost after"]++
		c.apply(bs)
		c.hook()
		for _, b := range bs {
			b.Status, b.Err = store.InDoubt, errChaos
		}
	default: // each batch its own fate
		c.calls["partial"]++
		c.hook()
		for _, b := range bs {
			switch c.rng.IntN(4) {
			case 0:
				b.Status, b.Err = store.Failed, errChaos
			case 1:
				b.Status, b.Err = store.InDoubt, errChaos
			case 2:
				c.apply([]*store.Batch{b})
				b.Status, b.Err = store.InDoubt, errChaos
			default:
				c.apply([]*store.Batch{b})
			}
		}
	}
	return errChaos
}

// conserveNode is one node of the cluster and its clock's skew.
type conserveNode struct {
	l      *Limiter
	skew   time.Duration
	offset time.Duration // as last measured
}

type conserveRun struct {
	t      *testing.T
	rng    *rand.Rand
	mock   *stepClock
	st     *chaos
	nodes  []*conserveNode
	rules  []Rule
	keys   []string
	denied bool // CountDenied
	// charged tallies what the nodes' decisions charged.
	charged map[ctrID]int64
	owed    []int64  // per node: the increments it charged
	allowed []uint64 // per node
	deniedN []uint64
}

// charge records a charge of n to every rule of key at the instant now on
// the cluster's clock.
func (r *conserveRun) charge(key string, n int64, now time.Time, syncRate time.Duration) {
	ms := now.UnixMilli()
	for _, rule := range r.rules {
		var id ctrID
		switch rule.Type {
		case TokenBucket, LeakyBucket:
			id = ctrID{key: key, rate: 1, burst: rule.burst()}
		case Bucketed, Log:
			b := rule.Buckets
			if rule.Type == Log {
				b = logBuckets(rule.Window, syncRate)
			}
			w := rule.Window.Milliseconds() / int64(b)
			id = ctrID{key: key, window: w, id: ms / w, span: int64(b)}
		default:
			w := rule.Window.Milliseconds()
			id = ctrID{key: key, window: w, id: ms / w}
		}
		r.charged[id] += n
	}
}

// checkPending checks that every node's Stats.Pending is what it charged
// less what the store acknowledged and what it dropped.
func (r *conserveRun) checkPending() {
	r.t.Helper()
	for i, nd := range r.nodes {
		s := nd.l.Stats()
		require.Equal(r.t, r.owed[i]-r.st.acked[i]-int64(s.Dropped), s.Pending, "node %d: Stats.Pending", i)
		require.Equal(r.t, r.allowed[i], s.Allowed, "node %d", i)
		require.Equal(r.t, r.deniedN[i], s.Denied, "node %d", i)
	}
}

// decide makes one decision on a random node and key.
func (r *conserveRun) decide(syncRate time.Duration) {
	i := r.rng.IntN(len(r.nodes))
	key := r.keys[r.rng.IntN(len(r.keys))]
	n := int64(1)
	if r.rng.IntN(4) == 0 {
		n = 1 + r.rng.Int64N(3)
	}
	r.decideOn(i, key, n, syncRate)
}

// decideOn makes a decision of cost n on key at node i.
func (r *conserveRun) decideOn(i int, key string, n int64, syncRate time.Duration) {
	nd := r.nodes[i]
	now := r.mock.Now().Add(nd.skew + nd.offset) // the node's cluster clock
	res, err := nd.l.AllowN(context.Background(), key, n)
	require.NoError(r.t, err)
	if res.Allowed {
		r.allowed[i]++
	} else {
		r.deniedN[i]++
	}
	if res.Allowed || (r.denied && !res.Degraded) {
		r.charge(key, n, now, syncRate)
		r.owed[i] += n * int64(len(r.rules))
	}
}

func TestAsyncConservesIncrements(t *testing.T) {
	sets := map[string][]Rule{
		"sliding":  {{Limit: 40, Window: time.Second}},
		"fixed":    {{Limit: 40, Window: time.Second, Type: Fixed}},
		"two":      {{Limit: 10, Window: 200 * time.Millisecond}, {Limit: 60, Window: 2 * time.Second}},
		"bucketed": {{Limit: 50, Window: time.Second, Type: Bucketed, Buckets: 5}},
		"log":      {{Limit: 30, Window: time.Second, Type: Log}},
		"gcra":     {{Limit: 30, Window: time.Second, Type: TokenBucket, Burst: 5}},
		"leaky":    {{Limit: 30, Window: time.Second, Type: LeakyBucket, Burst: 5}},
		"mixed": {
			{Limit: 8, Window: 200 * time.Millisecond, Type: Fixed},
			{Limit: 60, Window: time.Second, Type: Bucketed, Buckets: 4},
			{Limit: 50, Window: time.Second, Type: TokenBucket, Burst: 10},
			{Limit: 90, Window: 2 * time.Second},
		},
	}
	seed := uint64(0)
	for _, name := range []string{"sliding", "fixed", "two", "bucketed", "log", "gcra", "leaky", "mixed"} {
		for _, policy := range []AsyncPolicy{Share, Naive} {
			for _, denied := range []bool{false, true} {
				seed++
				if raceOn && (policy != Share || denied) {
					continue // the race detector makes every case ten times longer
				}
				t.Run(fmt.Sprintf("%s/%v/countDenied=%v/seed=%d", name, policy, denied, seed), func(t *testing.T) {
					conserve(t, sets[name], policy, denied, seed)
				})
			}
		}
	}
}

func conserve(t *testing.T, rules []Rule, policy AsyncPolicy, denied bool, seed uint64) {
	const syncRate = 100 * time.Millisecond
	rng := rand.New(rand.NewPCG(seed, 99))
	mock := &stepClock{Mock: clock.NewMock()}
	mock.Set(t0)
	st := &chaos{mem: store.NewMemory(mock), rng: rng, p: 0.3, applied: map[ctrID]int64{}, marker: map[string]uint64{}, calls: map[string]int{}}
	r := &conserveRun{t: t, rng: rng, mock: mock, st: st, rules: rules, denied: denied, charged: map[ctrID]int64{}}
	for k := range 6 {
		r.keys = append(r.keys, fmt.Sprintf("k%d", k))
	}
	// Four nodes, one of them 1.5 s ahead and one 0.7 s behind the store.
	skews := []time.Duration{0, 1500 * time.Millisecond, -700 * time.Millisecond, 3 * time.Millisecond}
	ctx := context.Background()
	for i, skew := range skews {
		l, err := New(Config{
			Rules: rules, Mode: ModeAsync, Store: nodeStore{st, i}, SyncRate: syncRate, AsyncPolicy: policy,
			CountDenied: denied, Clock: &skewedStep{mock, skew}, Manual: true, Seed: seed*10 + uint64(i),
			ClockSync: time.Hour, StoreTimeout: time.Second,
		})
		require.NoError(t, err)
		require.NoError(t, l.SyncClock(ctx))
		nd := &conserveNode{l: l, skew: skew, offset: l.Stats().ClockOffset}
		require.Equal(t, -skew, nd.offset)
		r.nodes = append(r.nodes, nd)
	}
	r.allowed = make([]uint64, len(r.nodes))
	r.owed = make([]int64, len(r.nodes))
	st.acked = make([]int64, len(r.nodes))
	r.deniedN = make([]uint64, len(r.nodes))
	// While a call is on its way: decisions, time passing (often across a
	// window's end), evictions.
	st.during = func() {
		for range r.rng.IntN(20) {
			r.decide(syncRate)
		}
		mock.Add(time.Duration(r.rng.IntN(300)) * time.Millisecond)
		if r.rng.IntN(4) == 0 {
			r.nodes[r.rng.IntN(len(r.nodes))].l.Evict()
		}
		for range r.rng.IntN(5) {
			r.decide(syncRate)
		}
	}
	// 40 virtual seconds (10 under the race detector): every counter is
	// still in the store at the end.
	d := 40 * time.Second
	if raceOn {
		d = 10 * time.Second
	}
	end := mock.Now().Add(d)
	step := 0
	for mock.Now().Before(end) {
		switch x := rng.Float64() * 100; {
		case x < 70:
			for range 1 + rng.IntN(5) {
				r.decide(syncRate)
			}
		case x < 85:
			_ = r.nodes[rng.IntN(len(r.nodes))].l.Sync(ctx)
		case x < 97:
			mock.Add(time.Duration(rng.IntN(8)) * time.Millisecond)
		case x < 97.3:
			// An idle spell: keys go idle and are evicted.
			mock.Add(time.Duration(2+rng.IntN(4)) * time.Second)
		default:
			r.nodes[rng.IntN(len(r.nodes))].l.Evict()
		}
		if step++; step%64 == 0 {
			r.checkPending() // Stats walks the table's shards: not every step
		}
	}
	// Once the store answers again and every node has synced twice, every
	// node sees what the store holds: the cluster's totals (a node whose
	// own increments were decided during a call's round trip, or whose
	// batches were in doubt, counts each once). A synchronous limiter on
	// the same store reads the reference. A Log rule is a log there, and
	// buckets here: not comparable. A Bucketed rule's node reads only the
	// previous bucket after skipping some (docs/design.md): the older
	// buckets of its window that others filled stay unknown to it. The
	// nodes' counts are compared by the plain rules, without the share
	// policy that caps State's Remaining.
	st.p, st.during = 0, nil
	longest := time.Duration(0)
	comparable := true
	for _, rule := range rules {
		longest = max(longest, rule.Window)
		comparable = comparable && rule.Type != Log && rule.Type != Bucketed
	}
	for range 2 {
		for _, nd := range r.nodes {
			require.NoError(t, nd.l.Sync(ctx))
		}
	}
	mock.Set(mock.Now().Truncate(longest).Add(longest + 10*time.Millisecond))
	for _, key := range r.keys {
		for i := range r.nodes {
			r.decideOn(i, key, 1, syncRate)
		}
	}
	for range 2 {
		for _, nd := range r.nodes {
			require.NoError(t, nd.l.Sync(ctx))
		}
	}
	if comparable {
		ref, err := New(Config{Rules: rules, Mode: ModeSynchronous, Store: st.mem, Clock: mock, Manual: true, ClockSync: -1})
		require.NoError(t, err)
		var want []RuleState
		for _, key := range r.keys {
			_, err := ref.Peek(ctx, key)
			require.NoError(t, err)
			want, err = ref.State(ctx, key, want[:0])
			require.NoError(t, err)
			for i, nd := range r.nodes {
				var v [MaxRules]local.Counts
				d := nd.l.def
				d.table.View(key, nd.l.clock.now(), 1, v[:len(d.rules)])
				for k := range want {
					got, _ := d.rules[k].Level(v[k])
					require.Equal(t, want[k].Remaining, got, "node %d, key %s, rule %d: remaining", i, key, k)
				}
			}
		}
		require.NoError(t, ref.Close(ctx))
	}
	// Close with the store misbehaving again, less often.
	st.p = 0.2
	dropped := int64(0)
	for i, nd := range r.nodes {
		require.NoError(t, nd.l.Close(ctx), "node %d", i)
		s := nd.l.Stats()
		require.Equal(t, int64(0), s.Pending, "node %d", i)
		require.Equal(t, 0, s.InDoubt, "node %d", i)
		dropped += int64(s.Dropped)
		require.Equal(t, r.allowed[i], s.Allowed, "node %d", i)
		require.Equal(t, r.deniedN[i], s.Denied, "node %d", i)
	}
	for id, n := range r.charged {
		if n == 0 {
			delete(r.charged, id)
		}
	}
	for id, n := range st.applied {
		if n == 0 {
			delete(st.applied, id)
		}
	}
	// The memory store agrees with the tally.
	for id, n := range st.applied {
		if id.rate == 0 {
			require.Equal(t, n, st.mem.Get(DefaultPrefix, store.Counter{Key: id.key, Window: id.window, ID: id.id, Span: id.span}), "%+v", id)
		}
	}
	if dropped == 0 {
		require.Equal(t, r.charged, st.applied, "calls: %v", st.calls)
	} else {
		// Dropped increments (Stats.Dropped: a counter rolled over twice
		// while older increments waited) are missing, nothing else.
		missing := int64(0)
		for id, n := range st.applied {
			require.LessOrEqual(t, n, r.charged[id], "%+v counted twice", id)
		}
		for id, n := range r.charged {
			missing += n - st.applied[id]
		}
		require.Equal(t, dropped, missing, "calls: %v", st.calls)
	}
	t.Logf("calls %v, admitted %v, denied %v, counters %d, dropped %d", st.calls, r.allowed, r.deniedN, len(r.charged), dropped)
}

// The same on a Redis server, with the background loops running and
// decisions from many goroutines on every node: after Close, the store
// holds exactly what the nodes admitted, each increment once.
func TestRedisAsyncConcurrentNodesConserve(t *testing.T) {
	st := storetest.Redis(t, redistest.Client(t))
	prefix := redistest.Prefix(t)
	rules := []Rule{{Limit: 300, Window: time.Hour, Type: Fixed}, {Limit: 50, Window: 100 * time.Millisecond}}
	var nodes []*Limiter
	for range 3 {
		l, err := New(Config{Rules: rules, Mode: ModeAsync, Store: st, Prefix: prefix, SyncRate: 10 * time.Millisecond, ClockSync: -1})
		require.NoError(t, err)
		nodes = append(nodes, l)
	}
	keys := []string{"a", "b", "c"}
	time.Sleep(200 * time.Millisecond) // the loops start
	var admitted [3]atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(1500 * time.Millisecond)
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := nodes[g%len(nodes)]
			for i := 0; time.Now().Before(deadline); i++ {
				k := (g + i) % len(keys)
				res, err := l.Allow(context.Background(), keys[k])
				if err != nil {
					t.Error(err)
					return
				}
				if res.Allowed {
					admitted[k].Add(1)
				}
				if i%16 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	for i, l := range nodes {
		s := l.Stats()
		t.Logf("node %d: allowed %d, denied %d, sync period %v, cycle %v, cycles %d, errors %d, last error %v", i, s.Allowed, s.Denied, s.SyncPeriod, s.SyncCycleTime, s.SyncCycles, s.SyncErrors, s.LastError)
	}
	for _, l := range nodes {
		require.NoError(t, l.Close(context.Background()))
	}
	rdb := redistest.Client(t)
	hour := time.Now().UnixMilli() / time.Hour.Milliseconds()
	for k, key := range keys {
		total := int64(0)
		for _, id := range []int64{hour - 1, hour} { // the run may straddle an hour
			n, err := rdb.Get(context.Background(), store.CounterKey(prefix, store.Counter{Key: key, Window: time.Hour.Milliseconds(), ID: id})).Int64()
			if err == nil {
				total += n
			}
		}
		assert.Equal(t, admitted[k].Load(), total, "key %s", key)
		assert.LessOrEqual(t, total, int64(3*300), "key %s: at most the limit per node", key)
		t.Logf("key %s: %d admitted", key, total)
	}
}
