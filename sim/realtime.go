package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/store"
)

// runRealtime runs every configuration against Redis on the real clock,
// one after the other, with the limiters' own background loops
// (Config.Manual false). The traffic is the same seeded sequence, paced to
// the wall clock by one dispatcher goroutine; each node serves its requests
// on rtWorkers goroutines, so a synchronous decision's round trip does not
// hold up the others. The reference decides each request at its dispatch
// instant; the nodes record their admissions at the instant they decide.
// Runs are not reproducible: Redis latency and scheduling vary.
func runRealtime(o *options, rdb *redis.Client, stderr io.Writer) ([]*report, error) {
	var out []*report
	for i, m := range o.Modes {
		pfx := o.Prefix
		if pfx == "" {
			pfx = fmt.Sprintf("simrt_%d", time.Now().UnixNano())
		}
		st, err := store.NewRedis(rdb, store.RedisOptions{})
		if err != nil {
			return nil, err
		}
		r, err := realtimeConfig(o, m, st, fmt.Sprintf("%s_%d", pfx, i))
		if err != nil {
			return nil, fmt.Errorf("%v: %w", m, err)
		}
		if !o.Quiet {
			fmt.Fprintf(stderr, "sim: %v done (%d decisions)\n", m, r.Requests)
		}
		out = append(out, r)
	}
	return out, nil
}

func realtimeConfig(o *options, m modeSpec, st store.Store, pfx string) (*report, error) {
	ctx := context.Background()
	g, err := newSource(o)
	if err != nil {
		return nil, err
	}
	defer g.close()
	counting := &simStore{inner: st}
	nodes := make([]*hybridlimit.Limiter, o.Nodes)
	for i := range nodes {
		cfg := hybridlimit.Config{Rules: o.Rules, Mode: m.Mode, SyncRate: m.SyncRate, AsyncPolicy: m.Policy, Prefix: pfx}
		if m.Mode != hybridlimit.ModeLocal {
			cfg.Store = &realStore{counting}
		}
		if o.FailClosed {
			cfg.FailurePolicy = hybridlimit.FailClosed
		}
		l, err := hybridlimit.New(cfg)
		if err != nil {
			return nil, err
		}
		nodes[i] = l
	}
	r := newReport(o, m)
	ref := newReference(o)
	names := runKeys(o)
	sp := newSpreader(o, names)
	start := time.Now()
	t0 := start.UnixNano()

	type result struct {
		logs          [][]int64
		admitted      int64
		denied        int64
		falseDenied   int64
		seriesAllowed []int64
		err           error
	}
	queues := make([]chan rtReq, o.Nodes)
	results := make([]result, o.Nodes*rtWorkers)
	var wg sync.WaitGroup
	for w := range results {
		i := w / rtWorkers
		if w%rtWorkers == 0 {
			queues[i] = make(chan rtReq, 4096)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[w]
			res.logs = make([][]int64, o.Keys)
			res.seriesAllowed = make([]int64, len(r.series))
			for q := range queues[i] {
				if res.err != nil {
					continue
				}
				d, err := nodes[i].Allow(ctx, names[q.key])
				if err != nil {
					res.err = err
					continue
				}
				at := time.Now().UnixNano() - t0
				if d.Allowed {
					res.admitted++
					res.logs[q.key] = append(res.logs[q.key], at)
					res.seriesAllowed[min(int(at/int64(o.Bucket)), len(r.series)-1)]++
				} else {
					res.denied++
					if q.ideal {
						res.falseDenied++
					}
				}
			}
		}()
	}
	refLogs := make([][]int64, o.Keys)
	for {
		q, ok := g.next()
		if !ok {
			break
		}
		if d := time.Until(start.Add(time.Duration(q.at))); d > time.Millisecond {
			time.Sleep(d)
		}
		now := time.Now().UnixNano()
		ideal := ref.allow(q.key, now)
		r.Requests++
		if ideal {
			r.Ideal++
			refLogs[q.key] = append(refLogs[q.key], now-t0)
			r.idealSeries[min(int(q.at/int64(o.Bucket)), len(r.series)-1)]++
		}
		queues[sp.pick(q, o.Nodes)] <- rtReq{key: q.key, ideal: ideal}
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	if err := g.err(); err != nil {
		for _, l := range nodes {
			_ = l.Close(ctx)
		}
		return nil, err
	}
	logs := make([][]int64, o.Keys)
	perNode := make([]result, o.Nodes)
	for w, res := range results {
		if res.err != nil {
			return nil, fmt.Errorf("node %d: %w", w/rtWorkers, res.err)
		}
		perNode[w/rtWorkers].admitted += res.admitted
		perNode[w/rtWorkers].denied += res.denied
		r.Admitted += res.admitted
		r.FalseDenied += res.falseDenied
		for b, v := range res.seriesAllowed {
			r.series[b] += v
		}
		for k, ts := range res.logs {
			logs[k] = append(logs[k], ts...)
		}
	}
	for i, res := range perNode {
		s := nodes[i].Stats()
		r.KeysPushed += s.KeysPushed
		r.Degraded += s.Degraded
		if o.PerNode {
			r.PerNode = append(r.PerNode, nodeReport{Node: i, Admitted: res.admitted, Denied: res.denied, StoreCalls: s.StoreCalls, KeysPushed: s.KeysPushed, Degraded: s.Degraded, ClockOffsetMs: durMs(s.ClockOffset)})
		}
	}
	for _, ts := range logs {
		slices.Sort(ts)
	}
	r.PeakWindowRatio = peakRatio(logs, o)
	r.IdealPeakRatio = peakRatio(refLogs, o)
	for _, l := range nodes {
		_ = l.Close(ctx)
	}
	r.StoreCalls = counting.calls.Load()
	r.finish()
	return r, nil
}

// rtWorkers is the goroutines serving each node: concurrent requests, as a
// server has, so synchronous decisions share round trips.
const rtWorkers = 16

type rtReq struct {
	key   int
	ideal bool
}

// stickyNode is the node of rank k with probability ∝ 1/(k+1).
func stickyNode(draw float64, n int) int {
	total := 0.0
	for k := range n {
		total += 1 / float64(k+1)
	}
	x := draw * total
	for k := range n {
		x -= 1 / float64(k+1)
		if x < 0 {
			return k
		}
	}
	return n - 1
}

// realStore counts the round trips of the real store.
type realStore struct{ s *simStore }

func (s *realStore) Group(key string) int { return s.s.inner.Group(key) }

func (s *realStore) Push(ctx context.Context, batches []*store.Batch) error {
	s.s.calls.Add(1)
	return s.s.inner.Push(ctx, batches)
}

func (s *realStore) Take(ctx context.Context, reqs []*store.TakeRequest) error {
	s.s.calls.Add(1)
	return s.s.inner.Take(ctx, reqs)
}

func (s *realStore) Time(ctx context.Context) (time.Time, error) {
	s.s.calls.Add(1)
	return s.s.inner.Time(ctx)
}
