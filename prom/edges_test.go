package prom_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/hybridlimit"
	"github.com/hybridlimit/hybridlimit/prom"
)

// decisions gathers reg and returns hybridlimit_decisions_total by its
// labels (as labels prints them).
func decisions(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "hybridlimit_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labels(m.GetLabel())] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestEdgeSeveralLimiters registers the collectors of three limiters in one
// pedantic registry (which checks that every collected metric was described
// and is consistent with its description): one with odd tiers, told apart
// by constant labels with quotes, a newline and non-ASCII text. It gathers
// them before their limiters are set, with traffic, and after one limiter
// is closed.
func TestEdgeSeveralLimiters(t *testing.T) {
	mc := clock.NewMock()
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	names := []string{`a"b`, "line\nbreak", "ünï"}
	var ls []*hybridlimit.Limiter
	var cs []*prom.Collector
	for _, name := range names {
		c := prom.NewCollector(prom.Options{ConstLabels: prometheus.Labels{"limiter": name}})
		require.NoError(t, reg.Register(c), name)
		cs = append(cs, c)
	}
	_, err := reg.Gather()
	require.NoError(t, err, "no limiter set yet")
	for i, c := range cs {
		l, err := hybridlimit.New(hybridlimit.Config{
			Rules: []hybridlimit.Rule{{Limit: 2, Window: time.Minute}},
			Tiers: map[string][]hybridlimit.Rule{`"q"`: {{Limit: 1, Window: time.Second}}, `x\y`: {{Limit: 3, Window: time.Hour}}},
			TierOf: func(key string) string {
				if key == "other" {
					return ""
				}
				return key
			},
			Clock: mc, Manual: true,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(ctx) })
		c.SetLimiter(l)
		ls = append(ls, l)
		for range i + 1 {
			for _, k := range []string{`"q"`, `x\y`, "other"} {
				_, err := l.Allow(ctx, k)
				require.NoError(t, err)
			}
		}
	}
	want := map[string]float64{
		`decision=allowed,limiter=a"b`: 3, `decision=denied,limiter=a"b`: 0,
		"decision=allowed,limiter=line\nbreak": 5, "decision=denied,limiter=line\nbreak": 1,
		"decision=allowed,limiter=ünï": 6, "decision=denied,limiter=ünï": 3,
	}
	assert.Equal(t, want, decisions(t, reg))

	require.NoError(t, ls[1].Close(ctx))
	_, err = ls[1].Allow(ctx, "other")
	assert.ErrorIs(t, err, hybridlimit.ErrClosed)
	assert.Equal(t, want, decisions(t, reg), "a closed limiter's statistics stay exported")
	for _, c := range cs {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		assert.Empty(t, problems)
	}
}

// TestEdgeInvalidOptions checks Options that Prometheus refuses. Buckets
// out of order and a constant label named "le" make NewCollector panic,
// like NewHistogramVec; other invalid constant labels make Register
// fail. Collect never panics: it sends metrics whose Write fails.
func TestEdgeInvalidOptions(t *testing.T) {
	l, _ := newAsync(t, prom.Options{})
	for _, labels := range []prometheus.Labels{
		{"limiter": "\xff"},
		{"decision": "x"},
		{"result": "x"},
		{"__reserved": "x"},
		{"": "x"},
	} {
		c := prom.NewCollector(prom.Options{ConstLabels: labels})
		c.SetLimiter(l)
		assert.Error(t, prometheus.NewPedanticRegistry().Register(c), "%q", labels)
		ch := make(chan prometheus.Metric, 64)
		assert.NotPanics(t, func() { c.Collect(ch) }, "%q", labels)
		close(ch)
		bad := 0
		for m := range ch {
			if m.Write(&dto.Metric{}) != nil {
				bad++
			}
		}
		if labels["result"] == "" { // the histogram's own series write fine
			assert.NotZero(t, bad, "%q: the invalid metrics fail", labels)
		}
	}
	assert.Panics(t, func() { prom.NewCollector(prom.Options{ConstLabels: prometheus.Labels{"le": "x"}}) })
	assert.Panics(t, func() { prom.NewCollector(prom.Options{Buckets: []float64{2, 1}}) })
}

// TestEdgeConcurrentCollect gathers while goroutines decide, sync, observe
// sync latencies, swap the limiter and close it (run with -race).
func TestEdgeConcurrentCollect(t *testing.T) {
	l, c := newAsync(t, prom.Options{})
	l2, _ := newAsync(t, prom.Options{})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				_, _ = l.Allow(ctx, fmt.Sprint(g, n%50))
				_, _ = l2.Allow(ctx, fmt.Sprint(g, n%50))
				if n%100 == 0 {
					_ = l.Sync(ctx)
					c.ObserveSync(time.Duration(n)*time.Microsecond, n, nil)
				}
			}
		})
	}
	for n := range 200 {
		_, err := reg.Gather()
		require.NoError(t, err)
		switch n {
		case 50:
			c.SetLimiter(l2)
		case 100:
			c.SetLimiter(l)
		case 150:
			require.NoError(t, l.Close(ctx))
		}
	}
	close(stop)
	wg.Wait()
	_, err := reg.Gather()
	require.NoError(t, err)
}

// TestEdgeSwapLimiter replaces a collector's limiter, as a server that
// rebuilds its limiter on a configuration change does: every counter
// carries on from where the previous limiter left it (never down, which
// Prometheus would read as a restart), and a limiter set again is not
// counted twice.
func TestEdgeSwapLimiter(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	a, c := newAsync(t, prom.Options{})
	require.NoError(t, reg.Register(c))
	b, _ := newAsync(t, prom.Options{})
	allow := func(l *hybridlimit.Limiter, n int) {
		for range n {
			_, err := l.Allow(ctx, "k")
			require.NoError(t, err)
		}
	}
	allow(a, 3) // 2 allowed, 1 denied
	allow(b, 1) // before b is set: exported with it, as its history
	assert.Equal(t, map[string]float64{"decision=allowed": 2, "decision=denied": 1}, decisions(t, reg))

	require.NoError(t, a.Close(ctx))
	c.SetLimiter(b)
	assert.Equal(t, map[string]float64{"decision=allowed": 3, "decision=denied": 1}, decisions(t, reg))
	allow(b, 2) // 1 allowed, 1 denied
	assert.Equal(t, map[string]float64{"decision=allowed": 4, "decision=denied": 2}, decisions(t, reg))
	c.SetLimiter(b) // the same limiter: nothing changes
	assert.Equal(t, map[string]float64{"decision=allowed": 4, "decision=denied": 2}, decisions(t, reg))

	// Back to a (closed, its Stats final): its decisions are not counted again.
	c.SetLimiter(a)
	assert.Equal(t, map[string]float64{"decision=allowed": 4, "decision=denied": 2}, decisions(t, reg))
	c.SetLimiter(b)
	allow(b, 1)
	assert.Equal(t, map[string]float64{"decision=allowed": 4, "decision=denied": 3}, decisions(t, reg))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
