package hybridlimit_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/puzpuzpuz/xsync/v3"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/internal/storetest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Decision benchmarks. Run with -cpu 1,2 for one and two goroutines: each
// goroutine of RunParallel works on its own share of the keys.
//
//	go test -run '^$' -bench . -benchmem -cpu 1,2 .

var benchRules = map[int][]hybridlimit.Rule{
	1: {{Limit: 1 << 40, Window: time.Minute}},
	4: {
		{Limit: 1 << 40, Window: time.Second},
		{Limit: 1 << 40, Window: time.Minute},
		{Limit: 1 << 40, Window: time.Hour},
		{Limit: 1 << 40, Window: 24 * time.Hour, Type: hybridlimit.Fixed},
	},
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("client-%d", i)
	}
	return keys
}

func BenchmarkAllow(b *testing.B) {
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync} {
		for _, nkeys := range []int{1, 10_000, 1_000_000} {
			for _, nrules := range []int{1, 4} {
				name := fmt.Sprintf("mode=%v/keys=%d/rules=%d", mode, nkeys, nrules)
				// One limiter per configuration, filled once and shared by
				// every round of b.N (filling a million keys takes seconds).
				var l *hybridlimit.Limiter
				var keys []string
				b.Run(name, func(b *testing.B) {
					if l == nil {
						cfg := hybridlimit.Config{Rules: benchRules[nrules], Mode: mode, MaxKeys: 2 * nkeys}
						if mode == hybridlimit.ModeAsync {
							// The sync loop's own cost is BenchmarkSyncCycle's:
							// here only decisions run.
							cfg.Store, cfg.Manual = store.NewMemory(nil), true
						}
						var err error
						if l, err = hybridlimit.New(cfg); err != nil {
							b.Fatal(err)
						}
						keys = benchKeys(nkeys)
						for _, k := range keys { // warm: every key tracked
							if _, err := l.Allow(context.Background(), k); err != nil {
								b.Fatal(err)
							}
						}
					}
					benchAllow(b, l, keys)
				})
				if l != nil {
					_ = l.Close(context.Background())
				}
			}
		}
	}
}

// algorithmRules is one rule of each algorithm that admits every request
// of a benchmark (the Log rule, 1024 per logWindow: 8 KiB per key).
func algorithmRules(logWindow time.Duration) map[string]hybridlimit.Rule {
	return map[string]hybridlimit.Rule{
		"sliding":  {Limit: 1 << 40, Window: time.Minute},
		"fixed":    {Limit: 1 << 40, Window: time.Minute, Type: hybridlimit.Fixed},
		"bucketed": {Limit: 1 << 40, Window: time.Minute, Type: hybridlimit.Bucketed, Buckets: 60},
		"log":      {Limit: 1024, Window: logWindow, Type: hybridlimit.Log},
		"token":    {Limit: 1 << 30, Window: time.Hour, Type: hybridlimit.TokenBucket},
		"leaky":    {Limit: 1 << 30, Window: time.Hour, Type: hybridlimit.LeakyBucket},
	}
}

// algorithmNames is algorithmRules' keys in a fixed order.
var algorithmNames = []string{"sliding", "fixed", "bucketed", "log", "token", "leaky"}

// stepClock is the real clock, except that every Now is one microsecond
// after the one before: a benchmark's decisions spread over time at a
// known pace, with the same cost for every algorithm.
type stepClock struct {
	clock.Clock
	at atomic.Int64
}

func (c *stepClock) Now() time.Time { return time.Unix(0, c.at.Add(int64(time.Microsecond))) }

// BenchmarkAlgorithm times the local decision of one rule of each
// algorithm, on one key and on 10,000, with the same cost model as
// BenchmarkAllow (no I/O, no allocation). Time comes from stepClock.
//
//	go test -run '^$' -bench Algorithm -benchmem -count 6 . | benchstat -col /algo -
func BenchmarkAlgorithm(b *testing.B) {
	for _, nkeys := range []int{1, 10_000} {
		// One key: 1000 decisions per ms. 10,000 keys: each seen every
		// 10 ms, which a window of 1 s keeps from eviction.
		rules := algorithmRules(time.Millisecond)
		if nkeys > 1 {
			rules = algorithmRules(time.Second)
		}
		for _, algo := range algorithmNames {
			b.Run(fmt.Sprintf("keys=%d/algo=%s", nkeys, algo), func(b *testing.B) {
				clk := &stepClock{Clock: clock.New()}
				clk.at.Store(time.Now().UnixNano())
				l, err := hybridlimit.New(hybridlimit.Config{Rules: []hybridlimit.Rule{rules[algo]}, MaxKeys: 2 * nkeys, Clock: clk})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close(context.Background())
				keys := benchKeys(nkeys)
				for _, k := range keys {
					if _, err := l.Allow(context.Background(), k); err != nil {
						b.Fatal(err)
					}
				}
				benchAllow(b, l, keys)
			})
		}
	}
}

