package hybridlimit_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/internal/redistest"
	"github.com/hybridlimit/hybridlimit/store"
)

// Helpers of the fault tests (faults_*_test.go): real redis-server
// processes are killed, stopped or failed over while several Limiters in
// this process decide; the tests then compare what callers were told with
// the store's counters.

// Timeouts of the fault tests: short, so that a dead or hung server costs
// little time.
const (
	faultIO      = 300 * time.Millisecond // go-redis dial, read and write timeouts
	faultTimeout = 400 * time.Millisecond // Config.StoreTimeout
)

// faultConfig is the limiter of a failover test on st: ModeAsync nodes
// sync every 20 ms under asyncPrefix and never reach their limit;
// ModeSynchronous nodes decide under syncPrefix, syncLimit per hour.
func faultConfig(mode hybridlimit.Mode, st store.Store, asyncPrefix, syncPrefix string, syncLimit int64) hybridlimit.Config {
	if mode == hybridlimit.ModeAsync {
		return hybridlimit.Config{Mode: mode, Store: st, StoreTimeout: faultTimeout, Prefix: asyncPrefix, SyncRate: 20 * time.Millisecond,
			Rules: []hybridlimit.Rule{{Limit: 1 << 40, Window: time.Hour}}}
	}
	return hybridlimit.Config{Mode: mode, Store: st, StoreTimeout: faultTimeout, Prefix: syncPrefix,
		Rules: []hybridlimit.Rule{{Limit: syncLimit, Window: time.Hour}}}
}

// faultClient returns a client of addr with short timeouts and no retries,
// closed when the test ends.
func faultClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 32,
		DialTimeout: faultIO, ReadTimeout: faultIO, WriteTimeout: faultIO})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// watched wraps a Store and reports every Push and Take to the test, with
// the call's start and end, after the inner store set the results. With
// calls set, each Take's context carries a number of its own, under which
// calls records the pipelines the Take sends (callLog), and onTakeCall
// gets that number in place of onTake.
type watched struct {
	store.Store
	onPush     func(start, end time.Time, batches []*store.Batch)
	onTake     func(start, end time.Time, reqs []*store.TakeRequest)
	calls      *callLog
	onTakeCall func(call int64, start, end time.Time, reqs []*store.TakeRequest)
}

func (w *watched) Push(ctx context.Context, batches []*store.Batch) error {
	start := time.Now()
	err := w.Store.Push(ctx, batches)
	if w.onPush != nil {
		w.onPush(start, time.Now(), batches)
	}
	return err
}

func (w *watched) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	var call int64
	if w.calls != nil {
		ctx, call = w.calls.begin(ctx)
	}
	start := time.Now()
	err := w.Store.Take(ctx, reqs)
	switch {
	case w.onTakeCall != nil:
		w.onTakeCall(call, start, time.Now(), reqs)
	case w.onTake != nil:
		w.onTake(start, time.Now(), reqs)
	}
	return err
}

// Route implements store.Router when the inner store does, so that a
// watched Redis Cluster store batches its synchronous decisions per
// master as the bare one does.
func (w *watched) Route(prefix, key string) int {
	if r, ok := w.Store.(store.Router); ok {
		return r.Route(prefix, key)
	}
	return 0
}

// newRedisStore returns a store.Redis on c with the default options.
func newRedisStore(t *testing.T, c redis.UniversalClient) *store.Redis {
	t.Helper()
	s, err := store.NewRedis(c, store.RedisOptions{})
	require.NoError(t, err)
	return s
}

// tally counts, per key, what callers were told.
type tally struct {
	keys []string
	m    map[string]*atomic.Int64
}

func newTally(keys []string) *tally {
	t := &tally{keys: keys, m: make(map[string]*atomic.Int64, len(keys))}
	for _, k := range keys {
		t.m[k] = new(atomic.Int64)
	}
	return t
}

func (t *tally) add(key string)       { t.m[key].Add(1) }
func (t *tally) get(key string) int64 { return t.m[key].Load() }
func (t *tally) sum(keys []string) (n int64) {
	for _, k := range keys {
		n += t.get(k)
	}
	return n
}

// hourIDs returns the ids of the 1-hour windows from start to end: one,
// or two when the run crossed an hour.
func hourIDs(start, end time.Time) []int64 {
	w := time.Hour.Milliseconds()
	ids := []int64{start.UnixMilli() / w}
	if e := end.UnixMilli() / w; e != ids[0] {
		ids = append(ids, e)
	}
	return ids
}

// stored returns the sum of key's 1-hour counters of windows ids under
// prefix, read through c.
func stored(t *testing.T, c redis.Cmdable, prefix, key string, ids []int64) int64 {
	t.Helper()
	n, err := tryStored(c, prefix, key, ids)
	require.NoError(t, err)
	return n
}

// tryStored is stored, returning the first read's error.
func tryStored(c redis.Cmdable, prefix, key string, ids []int64) (int64, error) {
	var n int64
	for _, id := range ids {
		k := store.CounterKey(prefix, store.Counter{Key: key, Window: time.Hour.Milliseconds(), ID: id})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		v, err := c.Get(ctx, k).Int64()
		cancel()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("GET %s: %w", k, err)
		}
		n += v
	}
	return n, nil
}

