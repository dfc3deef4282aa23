package hybridlimit_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// BenchmarkMemoryPerKey reports the live heap a limiter holds per tracked
// key (B/key): a million keys, each decided once, then (ModeAsync, with
// each AsyncPolicy) two sync cycles, so that every key also holds what the
// sync loop and the policy keep;
// live heap after a GC, minus the same before the limiter existed. The key
// strings are built before and not counted (the limiter keeps the caller's
// string). The store answers every push at once and keeps nothing, so
// that only the limiter's memory is counted.
//
//	go test -run '^$' -bench MemoryPerKey -benchtime 1x .
func BenchmarkMemoryPerKey(b *testing.B) {
	const nkeys = 1_000_000
	keys := benchKeys(nkeys)
	type config struct {
		name   string
		mode   hybridlimit.Mode
		policy hybridlimit.AsyncPolicy
	}
	for _, c := range []config{
		{"local", hybridlimit.ModeLocal, 0},
		{"async/policy=share", hybridlimit.ModeAsync, hybridlimit.Share},
		{"async/policy=naive", hybridlimit.ModeAsync, hybridlimit.Naive},
	} {
		for _, nrules := range []int{1, 4} {
			b.Run(fmt.Sprintf("mode=%s/keys=%d/rules=%d", c.name, nkeys, nrules), func(b *testing.B) {
				cfg := hybridlimit.Config{Rules: benchRules[nrules], Mode: c.mode, AsyncPolicy: c.policy, MaxKeys: 2 * nkeys, Manual: true}
				if c.mode == hybridlimit.ModeAsync {
					cfg.Store = echoStore{}
				}
				var perKey float64
				for b.Loop() {
					perKey = memoryPerKey(b, cfg, keys)
				}
				b.ReportMetric(perKey, "B/key")
			})
		}
	}
}

func memoryPerKey(b *testing.B, cfg hybridlimit.Config, keys []string) float64 {
	ctx := context.Background()
	before := liveHeap()
	l, err := hybridlimit.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range keys {
		if _, err := l.Allow(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
	if cfg.Mode == hybridlimit.ModeAsync {
		for range 2 {
			if err := l.Sync(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	after := liveHeap()
	if got := l.Stats().Keys; got != len(keys) {
		b.Fatalf("%d keys tracked, want %d", got, len(keys))
	}
	_ = l.Close(ctx)
	return float64(after-before) / float64(len(keys))
}

// liveHeap returns the bytes of live heap objects after a full GC.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// echoStore applies every push at once, as if this node were the only one,
// and keeps nothing; its keys fall in groups groups by hash slot (one
// when groups is below 2).
type echoStore struct{ groups int }

func (s echoStore) Group(key string) int {
	if s.groups < 2 {
		return 0
	}
	return store.Slot(key) % s.groups
}

func (echoStore) Push(_ context.Context, batches []*store.Batch) error {
	for _, bt := range batches {
		if len(bt.Totals) != len(bt.Ops) {
			bt.Totals = make([]int64, len(bt.Ops))
		}
		for i, op := range bt.Ops {
			bt.Totals[i] = op.Delta
		}
		bt.Status = store.Applied
	}
	return nil
}

func (echoStore) Take(_ context.Context, reqs []*store.TakeRequest) error {
	for _, r := range reqs {
		r.Status, r.Err = store.Failed, fmt.Errorf("echoStore: no Take")
	}
	return nil
}

func (echoStore) Time(context.Context) (time.Time, error) { return time.Now(), nil }