// Every algorithm decides without allocating, once the key is tracked.
func TestAlgorithmsDoNotAllocate(t *testing.T) {
	rules := algorithmRules(time.Second)
	for _, algo := range algorithmNames {
		for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync} {
			cfg := hybridlimit.Config{Rules: []hybridlimit.Rule{rules[algo]}, Mode: mode}
			if mode == hybridlimit.ModeAsync {
				cfg.Store, cfg.Manual = store.NewMemory(nil), true
			}
			l, err := hybridlimit.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if _, err := l.Allow(ctx, "k"); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				if res, err := l.Allow(ctx, "k"); err != nil || !res.Allowed {
					t.Fatal(algo, mode, err, res)
				}
			})
			if allocs != 0 {
				t.Errorf("%s in %v: %v allocations per decision", algo, mode, allocs)
			}
			_ = l.Close(ctx)
		}
	}
}

func benchAllow(b *testing.B, l *hybridlimit.Limiter, keys []string) {
	ctx := context.Background()
	n := len(keys)
	var gid atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// Goroutine g takes keys g, g+2, g+4... (distinct keys unless
		// there is only one).
		i := int(gid.Add(1)-1) % n
		for pb.Next() {
			res, err := l.Allow(ctx, keys[i])
			if err != nil || !res.Allowed {
				b.Fatal(err, res)
			}
			if i += 2; i >= n {
				i = (i - n) % n
			}
		}
	})
}

