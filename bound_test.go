package hybridlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit/store"
)

// The async mode's stated bound (Mode's doc, README, design.md "The bound,
// in terms of Stats"): across N nodes the cluster admits beyond the limit
// at most what the other nodes admit within two sync periods plus round
// trips (the memory store answers at once), while every node keeps
// deciding the key. A Fixed rule makes the count per window exact, so
// every window after the key's first can be held to it.

type admission struct {
	at   time.Time
	node int
	n    int64
}

// boundRun runs n nodes syncing every period at their own phases, sends
// requests every gap (to node 0 with probability hot, else round robin)
// for d, and returns the admissions.
func boundRun(t *testing.T, seed uint64, n int, policy AsyncPolicy, rule Rule, period, gap, d time.Duration, hot float64) []admission {
	rng := rand.New(rand.NewPCG(seed, 7))
	mock := &stepClock{Mock: clock.NewMock()}
	mock.Set(t0)
	mem := store.NewMemory(mock)
	var nodes []*Limiter
	var next []time.Time
	for i := range n {
		l, err := New(Config{
			Rules: []Rule{rule}, Mode: ModeAsync, Store: mem, SyncRate: period, AsyncPolicy: policy,
			Clock: mock, Manual: true, Seed: seed*100 + uint64(i), ClockSync: -1,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
		next = append(next, mock.Now().Add(time.Duration(rng.Int64N(int64(period)))+1))
	}
	ctx := context.Background()
	var out []admission
	rr := 0
	end := mock.Now().Add(d)
	for now := mock.Now(); now.Before(end); now = now.Add(gap) {
		mock.Set(now)
		for i, l := range nodes {
			for !next[i].After(now) {
				require.NoError(t, l.Sync(ctx))
				next[i] = next[i].Add(period)
			}
		}
		i := rr % n
		rr++
		if rng.Float64() < hot {
			i = 0
		}
		res, err := nodes[i].Allow(ctx, "k")
		require.NoError(t, err)
		if res.Allowed {
			out = append(out, admission{now, i, 1})
		}
	}
	return out
}

// othersWithin returns the most that nodes other than some node j admitted
// within any interval of length tau, among adms (sorted by time).
func othersWithin(adms []admission, nodes int, tau time.Duration) int64 {
	best := int64(0)
	for j := range nodes {
		var sum int64
		from := 0
		for to := range adms {
			if adms[to].node != j {
				sum += adms[to].n
			}
			for adms[to].at.Sub(adms[from].at) > tau {
				if adms[from].node != j {
					sum -= adms[from].n
				}
				from++
			}
			best = max(best, sum)
		}
	}
	return best
}

func TestAsyncOvershootWithinTheStatedBound(t *testing.T) {
	const period = 100 * time.Millisecond
	rule := Rule{Limit: 200, Window: time.Second, Type: Fixed}
	nodes := []int{2, 3, 10}
	if raceOn {
		nodes = []int{3} // the race detector makes every case ten times longer
	}
	for _, n := range nodes {
		for _, policy := range []AsyncPolicy{Naive, Share} {
			for _, load := range []float64{2, 5} {
				for _, hot := range []float64{0, 0.8} {
					for seed := uint64(1); seed <= 2; seed++ {
						name := fmt.Sprintf("nodes=%d/%v/load=%v/hot=%v/seed=%d", n, policy, load, hot, seed)
						t.Run(name, func(t *testing.T) {
							gap := time.Duration(float64(rule.Window) / (load * float64(rule.Limit)))
							adms := boundRun(t, seed, n, policy, rule, period, gap, 10*time.Second, hot)
							byWin := map[int64][]admission{}
							for _, a := range adms {
								w := a.at.UnixMilli() / rule.Window.Milliseconds()
								byWin[w] = append(byWin[w], a)
							}
							wins := make([]int64, 0, len(byWin))
							for w := range byWin {
								wins = append(wins, w)
							}
							sort.Slice(wins, func(a, b int) bool { return wins[a] < wins[b] })
							worst := 0.0
							for _, w := range wins[1:] { // the key's first window is the documented exception
								as := byWin[w]
								total := int64(0)
								for _, a := range as {
									total += a.n
								}
								bound := othersWithin(as, n, 2*period)
								over := total - rule.Limit
								if over > 0 {
									worst = max(worst, float64(over)/float64(bound))
								}
								require.LessOrEqual(t, over, bound, "window %d: admitted %d of %d; the others admit at most %d within %v", w, total, rule.Limit, bound, 2*period)
							}
							t.Logf("worst overshoot / bound: %.2f", worst)
						})
					}
				}
			}
		}
	}
}

// The same bound under random traffic: which nodes get requests changes
// every few tens of milliseconds, with pauses, so that admissions spread
// unevenly over the sync periods. Every node decides the key every 50ms,
// so that it reads it at every sync (TestAsyncNodeNewToAKeyDecidesAloneUntilItSyncs
// shows a node that does not). With one period instead of two, seed 41
// fails.
func TestAsyncOvershootWithinTheStatedBoundRandom(t *testing.T) {
	const period = 100 * time.Millisecond
	rule := Rule{Limit: 50, Window: time.Second, Type: Fixed}
	const keep, tau = 50 * time.Millisecond, 2 * period
	seeds := uint64(60)
	if raceOn {
		seeds = 10
	}
	worst := 0.0
	for seed := uint64(1); seed <= seeds; seed++ {
		rng := rand.New(rand.NewPCG(seed, 11))
		n := 2 + rng.IntN(4)
		policy := AsyncPolicy(rng.IntN(2))
		mock := &stepClock{Mock: clock.NewMock()}
		mock.Set(t0)
		mem := store.NewMemory(mock)
		var nodes []*Limiter
		var next []time.Time
		for i := range n {
			l, err := New(Config{
				Rules: []Rule{rule}, Mode: ModeAsync, Store: mem, SyncRate: period, AsyncPolicy: policy,
				Clock: mock, Manual: true, Seed: seed*100 + uint64(i), ClockSync: -1,
			})
			require.NoError(t, err)
			nodes = append(nodes, l)
			next = append(next, mock.Now().Add(time.Duration(rng.Int64N(int64(period)))+1))
		}
		ctx := context.Background()
		// Every node tracks the key and has synced it.
		for _, l := range nodes {
			_, err := l.Allow(ctx, "k")
			require.NoError(t, err)
		}
		for _, l := range nodes {
			require.NoError(t, l.Sync(ctx))
		}
		var adms []admission
		end := mock.Now().Add(4 * time.Second)
		weights := make([]float64, n)
		lastKeep := mock.Now()
		for now := mock.Now(); now.Before(end); {
			mock.Set(now)
			for i, l := range nodes {
				for !next[i].After(now) {
					require.NoError(t, l.Sync(ctx))
					next[i] = next[i].Add(period)
				}
			}
			if now.Sub(lastKeep) >= keep {
				// Every node decides the key now and then, so that each
				// keeps reading it every cycle.
				lastKeep = now
				for i, l := range nodes {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed {
						adms = append(adms, admission{now, i, 1})
					}
				}
			}
			if rng.IntN(30) == 0 {
				for i := range weights {
					weights[i] = rng.Float64() * float64(rng.IntN(2))
				}
			}
			x, i := rng.Float64()*n2sum(weights), 0
			for i < n-1 && x >= weights[i] {
				x -= weights[i]
				i++
			}
			res, err := nodes[i].Allow(ctx, "k")
			require.NoError(t, err)
			if res.Allowed {
				adms = append(adms, admission{now, i, 1})
			}
			now = now.Add(time.Duration(rng.IntN(4000)) * time.Microsecond)
		}
		for _, l := range nodes {
			_ = l.Close(ctx)
		}
		byWin := map[int64][]admission{}
		first := int64(-1)
		for _, a := range adms {
			w := a.at.UnixMilli() / rule.Window.Milliseconds()
			if first < 0 {
				first = w
			}
			byWin[w] = append(byWin[w], a)
		}
		for w, as := range byWin {
			if w == first {
				continue
			}
			over := int64(len(as)) - rule.Limit
			bound := othersWithin(as, n, tau)
			if over > 0 {
				worst = max(worst, float64(over)/float64(bound))
			}
			if over > bound {
				start := time.UnixMilli(w * 1000)
				for _, a := range as {
					t.Logf("%v node %d", a.at.Sub(start), a.node)
				}
				for i := range next {
					t.Logf("node %d syncs at %v mod 100ms", i, next[i].Sub(start)%period)
				}
			}
			require.LessOrEqual(t, over, bound, "seed %d, %d nodes, %v, window %d: admitted %d of %d; the others admit at most %d within %v", seed, n, policy, w, len(as), rule.Limit, bound, period)
		}
	}
	t.Logf("worst overshoot / bound: %.2f", worst)
}

func n2sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	if s == 0 {
		return 1
	}
	return s
}

// A node decides a key on what it last read of it. A node that has never
// decided the key, or not within the last three sync periods (it no longer
// reads it), sees nothing of the current window before its next sync: its
// first decisions on the key can admit up to the limit, whatever the other
// nodes admitted. docs/design.md states this exception to the bound.
func TestAsyncNodeNewToAKeyDecidesAloneUntilItSyncs(t *testing.T) {
	const period = 100 * time.Millisecond
	rule := Rule{Limit: 100, Window: time.Second, Type: Fixed}
	for _, policy := range []AsyncPolicy{Naive, Share} {
		for _, returning := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/returning=%v", policy, returning), func(t *testing.T) {
				mock := &stepClock{Mock: clock.NewMock()}
				mock.Set(t0)
				mem := store.NewMemory(mock)
				var nodes []*Limiter
				for i := range 3 {
					l, err := New(Config{
						Rules: []Rule{rule}, Mode: ModeAsync, Store: mem, SyncRate: period, AsyncPolicy: policy,
						Clock: mock, Manual: true, Seed: uint64(i + 1), ClockSync: -1,
					})
					require.NoError(t, err)
					t.Cleanup(func() { _ = l.Close(context.Background()) })
					nodes = append(nodes, l)
				}
				ctx := context.Background()
				if returning {
					// Node 2 knew the key two windows ago.
					mock.Set(t0.Add(-2 * time.Second))
					_, err := nodes[2].Allow(ctx, "k")
					require.NoError(t, err)
					require.NoError(t, nodes[2].Sync(ctx))
					mock.Set(t0)
				}
				// Nodes 0 and 1 run the key at twice its limit, syncing every
				// period at phases 0 and 50ms, for 700ms: the window is full.
				admitted := 0
				gap := rule.Window / time.Duration(2*rule.Limit)
				for at := time.Duration(0); at < 700*time.Millisecond; at += gap {
					mock.Set(t0.Add(at))
					if at%period == 0 {
						require.NoError(t, nodes[0].Sync(ctx))
					}
					if at%period == period/2 {
						require.NoError(t, nodes[1].Sync(ctx))
					}
					res, err := nodes[int(at/gap)%2].Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed {
						admitted++
					}
				}
				require.GreaterOrEqual(t, admitted, 100, "nodes 0 and 1 hold the key at its limit")
				// Node 2 gets a burst: until its next sync it sees none of
				// what the others admitted in this window.
				n2 := 0
				for range 150 {
					res, err := nodes[2].Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed {
						n2++
					}
				}
				require.Equal(t, 100, n2, "a node new to the key admits up to the limit before its first sync")
				require.NoError(t, nodes[2].Sync(ctx))
				res, err := nodes[2].Allow(ctx, "k")
				require.NoError(t, err)
				require.False(t, res.Allowed, "after its sync it sees the cluster's %d", admitted+n2)
			})
		}
	}
}