// limitBound is the most a sliding rule of limit per hour admits for one
// key between start and end: the limit, plus, when the run crossed an
// hour, the part of the previous window's count that the sliding estimate
// no longer weighs.
func limitBound(limit int64, start, end time.Time) int64 {
	if start.Truncate(time.Hour).Equal(end.Truncate(time.Hour)) {
		return limit
	}
	into := end.Sub(end.Truncate(time.Hour))
	return limit + int64(float64(limit)*into.Seconds()/3600) + 1
}

// keysOnShard returns n user keys, starting with prefix, whose counters
// live on shard, on distinct slots where the shard has them. The store
// hashes the base64 of the whole user key (store.Slot), so a key is placed
// by trying candidates; ClusterShard.Key places raw Redis keys, not user
// keys.
func keysOnShard(shard redistest.ClusterShard, prefix string, n int) []string {
	var keys []string
	seen := map[int]bool{}
	for i := 0; len(keys) < n; i++ {
		k := prefix + strconv.Itoa(i)
		slot := store.Slot(k)
		if seen[slot] && i < 100_000 {
			continue
		}
		for _, r := range shard.Slots {
			if slot >= r.Start && slot <= r.End {
				keys = append(keys, k)
				seen[slot] = true
				break
			}
		}
	}
	return keys
}

// onShard reports whether slot is served by shard.
func onShard(shard redistest.ClusterShard, slot int) bool {
	return slices.ContainsFunc(shard.Slots, func(r redistest.SlotRange) bool { return slot >= r.Start && slot <= r.End })
}

// logBuffer collects a Limiter's log records.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// closeAll closes every limiter with a deadline and fails the test on an
// error.
func closeAll(t *testing.T, nodes []*hybridlimit.Limiter, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for i, l := range nodes {
		if err := l.Close(ctx); err != nil {
			t.Errorf("node %d: Close: %v", i, err)
		}
	}
}

// traffic runs f in n goroutines until stop is closed; f returns false to
// end its goroutine early.
func traffic(wg *sync.WaitGroup, n int, stop <-chan struct{}, f func(g, i int) bool) {
	for g := range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if !f(g, i) {
					return
				}
			}
		})
	}
}

// ackTally counts, per key, the increments of the pushes the store applied
// and answered before cut (Unix ns; none is set while cut is 0): what a
// server killed at cut had acknowledged, and so lost.
type ackTally struct {
	cut atomic.Int64
	mu  sync.Mutex
	n   map[string]int64
}

// watch makes w record its applied pushes in a.
func (a *ackTally) watch(w *watched) {
	w.onPush = func(_, end time.Time, bs []*store.Batch) {
		if c := a.cut.Load(); c != 0 && end.UnixNano() >= c {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.n == nil {
			a.n = map[string]int64{}
		}
		for _, b := range bs {
			if b.Status == store.Applied {
				for _, op := range b.Ops {
					a.n[op.Key] += op.Delta
				}
			}
		}
	}
}

func (a *ackTally) get(key string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[key]
}

// asyncNodes returns n limiters on the server at addr, each on a store of
// its own client, configured by cfg, whose applied pushes acked records
// (when not nil); they are closed at the end of the test.
func asyncNodes(t *testing.T, n int, addr string, acked *ackTally, cfg func(store.Store) hybridlimit.Config) []*hybridlimit.Limiter {
	var nodes []*hybridlimit.Limiter
	for range n {
		w := &watched{Store: newRedisStore(t, faultClient(t, addr))}
		if acked != nil {
			acked.watch(w)
		}
		l, err := hybridlimit.New(cfg(w))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		nodes = append(nodes, l)
	}
	return nodes
}

// decideAll runs per goroutines on each node deciding keys in turn until
// stop closes, with a millisecond's pause every 16 decisions; it counts
// the admitted ones in admitted, the errors in errs (a goroutine stops at
// its first), and keeps the slowest decision's nanoseconds in worst (when
// not nil).
func decideAll(wg *sync.WaitGroup, nodes []*hybridlimit.Limiter, per int, keys []string, stop <-chan struct{}, admitted *tally, errs, worst *atomic.Int64) {
	for _, l := range nodes {
		traffic(wg, per, stop, func(g, i int) bool {
			k := keys[(g+i)%len(keys)]
			t0 := time.Now()
			res, err := l.Allow(context.Background(), k)
			if worst != nil {
				d := time.Since(t0).Nanoseconds()
				for w := worst.Load(); d > w && !worst.CompareAndSwap(w, d); w = worst.Load() {
				}
			}
			if err != nil {
				errs.Add(1)
				return false
			}
			if res.Allowed {
				admitted.add(k)
			}
			if i%16 == 0 {
				time.Sleep(time.Millisecond)
			}
			return true
		})
	}
}

// warmUp decides every key on the ModeSynchronous limiter l until the
// store decides it (not Degraded), so that every master has served a call
// and the store knows every key's route; it counts the admitted decisions
// in admitted (when not nil). A first call (a dial, the script loaded,
// under -race on a loaded machine) can miss its request's deadline, or
// get no answer in time and open the master's circuit, which is not what
// the fault tests are about: a key is tried again every 50 ms, past the
// circuit's backoff, for up to 10 s.
func warmUp(t *testing.T, l *hybridlimit.Limiter, keys []string, admitted *tally) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, k := range keys {
		for {
			res, err := l.Allow(context.Background(), k)
			require.NoError(t, err)
			if res.Allowed && admitted != nil {
				admitted.add(k)
			}
			if !res.Degraded {
				break
			}
			require.True(t, time.Now().Before(deadline), "warm-up on %q: every decision Degraded for 10 s", k)
			time.Sleep(50 * time.Millisecond)
		}
	}
}