// BenchmarkSyncCycle times one sync cycle of 100k touched keys (push and
// pull) against the test redis-server.
func BenchmarkSyncCycle(b *testing.B) {
	c := redistest.Client(b)
	runSyncCycles(b, storetest.Redis(b, c), redistest.Prefix(b))
	b.ReportMetric(float64(syncKeys)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkSyncLoopOnly times the cycle of BenchmarkSyncCycle against a
// store that does no I/O (echoStore, in groups as the Redis store's
// default lanes): what the sync loop itself costs per key, walking the
// tables, grouping the keys, taking and settling their increments, apart
// from the Redis store's client work and the server's.
func BenchmarkSyncLoopOnly(b *testing.B) {
	runSyncCycles(b, echoStore{groups: 4}, "")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(syncKeys*b.N), "ns/key")
}

// syncKeys is the number of keys each cycle of runSyncCycles handles.
const syncKeys = 100_000

// runSyncCycles times, per op, one Sync of a ModeAsync limiter on st whose
// syncKeys keys were all touched since the last one (the touching is not
// timed).
func runSyncCycles(b *testing.B, st store.Store, prefix string) {
	l, err := hybridlimit.New(hybridlimit.Config{
		Rules:        benchRules[1],
		Mode:         hybridlimit.ModeAsync,
		Store:        st,
		Prefix:       prefix,
		Manual:       true,
		StoreTimeout: 10 * time.Second,
	})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(context.Background())
	keys := benchKeys(syncKeys)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		for _, k := range keys {
			if _, err := l.Allow(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		if err := l.Sync(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecision is one warm decision on one key from one goroutine,
// in the same loop as BenchmarkFloor (b.Loop), so that the two compare:
// the cost of a decision over the floor of a map load and an atomic add.
// scripts/instructions.sh counts its instructions under callgrind.
func BenchmarkDecision(b *testing.B) {
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync} {
		for _, nrules := range []int{1, 4} {
			b.Run(fmt.Sprintf("mode=%v/rules=%d", mode, nrules), func(b *testing.B) {
				cfg := hybridlimit.Config{Rules: benchRules[nrules], Mode: mode}
				if mode == hybridlimit.ModeAsync {
					cfg.Store, cfg.Manual = store.NewMemory(nil), true
				}
				l, err := hybridlimit.New(cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close(context.Background())
				ctx := context.Background()
				if _, err := l.Allow(ctx, "client-0"); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				for b.Loop() {
					if res, err := l.Allow(ctx, "client-0"); err != nil || !res.Allowed {
						b.Fatal(err, res)
					}
				}
			})
		}
	}
}

// BenchmarkFloor is the floor the guide measured: an xsync map load and one
// atomic add, no limiter logic. Compare BenchmarkAllow with it in one run.
func BenchmarkFloor(b *testing.B) {
	m := xsync.NewMapOf[string, *atomic.Int64]()
	m.Store("client-0", new(atomic.Int64))
	b.ReportAllocs()
	for b.Loop() {
		v, _ := m.Load("client-0")
		v.Add(1)
	}
}

// BenchmarkKeyFlood feeds 2M new keys, from several goroutines, to a fresh
// limiter per round, and reports the latency of those decisions: p50,
// p99.9 and max (each decision timed with time.Now, some 50 ns of the
// figure), the decisions slower than 1 ms per round, and the keys per
// second. With maxkeys=default the table fills at 1M keys and the rest are
// decided untracked; with 4M every key is tracked. In async mode a memory
// store takes the sync loop's pushes. keys=tracked is the control: the
// same decisions on keys created before the timing starts, so that what
// the goroutines' scheduling alone costs (with more goroutines than
// GOMAXPROCS, a goroutine preempted between its two clock reads waits
// for a processor) shows beside what creating keys costs.
//
//	go test -run '^$' -bench KeyFlood -benchtime 1x .
func BenchmarkKeyFlood(b *testing.B) {
	const nkeys = 2_000_000
	keys := benchKeys(nkeys)
	for _, mode := range []hybridlimit.Mode{hybridlimit.ModeLocal, hybridlimit.ModeAsync} {
		for _, maxKeys := range []int{hybridlimit.DefaultMaxKeys, 4 << 20} {
			for _, goroutines := range []int{runtime.GOMAXPROCS(0), 8} {
				for _, fresh := range []bool{true, false} {
					kind := "new"
					if !fresh {
						kind = "tracked"
					}
					name := fmt.Sprintf("mode=%v;keys=%d-%s;goroutines=%d;maxkeys=%d", mode, nkeys, kind, goroutines, maxKeys)
					b.Run(name, func(b *testing.B) {
						benchKeyFlood(b, keys, goroutines, fresh, func() (func(context.Context, string) error, func()) {
							cfg := hybridlimit.Config{Rules: benchRules[1], Mode: mode, MaxKeys: maxKeys}
							if mode == hybridlimit.ModeAsync {
								cfg.Store = store.NewMemory(nil)
							}
							l, err := hybridlimit.New(cfg)
							if err != nil {
								b.Fatal(err)
							}
							decide := func(ctx context.Context, key string) error {
								_, err := l.Allow(ctx, key)
								return err
							}
							return decide, func() { _ = l.Close(context.Background()) }
						})
					})
				}
			}
		}
	}
	// The floor: a bare xsync map, sized for every key up front (it never
	// grows), that allocates a 64-byte value per new key and adds to it,
	// no limiter; every key tracked. What the runtime (its garbage
	// collector above all) costs any table that allocates per key.
	for _, goroutines := range []int{runtime.GOMAXPROCS(0), 8} {
		for _, fresh := range []bool{true, false} {
			kind := "new"
			if !fresh {
				kind = "tracked"
			}
			name := fmt.Sprintf("mode=floor;keys=%d-%s;goroutines=%d", nkeys, kind, goroutines)
			b.Run(name, func(b *testing.B) {
				benchKeyFlood(b, keys, goroutines, fresh, func() (func(context.Context, string) error, func()) {
					m := xsync.NewMapOf[string, *floodValue](xsync.WithPresize(nkeys))
					return func(_ context.Context, key string) error {
						v, _ := m.LoadOrCompute(key, func() *floodValue { return new(floodValue) })
						v.n.Add(1)
						return nil
					}, func() {}
				})
			})
		}
	}
}

// BenchmarkFreshPages times the first write to each 4 KB page of memory
// the process has not used before: the page fault the kernel serves when
// a growing heap is first touched, which a flood of new keys pays inside
// some decisions (a new entry, a shard's new slot array). It reports the
// p50, p99, p99.9 and max of one write per page over 256 MB, a machine's
// figure, not the limiter's.
//
//	go test -run '^$' -bench FreshPages -benchtime 1x .
func BenchmarkFreshPages(b *testing.B) {
	const size, page = 256 << 20, 4096
	var all []int64
	for b.Loop() {
		b.StopTimer()
		mem := make([]byte, size) // large: straight from the OS, not yet touched
		d := make([]int64, 0, size/page)
		b.StartTimer()
		for i := 0; i < size; i += page {
			t0 := time.Now()
			mem[i] = 1
			d = append(d, int64(time.Since(t0)))
		}
		all = append(all, d...)
	}
	slices.Sort(all)
	at := func(q float64) float64 { return float64(all[min(int(q*float64(len(all))), len(all)-1)]) }
	b.ReportMetric(at(0.5), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
	b.ReportMetric(at(0.999), "p999-ns")
	b.ReportMetric(float64(all[len(all)-1]), "max-ns")
}

// floodValue is the floor's value per key: as large as a one-rule entry.
type floodValue struct {
	n atomic.Int64
	_ [56]byte
}

func benchKeyFlood(b *testing.B, keys []string, goroutines int, fresh bool, setup func() (decide func(context.Context, string) error, done func())) {
	nkeys := len(keys)
	lat := make([][]int64, goroutines)
	for g := range lat {
		lat[g] = make([]int64, 0, nkeys/goroutines+1)
	}
	var all []int64
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		decide, done := setup()
		if !fresh {
			for _, k := range keys {
				if err := decide(context.Background(), k); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC()
		}
		b.StartTimer()
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				ctx := context.Background()
				for i := g; i < nkeys; i += goroutines {
					t0 := time.Now()
					err := decide(ctx, keys[i])
					lat[g] = append(lat[g], int64(time.Since(t0)))
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		done()
		for g := range lat {
			all = append(all, lat[g]...)
			lat[g] = lat[g][:0]
		}
		b.StartTimer()
	}
	slices.Sort(all)
	at := func(q float64) float64 { return float64(all[min(int(q*float64(len(all))), len(all)-1)]) }
	b.ReportMetric(at(0.5), "p50-ns")
	b.ReportMetric(at(0.999), "p999-ns")
	b.ReportMetric(float64(all[len(all)-1]), "max-ns")
	slow, _ := slices.BinarySearch(all, int64(time.Millisecond))
	b.ReportMetric(float64(len(all)-slow)/float64(b.N), "over-1ms/op")
	b.ReportMetric(float64(nkeys)*float64(b.N)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkPolicies times a local decision on one key beside overrides and
// blocks: none; 1,000 overrides of other keys; the key overridden to
// another tier.
//
//	go test -run '^$' -bench Policies -benchmem -cpu 1 -count 6 . | benchstat -col /policies -
func BenchmarkPolicies(b *testing.B) {
	ctx := context.Background()
	for _, setup := range []string{"none", "others", "key"} {
		var l *hybridlimit.Limiter
		keys := benchKeys(1)
		b.Run("policies="+setup, func(b *testing.B) {
			if l == nil {
				// Set up once for every round of b.N, only for the cases
				// that run, on stepClock and without background
				// goroutines, so that instruction counts under callgrind
				// are exact.
				clk := &stepClock{Clock: clock.New()}
				clk.at.Store(time.Now().UnixNano())
				var err error
				l, err = hybridlimit.New(hybridlimit.Config{Rules: benchRules[1], Clock: clk, Manual: true,
					Tiers: map[string][]hybridlimit.Rule{"paid": benchRules[1]}})
				if err != nil {
					b.Fatal(err)
				}
				switch setup {
				case "others":
					for i := range 1000 {
						if err := l.SetOverride(ctx, fmt.Sprint("other-", i), "paid", 0); err != nil {
							b.Fatal(err)
						}
					}
				case "key":
					if err := l.SetOverride(ctx, "client-0", "paid", 0); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
			}
			benchAllow(b, l, keys)
		})
		if l != nil {
			_ = l.Close(ctx)
		}
	}
}