// A node's view lags another node's admissions by up to two sync periods:
// an admission made just after that node's push waits a period for its
// next push, and up to one more for this node's next sync. Two nodes, a
// Fixed 100/1s rule, syncs every 100ms (A at 0 mod 100ms, B at 50): B admits
// 30 at 351ms and 30 at 460ms, 109ms apart; A, which last synced at 400ms,
// has seen neither at 499ms and spends the whole rest of the limit. The
// window ends 60 over: what B admitted within two periods, twice what it
// admitted within any one.
func TestAsyncBlindSpanIsTwoSyncPeriods(t *testing.T) {
	for _, policy := range []AsyncPolicy{Naive, Share} {
		t.Run(policy.String(), func(t *testing.T) {
			mock := &stepClock{Mock: clock.NewMock()}
			mock.Set(t0)
			mem := store.NewMemory(mock)
			var nodes []*Limiter
			for i := range 2 {
				l, err := New(Config{
					Rules: []Rule{{Limit: 100, Window: time.Second, Type: Fixed}}, Mode: ModeAsync, Store: mem,
					SyncRate: 100 * time.Millisecond, AsyncPolicy: policy, Clock: mock, Manual: true, Seed: uint64(i + 1), ClockSync: -1,
				})
				require.NoError(t, err)
				t.Cleanup(func() { _ = l.Close(context.Background()) })
				nodes = append(nodes, l)
			}
			a, b := nodes[0], nodes[1]
			ctx := context.Background()
			admitted := 0
			allow := func(l *Limiter, n int) int {
				got := 0
				for range n {
					res, err := l.Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed {
						got++
					}
				}
				admitted += got
				return got
			}
			at := func(ms int) { mock.Set(t0.Add(time.Duration(ms) * time.Millisecond)) }
			// Both nodes decide the key every period, so that both read it
			// at every sync.
			for ms := 0; ms <= 300; ms += 100 {
				at(ms)
				allow(a, 1)
				require.NoError(t, a.Sync(ctx))
				at(ms + 50)
				allow(b, 1)
				require.NoError(t, b.Sync(ctx))
			}
			at(351)
			require.Equal(t, 30, allow(b, 30))
			at(400)
			allow(a, 1)
			require.NoError(t, a.Sync(ctx)) // B's 30 are not in the store yet
			at(450)
			require.NoError(t, b.Sync(ctx))
			at(460)
			require.Equal(t, 30, allow(b, 30))
			at(499)
			allow(a, 100) // A sees the store as of 400ms: none of B's 60
			at(500)
			require.NoError(t, a.Sync(ctx))
			at(550)
			require.NoError(t, b.Sync(ctx))
			require.Equal(t, int64(admitted), mem.Get(DefaultPrefix, store.Counter{Key: "k", Window: 1000, ID: t0.Unix()}))
			assert.Equal(t, 160, admitted, "100 and what B admitted within two periods")
		})
	}
}

// A node that decides a key for the first time, or for the first time
// since an earlier window than the previous one, reads the store's total
// of the previous window at its first sync: a sliding rule weighs what the
// other nodes admitted there. Node A admits the limit in one window; node
// B, new to the key or last seen on it two windows before, decides it 10ms
// into the next window: after its first sync it sees A's 100 weighing 99.
func TestAsyncNodeReadsThePreviousWindowOfAKeyNewToIt(t *testing.T) {
	for _, policy := range []AsyncPolicy{Naive, Share} {
		for _, returning := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/returning=%v", policy, returning), func(t *testing.T) {
				mock := &stepClock{Mock: clock.NewMock()}
				mock.Set(t0)
				mem := store.NewMemory(mock)
				var nodes []*Limiter
				for i := range 2 {
					l, err := New(Config{
						Rules: []Rule{{Limit: 100, Window: time.Second}}, Mode: ModeAsync, Store: mem,
						SyncRate: 100 * time.Millisecond, AsyncPolicy: policy, Clock: mock, Manual: true, Seed: uint64(i + 1), ClockSync: -1,
					})
					require.NoError(t, err)
					t.Cleanup(func() { _ = l.Close(context.Background()) })
					nodes = append(nodes, l)
				}
				a, b := nodes[0], nodes[1]
				ctx := context.Background()
				if returning {
					res, err := b.Allow(ctx, "k")
					require.NoError(t, err)
					require.True(t, res.Allowed)
					require.NoError(t, b.Sync(ctx))
				}
				mock.Set(t0.Add(1500 * time.Millisecond))
				for range 100 {
					res, err := a.Allow(ctx, "k")
					require.NoError(t, err)
					require.True(t, res.Allowed)
				}
				require.NoError(t, a.Sync(ctx))
				mock.Set(t0.Add(2010 * time.Millisecond))
				res, err := b.Allow(ctx, "k") // B has not read the key yet
				require.NoError(t, err)
				require.True(t, res.Allowed)
				require.NoError(t, b.Sync(ctx))
				res, err = b.Allow(ctx, "k")
				require.NoError(t, err)
				assert.False(t, res.Allowed, "B sees A's 100 of the previous window, weighing 99")
				st, err := b.State(ctx, "k", nil)
				require.NoError(t, err)
				assert.Equal(t, int64(0), st[0].Remaining)
			})
		}
	}
}
